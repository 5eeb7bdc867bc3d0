"""The peers' side of a CKA benchmark workload: timm's networks and the layers read
from each, the images as torch's loader, and torch's forward time over it."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from benchmarks import peaks
from benchmarks import workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _timm():
  """timm, importable beside the CPU build of torch: the tests' helper declares the
  torchvision ops it needs. Imported by the name the tests give it, so that a
  process holding both declares torch's library once."""
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  from support import torchvision_cpu
  torchvision_cpu.declare_detection_ops()
  import timm
  return timm


def timm_models(s: workload.Setup):
  """The two timm networks (eval mode) and the layers read from each."""
  timm = _timm()
  import torch
  if s.workload == "resnet18":
    import safetensors.torch
    nets = []
    for i in range(2):
      net = timm.create_model("resnet18", num_classes=workload.R18_CLASSES)
      net.load_state_dict(safetensors.torch.load_file(workload.r18_file(s, i)))
      nets.append(net.eval())
    return nets[0], nets[1], list(workload.R18_LAYERS), list(workload.R18_LAYERS)
  torch.manual_seed(0)
  vit = timm.create_model("vit_base_patch16_224", act_layer="gelu_tanh").eval()
  r50 = timm.create_model("resnetv2_50x1_bit").eval()
  vit_layers = []
  for i in range(12):
    vit_layers += [f"blocks.{i}.norm1", f"blocks.{i}.attn", f"blocks.{i}.norm2",
                   f"blocks.{i}.mlp.act", f"blocks.{i}.mlp", f"blocks.{i}"]
  r50_layers = ["stem.conv", "stem.pool"]
  for st, n in enumerate((3, 4, 6, 3)):
    for b in range(n):
      p = f"stages.{st}.blocks.{b}"
      r50_layers += [f"{p}.norm1", f"{p}.conv1", f"{p}.norm2", f"{p}.conv2", f"{p}.norm3",
                     f"{p}.conv3", p]
  r50_layers += ["norm"]
  return vit, r50, vit_layers, r50_layers


def part_weights(s: workload.Setup) -> dict:
  """The ResNet-18 workload's two timm networks at random init, saved as state
  dicts: the peers load them into timm, ours through its timm reader."""
  timm = _timm()
  import safetensors.torch
  import torch
  for i in range(2):
    torch.manual_seed(i)
    # torchvision's init, as the peers' benchmark: timm's default zeroes each block's last BN
    # scale, which makes our points (a conv after its BatchNorm) constant.
    net = timm.create_model("resnet18", num_classes=workload.R18_CLASSES, zero_init_last=False)
    safetensors.torch.save_file({k: v.contiguous() for k, v in net.state_dict().items()},
                                workload.r18_file(s, i))
  return dict(peak_gib=peaks.process_gib())


def torch_setup(s: workload.Setup):
  """timm's networks, their layers, the images as one unshuffled loader of
  (image, label) minibatches, and torch's forward time of both over it."""
  m1, m2, l1, l2 = timm_models(s)
  import torch
  from torch.utils.data import DataLoader, TensorDataset
  torch.set_num_threads(os.cpu_count())
  mean, std = (np.asarray(v, np.float32)[:, None, None] * 255 for v in s.stats)
  x = torch.from_numpy((workload.images(s).transpose(0, 3, 1, 2).astype(np.float32) - mean) / std)
  loader = DataLoader(TensorDataset(x, torch.zeros(len(x), dtype=torch.long)), batch_size=s.batch)
  m1, m2 = m1.to(s.device), m2.to(s.device)
  with torch.no_grad():
    for _ in range(s.device != "cpu"):  # cuDNN's first calls choose their kernels
      m1(next(iter(loader))[0].to(s.device))
      m2(next(iter(loader))[0].to(s.device))
    sync(s)
    t = time.perf_counter()
    for xb, _ in loader:  # as the peers do: each minibatch moved to the device in the loop
      xb = xb.to(s.device)
      m1(xb)
      m2(xb)
    sync(s)
    forward_s = time.perf_counter() - t
  return m1, m2, l1, l2, loader, forward_s


def sync(s: workload.Setup) -> None:
  """Wait for torch's device (its calls return before the work is done)."""
  if s.device != "cpu":
    import torch
    torch.cuda.synchronize()

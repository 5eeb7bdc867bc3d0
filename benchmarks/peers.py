"""The four PyTorch CKA packages run beside ours: what each computes, the call that
runs it on timm's networks, and its part (timed from its construction to its CKA
matrix)."""

from __future__ import annotations

import time

import numpy as np

from benchmarks import peaks
from benchmarks import references
from benchmarks import torch_side
from benchmarks import workload

# tool -> its PyPI distribution, its module (imported before the clock starts, as ours is) and
# the estimator its source computes (the error column checks it).
PEERS = {"torch-cka": ("torch-cka", "torch_cka", "unbiased"), "pytorch-cka": ("pytorch-cka", "cka", "unbiased"),
         "ckatorch": ("ckatorch", "ckatorch", "unbiased"),
         "cka-pytorch": ("cka-pytorch", "cka_pytorch.cka", "unbiased")}
HOW = {  # what each peer computes and the call that runs it, for the notes under the table
    "torch-cka": "HSIC_1 per minibatch, one (K, L) pair at a time, averaged over minibatches; CKA from "
                 "the means. CKA(m1, m2, model1_layers=, model2_layers=, device='{device}').compare(loader)",
    "pytorch-cka": "HSIC_1 of all layer pairs at once (einsum over stacked Grams), summed over "
                   "minibatches; CKA clipped to [0, 1]. compute_cka(m1, m2, loader, layers=, "
                   "model2_layers=, device='{device}')",
    "ckatorch": "HSIC_1 in float64 summed over minibatches (its README's minibatch CKA), from its public "
                "linear_kernel and hsic1 in our loop. Its CKA class is another estimator: it reads a hooked "
                "output as (minibatches, examples, features), so a ViT's (images, tokens, channels) gives "
                "CKA over tokens within each image, and it keeps only each epoch's last dataloader batch",
    "cka-pytorch": "HSIC_1 of stacked Grams (made in its hooks), 256 pairs a call, summed over minibatches; "
                   "CKA = sum / sqrt(product + 1e-4). CKACalculator(m1, m2, model1_layers=, model2_layers=, "
                   "batched_feature_size=256, device={device}).calculate_cka_matrix(loader, num_epochs=1): "
                   "its default of 10 epochs repeats the same images, the same CKA at 10x the time",
}
# tool -> what its source does to the minibatch CKA, as a float64 function of the HSIC sums: its
# distance from this is its arithmetic's (float32), its distance from the plain one its design's too.
FORMULAS = {"torch-cka": ("as is", references.plain),
            "pytorch-cka": ("clipped to [0, 1]", lambda h, lx: np.clip(references.plain(h, lx), 0, 1)),
            "ckatorch": ("as is", references.plain), "cka-pytorch": ("1e-4 added under the root", references.with_eps)}


def _run_torch_cka(m1, m2, l1, l2, loader, device):
  import torch
  from torch_cka import CKA
  with torch.no_grad():
    cka = CKA(m1, m2, model1_name="m1", model2_name="m2", model1_layers=l1, model2_layers=l2, device=device)
    cka.compare(loader)
  # its rows and columns: the order the hooks fired in, kept by its feature dicts
  return cka.hsic_matrix.cpu().numpy(), list(cka.model1_features), list(cka.model2_features)


def _run_pytorch_cka(m1, m2, l1, l2, loader, device):
  from cka import compute_cka
  (cka,) = compute_cka(m1, m2, loader, layers=l1, model2_layers=l2, device=device)
  return cka.cpu().numpy(), l1, l2


def _run_cka_pytorch(m1, m2, l1, l2, loader, device):
  import torch
  from cka_pytorch.cka import CKACalculator
  calc = CKACalculator(model1=m1, model2=m2, model1_layers=l1, model2_layers=l2,
                       batched_feature_size=256, device=torch.device(device))
  cka = calc.calculate_cka_matrix(loader, num_epochs=1)
  return cka.cpu().numpy(), calc.hook_manager1.module_names, calc.hook_manager2.module_names


def _hooked(nets_layers, feats: dict) -> None:
  """Forward hooks keeping each named layer's output in `feats[(net index, name)]`."""
  for k, (net, layers) in enumerate(nets_layers):
    for name, mod in net.named_modules():
      if name in layers:
        mod.register_forward_hook(lambda mod, inp, out, key=(k, name): feats.__setitem__(key, out))


def _run_ckatorch(m1, m2, l1, l2, loader, device):
  """ckatorch's HSIC_1 (`hsic1`, float64 as its `cka_batch`) of every pair, summed
  over minibatches as its README's minibatch CKA: its CKA class reads a hooked
  output as (minibatches, examples, features), which an image network's is not."""
  import torch
  from ckatorch import hsic1, linear_kernel
  feats: dict = {}
  _hooked([(m1, l1), (m2, l2)], feats)
  hxy = torch.zeros(len(l1), len(l2), dtype=torch.float64, device=device)
  hxx = torch.zeros(len(l1), dtype=torch.float64, device=device)
  hyy = torch.zeros(len(l2), dtype=torch.float64, device=device)
  with torch.no_grad():
    for xb, _ in loader:
      xb = xb.to(device)
      m1(xb)
      m2(xb)
      gx = torch.stack([linear_kernel(feats[0, n].flatten(1).double()) for n in l1])
      gy = torch.stack([linear_kernel(feats[1, n].flatten(1).double()) for n in l2])
      hxx += hsic1(gx, gx)
      hyy += hsic1(gy, gy)
      for i in range(len(l1)):
        hxy[i] += hsic1(gx[i].expand_as(gy), gy)
  return (hxy / torch.sqrt(torch.outer(hxx, hyy))).cpu().numpy(), l1, l2


def _ckatorch_class(m1, m2, l1, l2, loader, device) -> str:
  """What ckatorch's own CKA class does with this workload's first minibatch, as
  its examples call it (after the timed run: its hooks stay on the networks)."""
  import torch
  from ckatorch import CKA
  from torch.utils.data import DataLoader, TensorDataset
  first = DataLoader(TensorDataset(next(iter(loader))[0]), batch_size=loader.batch_size)
  try:
    cka = CKA(m1, m2, layers=l1, second_layers=l2, first_name="m1", second_name="m2", device=device)
    got = cka(first, epochs=1)
  except Exception as e:  # its message is the finding
    return f"its CKA class fails on this workload: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
  return f"its CKA class ran (the other estimator), mean CKA {float(torch.mean(got)):.3f}"


RUNS = {"torch-cka": _run_torch_cka, "pytorch-cka": _run_pytorch_cka, "ckatorch": _run_ckatorch,
        "cka-pytorch": _run_cka_pytorch}


def part_peer(s: workload.Setup, tool: str) -> dict:
  """One peer over the loader, timed from its construction to its CKA matrix."""
  import importlib
  from importlib import metadata
  m1, m2, l1, l2, loader, forward_s = torch_side.torch_setup(s)
  importlib.import_module(PEERS[tool][1])
  t = time.perf_counter()
  cka, rows, cols = RUNS[tool](m1, m2, l1, l2, loader, s.device)
  torch_side.sync(s)
  total_s = time.perf_counter() - t
  second_s = None
  if s.second:
    t = time.perf_counter()  # a notebook's second call (the tool set up again)
    RUNS[tool](m1, m2, l1, l2, loader, s.device)
    torch_side.sync(s)
    second_s = time.perf_counter() - t
  note = _ckatorch_class(m1, m2, l1, l2, loader, s.device) if tool == "ckatorch" else ""
  extra = (len(rows) - len(l1)) + (len(cols) - len(l2))
  if extra:  # cka-pytorch also hooks every module whose own name (not its path) is asked for
    note = f"hooked {extra} more layers than asked (a name's last part matches), dropped here"
  cka = np.asarray(cka, np.float64)[np.ix_([rows.index(n) for n in l1], [cols.index(n) for n in l2])]
  np.save(s.path(f"peer_{tool}.npy"), cka)
  return dict(total_s=total_s, second_s=second_s, forward_s=forward_s, peak_gib=peaks.process_gib(),
              device_peak_gib=peaks.device_peak_gib(s.device, torch_side=True), note=note,
              version=metadata.version(PEERS[tool][0]), layers_x=len(l1), layers_y=len(l2))

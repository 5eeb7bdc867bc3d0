r"""Cross-model minibatch CKA: ours beside four PyTorch CKA packages, measured in one run.

  .venv/bin/pip install -r benchmarks/requirements.txt
  .venv/bin/python benchmarks/cka_benchmark.py [--workload W|resnet18] [--images N --batch B]
      [--peers torch-cka,pytorch-cka,ckatorch,cka-pytorch] [--json PATH]

Workload W (the default): ViT-B/16 x BiT-R50x1 at random init, 256 images of
224x224 in minibatches of 32; 72 ViT points (per block: LN1, attention output,
LN2, MLP hidden, MLP output, block output) x every ResNet-v2 unit sublayer. Ours
runs our two networks at our random init, the peers timm's at timm's init (the
same images and layers); each is checked against a float64 CKA of its own
activations.

`--workload resnet18`: the shape of the peers' own benchmark (pytorch-cka's
notebooks): two ResNet-18 at random init (timm's `resnet18`, seeds 0 and 1, 10
classes), the 18 layers those notebooks read (conv1, each block's conv1 and
conv2, fc), 10,000 images of 32x32 (`--size`) in minibatches of 1,000. Both
sides run the same weights: ours loads the two timm state dicts. The peers'
notebooks use torchvision's CIFAR variant (3x3 stride-1 stem, no max-pool),
which our ResNet v1 does not build; with the ImageNet stem, `--size 128` gives
the 16 block convs the widths that variant has at 32 px.

Each part runs in its own process, so peak memory (ru_maxrss) is its own. Ours
runs twice, both with JAX's persistent compilation cache in a fresh folder: the
first run compiles and fills it (what a user pays the first time), the second
reads it back. Per tool it prints the end-to-end time (ours: compile included),
the time beyond the forward passes (a peer: minus torch's forward of the same
networks over the same images, timed in its process; ours: minus our forward),
peak memory, max |CKA - float64| and each tool's ratios to ours (`--json PATH`
writes the rows). Every tool computes the unbiased (HSIC_1) minibatch CKA, read
from its source; the error columns say how far each is from it in float64, from
the same with the tool's own change to it (pytorch-cka clips to [0, 1],
cka-pytorch adds 1e-4 under the root: what is left is its float32 arithmetic)
and from the biased (HSIC_0) one, which tells the two estimators apart. A peer
that is not installed or fails is a row that says why.

`--device cuda` runs the peers on torch's CUDA device (ours runs wherever JAX
does: its GPU) and reports each side's peak device memory; `--second` also
times a second call in the same process (a notebook's usual case: ours reuses
its compiled step); `--no_reference` skips the float64 references, which take
minutes at W's scale on CPU. Ours also reports its compile by JAX's phases
(tracing, lowering to MLIR, XLA's backend compile).

`--compare REV` instead times our part for git revision REV (a temporary
worktree, running its own copy of this script; or a folder holding a
revision's files) and for this checkout, alternating `--rounds` times in one
run, each with no compilation cache, and prints both (end to end, compile,
steps) and their ratios.
`--overhead` times the step (forward included) with linear CKA alone and with
every measure and the null (at most 1.3x the time at W's minibatch of 32, 3x at
`--batch 256` or 1,024; 1.1x the peak), alternating `--rounds` times in one
run. Both run workload W.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import accelerator  # noqa: E402  (the matmul rate, measured one way for every benchmark)

HALF = ((0.5,) * 3, (0.5,) * 3)
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# name -> default images, batch, size and the input normalisation (mean, std on [0, 1]):
# our models' preprocessing policies ("resize": half; ResNet v1: imagenet), checked in part_ours.
WORKLOADS = {"W": dict(images=256, batch=32, size=224, stats=HALF),
             "resnet18": dict(images=10_000, batch=1_000, size=32, stats=IMAGENET)}
R18_LAYERS = (["conv1"] + [f"layer{s}.{b}.conv{c}" for s in (1, 2, 3, 4) for b in (0, 1) for c in (1, 2)]
              + ["fc"])
R18_CAPTURE = ("root/conv", "block*/unit*/conv1", "block*/unit*/conv2", "logits")  # the same 18 points
R18_CLASSES = 10  # the peers' benchmark: CIFAR-10
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


@dataclasses.dataclass(frozen=True)
class Setup:
  """What every part of one run shares."""
  workload: str = "W"
  images: int = 256
  batch: int = 32
  size: int = 224
  work: str = os.path.join(tempfile.gettempdir(), "cka_bench")  # weights, CKA matrices, references
  cache: str = ""  # JAX's persistent compilation cache folder ("": none)
  device: str = "cpu"  # torch's device for the peers ("cuda": ours runs on JAX's GPU too)
  reference: bool = True  # the float64 references (False: no error columns)
  second: bool = False  # also time a second call in the same process (a notebook's usual case)

  @property
  def stats(self) -> tuple:
    return WORKLOADS[self.workload]["stats"]

  def path(self, name: str) -> str:
    return os.path.join(self.work, name)


def _peak_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _device_peak_gib(s: Setup, torch_side: bool = False) -> float | None:
  """The accelerator's peak memory in this process (None on CPU): torch's or JAX's."""
  if s.device == "cpu":
    return None
  if torch_side:
    import torch
    return torch.cuda.max_memory_allocated() / 2**30
  import jax
  stats = jax.devices()[0].memory_stats() or {}
  return stats["peak_bytes_in_use"] / 2**30 if "peak_bytes_in_use" in stats else None


def _images(s: Setup) -> np.ndarray:
  return np.random.default_rng(0).integers(0, 256, (s.images, s.size, s.size, 3), dtype=np.uint8)


def _centred(x: np.ndarray, biased: bool = False) -> np.ndarray:
  """One layer's minibatch Gram in float64, centred and scaled so that the dot
  product of two of them is that minibatch's HSIC: unbiased (HSIC_1, as the paper
  and every peer) or biased (HSIC_0, H K H), to tell the two apart."""
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  n = len(x)
  k = x @ x.T
  if biased:
    k = k - k.mean(0)[None, :]
    k = k - k.mean(1)[:, None]
    return k.ravel() / (n - 1)
  np.fill_diagonal(k, 0)
  means = k.sum(0) / (n - 2)
  means -= means.sum() / (2 * (n - 1))
  k = k - means[:, None] - means[None, :]
  np.fill_diagonal(k, 0)
  return k.ravel() / np.sqrt(n * (n - 3))


def _cka_of(hsic: np.ndarray) -> np.ndarray:
  d = np.sqrt(np.diag(hsic))
  return hsic / np.outer(d, d)


def _enable_cache(folder: str) -> None:
  """JAX's persistent compilation cache in `folder`, every program written to it
  (the defaults skip programs compiled in under a second)."""
  import jax
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def _r18_file(s: Setup, i: int) -> str:
  return s.path(f"resnet18_{i}.safetensors")


def _jax_models(s: Setup):
  import logging

  from vitcnn_jax import checkpoints
  from vitcnn_jax.run import loading
  from vitcnn_jax.models import BiT, ViT, param_trees
  from vitcnn_jax.models.vit import model as vit
  logging.getLogger("vitcnn_jax").setLevel(logging.ERROR)  # assumed settings of the timm files
  out = []
  if s.workload == "resnet18":
    for i in range(2):
      c = checkpoints.load(_r18_file(s, i), resolution=s.size)
      out.append(loading.loaded(f"r18_{i}", c.path, f"ResNet-18 seed {i}", c.model, c.params, R18_CAPTURE))
    return out
  for name, model in (("vit", ViT(num_classes=1000, **vit.decode_variant("B/16"))),
                      ("resnet", BiT(num_classes=1000, width=1, depth=50))):
    params = param_trees.random_params(model, np.zeros((1, 224, 224, 3), np.float32), seed=len(out))
    out.append(loading.loaded(name, "<random init>", name, model, params, "paper"))
  return out


def _step_inputs(s: Setup, models):
  """The compiled-on-first-call step, replicated params and the global minibatches."""
  import ml_collections
  from vitcnn_jax.run import driver
  from vitcnn_jax.run import parallel
  from vitcnn_jax.inputs import preprocess
  from vitcnn_jax.analyses import cka as cka_job
  for m in models:  # the peers' inputs are normalised with the workload's stats
    assert np.allclose(preprocess.stats(m.policy), s.stats), (m.policy, s.stats)
  mesh = parallel.mesh()
  by_key = {m.name: m for m in models}
  job = ml_collections.ConfigDict(dict(repeats=1, num_examples=s.images, batch_size=s.batch))
  step = driver.compile_pass(cka_job.CKA(job, by_key), by_key, mesh)
  params = [parallel.replicate(mesh, m.params) for m in models]
  images = _images(s)
  mask = np.ones((s.batch,), np.float32)
  batches = [(parallel.global_batch(mesh, images[i:i + s.batch]), parallel.global_batch(mesh, mask))
             for i in range(0, s.images, s.batch)]
  return step, params, batches


def part_ours(s: Setup) -> dict:
  """Our sharded CKA step over all minibatches, timed as a user runs it (the first
  call compiles, or reads the compilation cache), then once more warm; plus
  forward-only time and FLOP counts."""
  if s.cache:
    _enable_cache(s.cache)
  import jax
  from vitcnn_jax.similarity import hsic
  from vitcnn_jax.inputs import preprocess
  from vitcnn_jax.models import representations

  phases: dict[str, float] = {}  # JAX's compile events: tracing, lowering, XLA (backend_compile)

  def listen(event: str, seconds: float, **_) -> None:
    if event.startswith("/jax/core/compile/"):
      key = event.rsplit("/", 1)[1].removesuffix("_duration")
      phases[key] = phases.get(key, 0.0) + seconds

  models = _jax_models(s)
  step, params, batches = _step_inputs(s, models)
  names = [n for m in models for n in m.names]

  rates = [accelerator.matmul_rate(2048)]
  jax.monitoring.register_event_duration_secs_listener(listen)  # interleaved with the work: before, between, after
  t = time.perf_counter()  # the run a user makes: compile (as the driver does), every minibatch, the CKA
  step = step.compiled(params, None, [batches[0][0]] * 2, batches[0][1], batches[0][1], None)
  run = lambda x, m: hsic.unscale(jax.device_get(step(params, None, [x, x], m, m, None)))["hsic"]  # noqa: E731
  sums = run(*batches[0])
  first_s = time.perf_counter() - t
  compile_phases = dict(phases)
  sums = sums + sum(run(x, m) for x, m in batches[1:])
  ours_cka = hsic.cka_from_hsic(sums, names)
  total_s = time.perf_counter() - t
  t = time.perf_counter()
  run(*batches[0])  # the first minibatch again, warm: the rest of first_s was compiling
  compile_s = first_s - (time.perf_counter() - t)
  second_s = second_diff = None
  if s.second:
    t = time.perf_counter()  # a notebook's second call: the step built again, every minibatch
    step, params, batches = _step_inputs(s, models)
    step = step.compiled(params, None, [batches[0][0]] * 2, batches[0][1], batches[0][1], None)
    again = sum(run(x, m) for x, m in batches)
    second_s = time.perf_counter() - t
    second_diff = float(np.abs(again - sums).max() / np.abs(sums).max())

  def forward(ps, x):
    return [m.model.apply({"params": p}, preprocess.normalize(x, m.policy), capture=())[0]
            for m, p in zip(models, ps)]

  rates.append(accelerator.matmul_rate(2048))
  fwd = jax.jit(forward)
  jax.block_until_ready(fwd(params, batches[0][0]))
  t = time.perf_counter()
  for x, _ in batches:
    jax.block_until_ready(fwd(params, x))
  forward_s = time.perf_counter() - t

  # counted from the jaxpr (`accelerator.matmul_flops`): XLA's GPU cost analysis leaves out cuBLAS calls
  fwd_flops = accelerator.matmul_flops(jax.make_jaxpr(forward)(params, batches[0][0]).jaxpr) * len(batches)
  shapes = [v for m in models
            for v in representations.point_shapes(m.model, m.params, m.names, s.batch).values()]
  dims = [int(np.prod(v.shape[1:])) for v in shapes]
  layers = len(dims)
  gram_flops = len(batches) * (sum(2 * s.batch * s.batch * d for d in dims) + 2 * layers * layers * s.batch**2)
  rates.append(accelerator.matmul_rate(2048))
  np.save(s.path("ours.npy"), ours_cka)
  return dict(total_s=total_s, ours_s=total_s - compile_s, compile_s=compile_s, forward_s=forward_s,
              second_s=second_s, second_diff=second_diff, device_peak_gib=_device_peak_gib(s),
              compile_phases=compile_phases,
              fwd_flops=fwd_flops, gram_flops=gram_flops,
              matmul_flops_per_s=max(rates),  # the machine at its best: rates moved 2x on shared machines
              layers_x=len(models[0].names), layers_y=len(models[1].names), peak_gib=_peak_gib(),
              cache_entries=len(os.listdir(s.cache)) if s.cache else 0, jax=jax.__version__,
              backend=f"{jax.devices()[0].device_kind} ({jax.default_backend()})")


def part_reference(s: Setup) -> dict:
  """float64 CKA from our activations (a few layers at a time), against ours."""
  import jax
  from vitcnn_jax.inputs import preprocess

  models = _jax_models(s)
  images = _images(s)
  chunks = []
  for m in models:
    for i in range(0, len(m.names), 12):
      names = m.names[i:i + 12]
      chunks.append((jax.jit(lambda p, x, m=m, names=names: m.model.apply(
          {"params": p}, preprocess.normalize(x, m.policy), capture=names)[1]), m.params, names))
  hsic = 0.0
  for i in range(0, s.images, s.batch):
    rows = []
    for f, params, names in chunks:
      out = f(params, images[i:i + s.batch])
      rows += [_centred(out[n]) for n in names]
      del out
    rows = np.stack(rows)
    hsic = hsic + rows @ rows.T
  ref = _cka_of(hsic)
  np.save(s.path("reference.npy"), ref)
  ours = np.load(s.path("ours.npy"))
  return dict(max_abs_err=float(np.abs(ours - ref).max()), peak_gib=_peak_gib())


def _timm_models(s: Setup):
  """The two timm networks (eval mode) and the layers read from each."""
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  import torchvision_cpu
  torchvision_cpu.declare_detection_ops()
  import timm
  import torch
  if s.workload == "resnet18":
    import safetensors.torch
    nets = []
    for i in range(2):
      net = timm.create_model("resnet18", num_classes=R18_CLASSES)
      net.load_state_dict(safetensors.torch.load_file(_r18_file(s, i)))
      nets.append(net.eval())
    return nets[0], nets[1], list(R18_LAYERS), list(R18_LAYERS)
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


def part_weights(s: Setup) -> dict:
  """The ResNet-18 workload's two timm networks at random init, saved as state
  dicts: the peers load them into timm, ours through its timm reader."""
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  import torchvision_cpu
  torchvision_cpu.declare_detection_ops()
  import safetensors.torch
  import timm
  import torch
  for i in range(2):
    torch.manual_seed(i)
    # torchvision's init, as the peers' benchmark: timm's default zeroes each block's last BN
    # scale, which makes our points (a conv after its BatchNorm) constant.
    net = timm.create_model("resnet18", num_classes=R18_CLASSES, zero_init_last=False)
    safetensors.torch.save_file({k: v.contiguous() for k, v in net.state_dict().items()}, _r18_file(s, i))
  return dict(peak_gib=_peak_gib())


def _torch_setup(s: Setup):
  """timm's networks, their layers, the images as one unshuffled loader of
  (image, label) minibatches, and torch's forward time of both over it."""
  m1, m2, l1, l2 = _timm_models(s)
  import torch
  from torch.utils.data import DataLoader, TensorDataset
  torch.set_num_threads(os.cpu_count())
  mean, std = (np.asarray(v, np.float32)[:, None, None] * 255 for v in s.stats)
  x = torch.from_numpy((_images(s).transpose(0, 3, 1, 2).astype(np.float32) - mean) / std)
  loader = DataLoader(TensorDataset(x, torch.zeros(len(x), dtype=torch.long)), batch_size=s.batch)
  m1, m2 = m1.to(s.device), m2.to(s.device)
  with torch.no_grad():
    for _ in range(s.device != "cpu"):  # cuDNN's first calls choose their kernels
      m1(next(iter(loader))[0].to(s.device))
      m2(next(iter(loader))[0].to(s.device))
    _sync(s)
    t = time.perf_counter()
    for xb, _ in loader:  # as the peers do: each minibatch moved to the device in the loop
      xb = xb.to(s.device)
      m1(xb)
      m2(xb)
    _sync(s)
    forward_s = time.perf_counter() - t
  return m1, m2, l1, l2, loader, forward_s


def _sync(s: Setup) -> None:
  if s.device != "cpu":
    import torch
    torch.cuda.synchronize()


def part_torch_reference(s: Setup) -> dict:
  """float64 HSIC (unbiased) and CKA (biased) from timm's activations, for the peers."""
  import torch
  m1, m2, l1, l2, loader, _ = _torch_setup(s)
  rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
  keys = [(1, n) for n in l1] + [(2, n) for n in l2]

  def hook(key):
    def keep(mod, inp, out):
      out = out.cpu().numpy()
      rows[key] = _centred(out), _centred(out, True)
    return keep

  for k, net in ((1, m1), (2, m2)):
    for name, mod in net.named_modules():
      if (k, name) in keys:
        mod.register_forward_hook(hook((k, name)))
  hsic = [0.0, 0.0]  # unbiased, biased
  with torch.no_grad():
    for xb, _ in loader:
      xb = xb.to(s.device)
      m1(xb)
      m2(xb)
      for j in range(2):
        u = np.stack([rows[k][j] for k in keys])
        hsic[j] = hsic[j] + u @ u.T
  np.savez(s.path("torch_reference.npz"), hsic=hsic[0], biased=_cka_of(hsic[1])[:len(l1), len(l1):])
  return dict(peak_gib=_peak_gib())


def _plain(hsic: np.ndarray, lx: int) -> np.ndarray:
  return _cka_of(hsic)[:lx, lx:]


def _with_eps(hsic: np.ndarray, lx: int) -> np.ndarray:
  d = np.diag(hsic)
  return hsic[:lx, lx:] / np.sqrt(np.outer(d[:lx], d[lx:]) + 1e-4)


# tool -> what its source does to the minibatch CKA, as a float64 function of the HSIC sums: its
# distance from this is its arithmetic's (float32), its distance from the plain one its design's too.
FORMULAS = {"torch-cka": ("as is", _plain),
            "pytorch-cka": ("clipped to [0, 1]", lambda h, lx: np.clip(_plain(h, lx), 0, 1)),
            "ckatorch": ("as is", _plain), "cka-pytorch": ("1e-4 added under the root", _with_eps)}


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
  except Exception as e:  # noqa: BLE001  (its message is the finding)
    return f"its CKA class fails on this workload: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
  return f"its CKA class ran (the other estimator), mean CKA {float(torch.mean(got)):.3f}"


RUNS = {"torch-cka": _run_torch_cka, "pytorch-cka": _run_pytorch_cka, "ckatorch": _run_ckatorch,
        "cka-pytorch": _run_cka_pytorch}


def part_peer(s: Setup, tool: str) -> dict:
  """One peer over the loader, timed from its construction to its CKA matrix."""
  import importlib
  from importlib import metadata
  m1, m2, l1, l2, loader, forward_s = _torch_setup(s)
  importlib.import_module(PEERS[tool][1])
  t = time.perf_counter()
  cka, rows, cols = RUNS[tool](m1, m2, l1, l2, loader, s.device)
  _sync(s)
  total_s = time.perf_counter() - t
  second_s = None
  if s.second:
    t = time.perf_counter()  # a notebook's second call (the tool set up again)
    RUNS[tool](m1, m2, l1, l2, loader, s.device)
    _sync(s)
    second_s = time.perf_counter() - t
  note = _ckatorch_class(m1, m2, l1, l2, loader, s.device) if tool == "ckatorch" else ""
  extra = (len(rows) - len(l1)) + (len(cols) - len(l2))
  if extra:  # cka-pytorch also hooks every module whose own name (not its path) is asked for
    note = f"hooked {extra} more layers than asked (a name's last part matches), dropped here"
  cka = np.asarray(cka, np.float64)[np.ix_([rows.index(n) for n in l1], [cols.index(n) for n in l2])]
  np.save(s.path(f"peer_{tool}.npy"), cka)
  return dict(total_s=total_s, second_s=second_s, forward_s=forward_s, peak_gib=_peak_gib(),
              device_peak_gib=_device_peak_gib(s, torch_side=True), note=note,
              version=metadata.version(PEERS[tool][0]), layers_x=len(l1), layers_y=len(l2))


# Every measure of vitcnn_jax.similarity.measures.NAMES, with the null (issue 34's budget: at most 1.3x
# the time of the step with linear CKA alone, forward included, and 1.1x its peak memory).
MEASURED = "all"


def part_step(s: Setup, measures: tuple[str, ...] | str = ("linear_cka",), null: bool = False) -> dict:
  """The time of the sharded CKA step (forward and measures) over every minibatch,
  with `measures` ("all": every one)."""
  import jax
  import ml_collections
  from vitcnn_jax.run import driver
  from vitcnn_jax.run import memory
  from vitcnn_jax.run import parallel
  from vitcnn_jax.analyses import cka as cka_job
  models = _jax_models(s)
  mesh = parallel.mesh()
  by_key = {m.name: m for m in models}
  from vitcnn_jax.similarity import measures as all_measures
  names = all_measures.NAMES if measures == "all" else measures
  job = ml_collections.ConfigDict(dict(repeats=1, num_examples=s.images, batch_size=s.batch,
                                       measures=names, null=null))
  step = driver.compile_pass(cka_job.CKA(job, by_key), by_key, mesh)
  params = [parallel.replicate(mesh, m.params) for m in models]
  images, mask = _images(s), np.ones((s.batch,), np.float32)
  batches = [(parallel.global_batch(mesh, images[i:i + s.batch]), parallel.global_batch(mesh, mask))
             for i in range(0, s.images, s.batch)]
  random = lambda i: parallel.replicate(mesh, driver.random_of(0, 0, 0, i))
  first = (params, None, [batches[0][0]] * 2, batches[0][1], batches[0][1], random(0))
  t = time.perf_counter()  # as the driver runs it: compiled, the compiler's freed memory handed back
  compiled = step.compiled(*first)
  jax.block_until_ready(compiled(*first))
  compile_s = time.perf_counter() - t
  t = time.perf_counter()
  for i, (x, m) in enumerate(batches):
    jax.device_get(compiled(params, None, [x, x], m, m, random(i)))
  return dict(step_s=time.perf_counter() - t, compile_s=compile_s, peak_gib=_peak_gib(),
              step_gib=memory.step_bytes(compiled) / memory.GIB)


def overhead(s: Setup, rounds: int) -> None:
  """The step with linear CKA alone against every measure and the null, alternating."""
  runs = {"linear": [], "measures": []}
  for r in range(rounds):
    for label in runs:
      runs[label].append(_run_part(label, s))
      got = runs[label][-1]
      print(f"round {r + 1} {label}: step {got['step_s']:.1f} s (first call, compile and a step: "
            f"{got['compile_s']:.1f} s), "
            f"peak {got['peak_gib']:.2f} GiB (the step's own, XLA: {got['step_gib']:.3f} GiB)", flush=True)
  med = {k: {f: float(np.median([x[f] for x in v])) for f in ("step_s", "peak_gib", "step_gib")}
         for k, v in runs.items()}
  print(f"linear CKA alone: {med['linear']['step_s']:.1f} s, peak {med['linear']['peak_gib']:.2f} GiB; "
        f"every measure + null: {med['measures']['step_s']:.1f} s, "
        f"peak {med['measures']['peak_gib']:.2f} GiB")
  target = 1.3 if s.batch <= 32 else 3.0  # issue 34's budget at W's minibatch of 32; issue 53's above
  print(f"-> {med['measures']['step_s'] / med['linear']['step_s']:.3f}x time (target <= {target}x), "
        f"{med['measures']['peak_gib'] / med['linear']['peak_gib']:.3f}x process peak and "
        f"{med['measures']['step_gib'] / med['linear']['step_gib']:.3f}x the step's memory (XLA's "
        "analysis: arguments, outputs, temporaries) (target <= 1.1x)")


def _run_part(name: str, s: Setup, root: str = ROOT) -> dict:
  """Part `name` in a fresh process. Another checkout's copy of this script (at
  an older revision) is given only the arguments every revision takes (and, for
  workload resnet18, those of the revisions that have it)."""
  cmd = [sys.executable, os.path.join(root, "benchmarks", os.path.basename(__file__)), "--part", name,
         "--images", str(s.images), "--batch", str(s.batch)]
  if root != ROOT and s.workload != "W":
    cmd += ["--workload", s.workload, "--size", str(s.size), "--work", s.work]
  if root == ROOT:
    cmd += ["--workload", s.workload, "--size", str(s.size), "--work", s.work, "--cache", s.cache,
            "--device", s.device] + ["--second"] * s.second
  r = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
  if r.returncode:
    raise RuntimeError(f"part {name} failed in {root}:\n{r.stderr[-4000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])


def compare(rev: str, s: Setup, rounds: int) -> None:
  """Our part at `rev` and here, interleaved (rev, here, rev, here, ...). `rev`
  may be a folder holding a revision's files (`git archive REV | tar -x -C DIR`),
  for a machine without the repository's history."""
  with tempfile.TemporaryDirectory() as tmp:
    tree = os.path.abspath(rev) if os.path.isdir(rev) else os.path.join(tmp, "rev")
    if not os.path.isdir(rev):
      subprocess.run(["git", "worktree", "add", "--detach", "-q", tree, rev], cwd=ROOT, check=True)
    if s.workload == "resnet18":
      _run_part("weights", s)
    try:
      runs = {rev: [], "this checkout": []}
      for r in range(rounds):
        for label, root in ((rev, tree), ("this checkout", ROOT)):
          runs[label].append(_run_part("ours", s, root))
          got = runs[label][-1]
          print(f"round {r + 1} {label}: ours {got['total_s']:.1f} s end to end = compile "
                f"{got['compile_s']:.1f} s + steps {got['ours_s']:.1f} s, forward only "
                f"{got['forward_s']:.1f} s, peak {got['peak_gib']:.2f} GiB", flush=True)
    finally:
      if not os.path.isdir(rev):
        subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT, check=False)
  fields = ("total_s", "compile_s", "ours_s", "forward_s", "peak_gib")
  med = {k: {f: float(np.median([x[f] for x in v])) for f in fields} for k, v in runs.items()}
  for k, m in med.items():
    print(f"{k}: median end to end {m['total_s']:.1f} s = compile {m['compile_s']:.1f} s + steps "
          f"{m['ours_s']:.1f} s (CKA beyond the forward {m['ours_s'] - m['forward_s']:.1f} s), "
          f"forward only {m['forward_s']:.1f} s, peak {m['peak_gib']:.2f} GiB")
  here, there = med["this checkout"], med[rev]
  print(f"this checkout / {rev}: {here['total_s'] / there['total_s']:.3f}x end to end, "
        f"{here['compile_s'] / there['compile_s']:.3f}x compile, {here['ours_s'] / there['ours_s']:.3f}x steps, "
        f"{here['peak_gib'] / there['peak_gib']:.3f}x peak")


def _peer_row(s: Setup, tool: str, ref: dict) -> dict:
  """A peer's part, or why it did not run, and its CKA's distance from each reference."""
  row = dict(tool=tool, estimator=PEERS[tool][2], how=HOW[tool].format(device=s.device))
  try:
    got = _run_part(tool, s)
  except RuntimeError as e:
    lines = [x for x in str(e).splitlines() if x.strip()]
    return dict(row, error=lines[-1][:160] if lines else "failed")
  row.update(version=got["version"], end_to_end_s=got["total_s"], forward_s=got["forward_s"],
             beyond_forward_s=got["total_s"] - got["forward_s"], peak_gib=got["peak_gib"],
             second_s=got.get("second_s"), device_peak_gib=got.get("device_peak_gib"),
             max_abs_err=None, note=got["note"])
  if not ref:
    return row
  cka, (what, formula) = np.load(s.path(f"peer_{tool}.npy")), FORMULAS[tool]
  lx = len(cka)
  err = lambda want: float(np.abs(cka - want).max())
  errs = {"unbiased": err(_plain(ref["hsic"], lx)), "biased": err(ref["biased"])}
  row.update(max_abs_err=errs["unbiased"], biased_err=errs["biased"], formula=what,
             formula_err=err(formula(ref["hsic"], lx)))
  closest = min(errs, key=errs.get)
  if closest != row["estimator"]:
    row["note"] = (f"closer to the {closest} float64 CKA than to the {row['estimator']} one its source "
                   "computes; " + row["note"]).rstrip("; ")
  if what != "as is":
    row["note"] = (f"its CKA ({what}) is {row['formula_err']:.1e} from the same in float64; "
                   + row["note"]).rstrip("; ")
  return row


def _table(rows: list[dict]) -> list[str]:
  """One line per tool: time, time beyond the forward, peak, max |CKA - float64| (the
  unbiased minibatch CKA, which every tool computes; the same with the tool's own
  changes to it, see the notes; the biased one), ratios to ours (cold); where
  measured, a second call in the same process and the device's peak memory."""
  ours = rows[0]
  extra = any(r.get("second_s") is not None or r.get("device_peak_gib") for r in rows)
  lines = [f"{'tool':<17} | {'end to end':>10} | {'beyond fwd':>10} | {'peak GiB':>8} | "
           f"{'max |CKA - f64|':>15} | {'its formula':>11} | {'biased f64':>10} | {'e2e / ours':>10} | "
           f"{'beyond / ours':>13}" + (f" | {'2nd call':>8} | {'device GiB':>10}" if extra else "")]
  opt = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
  for r in rows:
    if "error" in r:
      lines.append(f"{r['tool']:<17} | not run: {r['error']}")
      continue
    r["e2e_ratio"] = r["end_to_end_s"] / ours["end_to_end_s"]
    r["beyond_ratio"] = r["beyond_forward_s"] / max(ours["beyond_forward_s"], 1e-9)
    own = opt(r.get("formula_err", r["max_abs_err"]), "{:.1e}")
    lines.append(f"{r['tool']:<17} | {r['end_to_end_s']:>8.1f} s | {r['beyond_forward_s']:>8.1f} s | "
                 f"{r['peak_gib']:>8.2f} | {opt(r['max_abs_err'], '{:.1e}'):>15} | {own:>11} | "
                 f"{opt(r.get('biased_err'), '{:.1e}'):>10} | {r['e2e_ratio']:>9.2f}x | "
                 f"{r['beyond_ratio']:>12.2f}x"
                 + (f" | {opt(r.get('second_s'), '{:.2f} s'):>8} | {opt(r.get('device_peak_gib'), '{:.2f}'):>10}"
                    if extra else ""))
  return lines


def _ours_rows(cold: dict, warm: dict, ref: dict) -> list[dict]:
  rows = []
  for label, got in (("ours (cold)", cold), ("ours (warm cache)", warm)):
    rows.append(dict(tool=label, version=f"jax {got['jax']}", end_to_end_s=got["total_s"],
                     compile_s=got["compile_s"], steps_s=got["ours_s"], forward_s=got["forward_s"],
                     beyond_forward_s=got["total_s"] - got["forward_s"], peak_gib=got["peak_gib"],
                     max_abs_err=ref.get("max_abs_err"), reference="unbiased", estimator="unbiased",
                     second_s=got.get("second_s"), device_peak_gib=got.get("device_peak_gib"),
                     how="HSIC_1 of every layer pair, one sharded XLA step per minibatch (vitcnn_jax "
                     "driver.compile_pass of analyses.cka.CKA)", note=""))
  return rows


def _print_ours(s: Setup, cold: dict, warm: dict, ref: dict) -> None:
  bound = (cold["fwd_flops"] + cold["gram_flops"]) / cold["matmul_flops_per_s"]
  for label, got in (("ours (cold)", cold), ("ours (warm cache)", warm)):
    print(f"{label}: {got['total_s']:.1f} s end to end = compile {got['compile_s']:.1f} s + steps "
          f"{got['ours_s']:.1f} s; forward only {got['forward_s']:.1f} s; peak {got['peak_gib']:.2f} GiB; "
          f"{got['cache_entries']} programs in the compilation cache after it")
  print(f"lower bound: {bound:.1f} s = ({cold['fwd_flops'] / 1e9:.0f} forward + "
        f"{cold['gram_flops'] / 1e9:.0f} Gram GFLOP) / {cold['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s "
        f"-> ours' steps (compile excluded) / bound = {cold['ours_s'] / bound:.2f}x"
        + (" (target <= 1.15x)" if s.workload == "W" else ""))
  if ref:
    print(f"accuracy: max |CKA - float64 reference| = {ref['max_abs_err']:.2e}"
          + (" (target <= 1e-5)" if s.workload == "W" else ""))
  if cold.get("device_peak_gib") is not None:
    print(f"ours' peak {s.device} memory: {cold['device_peak_gib']:.2f} GiB (JAX's allocator)")
  for label, got in (("cold", cold), ("warm cache", warm)):
    print(f"ours' compile ({label}), JAX's events: " + ", ".join(
        f"{k} {v:.2f} s" for k, v in sorted(got.get("compile_phases", {}).items(), key=lambda kv: -kv[1])))
  if cold.get("second_s") is not None:
    print(f"ours, a second call in the same process (compiled step reused): {cold['second_s']:.2f} s "
          f"(its sums {cold['second_diff']:.1e} from the first's, relative)")


def _print_targets(rows: list[dict]) -> None:
  """Workload W's targets against torch-cka, end to end with our compile included."""
  tc = next((r for r in rows if r["tool"] == "torch-cka" and "error" not in r), None)
  if tc is None:
    return
  cold, warm = rows[0], rows[1]
  theirs, steady = tc["beyond_forward_s"], cold["steps_s"] - cold["forward_s"]
  ratio = lambda ours: f"{theirs / max(ours, 1e-9):.1f}x"
  print(f"CKA overhead beyond the forward passes, torch-cka ({theirs:.1f} s) / ours: "
        f"{ratio(cold['beyond_forward_s'])} with our compile ({cold['beyond_forward_s']:.1f} s), "
        f"{ratio(warm['beyond_forward_s'])} with a warm cache ({warm['beyond_forward_s']:.1f} s), "
        f"{ratio(steady)} without it ({steady:.1f} s) (target >= 40x)")
  print(f"end to end, compile included: torch-cka / ours = {tc['end_to_end_s'] / cold['end_to_end_s']:.1f}x; "
        f"{tc['end_to_end_s'] / warm['end_to_end_s']:.1f}x with a warm cache (target >= 5x)")


def _device_parts(r: dict) -> str:
  """A peer's second call and device peak, where measured."""
  out = f", a second call {r['second_s']:.2f} s" if r.get("second_s") is not None else ""
  return out + (f", peak device memory {r['device_peak_gib']:.2f} GiB" if r.get("device_peak_gib") else "")


def run_all(s: Setup, peers: list[str], json_path: str) -> None:
  """Every part in its own process, then the table (and the `--json` record)."""
  if s.workload == "resnet18":
    _run_part("weights", s)
  cache = s.path("jax_cache")
  os.makedirs(cache, exist_ok=True)
  cold = _run_part("ours", dataclasses.replace(s, cache=cache))
  warm = _run_part("ours", dataclasses.replace(s, second=False, cache=cache))
  ref = _run_part("reference", s) if s.reference else {}
  what = ("ViT-B/16 x BiT-R50x1; ours at our random init, the peers timm's at timm's" if s.workload == "W"
          else "ResNet-18 x ResNet-18, timm's at random init (seeds 0, 1), the same weights in ours")
  print(f"{s.workload}: {s.images} images of {s.size} px in minibatches of {s.batch}, {cold['layers_x']} x "
        f"{cold['layers_y']} layers ({what}); {os.cpu_count()} CPU cores; ours on {cold['backend']}, the "
        f"peers on torch's {s.device}", flush=True)
  _print_ours(s, cold, warm, ref)
  rows = _ours_rows(cold, warm, ref)
  if peers:
    torch_ref = {}
    if s.reference:
      _run_part("torch_reference", s)
      with np.load(s.path("torch_reference.npz")) as f:
        torch_ref = {k: f[k] for k in ("hsic", "biased")}
    if torch_ref and s.workload == "resnet18":  # one set of weights: our CKA and timm's activations' float64 agree
      lx = cold["layers_x"]
      ours = np.load(s.path("ours.npy"))[:lx, lx:]
      print(f"ours vs the float64 CKA of timm's activations (the same networks): max |diff| = "
            f"{np.abs(ours - _plain(torch_ref['hsic'], lx)).max():.2e}")
    for tool in peers:
      rows.append(_peer_row(s, tool, torch_ref))
      r = rows[-1]
      print(f"{tool}: " + (f"not run: {r['error']}" if "error" in r else
                           f"{r['end_to_end_s']:.1f} s, forward only {r['forward_s']:.1f} s, peak "
                           f"{r['peak_gib']:.2f} GiB" + _device_parts(r)), flush=True)
  print()
  print("\n".join(_table(rows)))
  for r in rows[2:]:
    print(f"  {r['tool']}" + (f" {r['version']}" if "version" in r else "") + f": {r['how']}"
          + (f"; {r['note']}" if r.get("note") else ""))
  if s.workload == "W":
    _print_targets(rows)
  if json_path:
    record = dict(workload=s.workload, images=s.images, batch=s.batch, size=s.size,
                  layers=[cold["layers_x"], cold["layers_y"]], cpu_cores=os.cpu_count(),
                  machine=platform.processor() or platform.machine(), python=platform.python_version(),
                  bound_s=(cold["fwd_flops"] + cold["gram_flops"]) / cold["matmul_flops_per_s"],
                  matmul_flops_per_s=cold["matmul_flops_per_s"], rows=rows)
    with open(json_path, "w") as f:
      json.dump(record, f, indent=1)


def _setup(args) -> Setup:
  w = WORKLOADS[args.workload]
  s = Setup(args.workload, args.images or w["images"], args.batch or w["batch"], args.size or w["size"],
            args.work or Setup.work, args.cache, args.device, not args.no_reference, args.second)
  if s.workload == "W" and s.size != 224:
    raise SystemExit("--size: workload W runs at 224 px only.")
  if s.batch < 4 or s.images % s.batch:
    raise SystemExit(f"--images {s.images} must be a multiple of --batch {s.batch}, and the batch at least 4 "
                     "(HSIC_1 divides by n - 3).")
  os.makedirs(s.work, exist_ok=True)
  return s


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--part", default="")
  ap.add_argument("--workload", default="W", choices=sorted(WORKLOADS))
  ap.add_argument("--images", type=int, default=0, help="0: the workload's (W 256, resnet18 10,000)")
  ap.add_argument("--batch", type=int, default=0, help="0: the workload's (W 32, resnet18 1,000)")
  ap.add_argument("--size", type=int, default=0, help="image size; 0: the workload's (W 224, resnet18 32)")
  ap.add_argument("--peers", default=",".join(PEERS), help=f"comma list of {', '.join(PEERS)}; none: ours only")
  ap.add_argument("--skip_torch_cka", action="store_true", help="leave torch-cka out of --peers")
  ap.add_argument("--json", default="", metavar="PATH", help="also write the table's rows and settings here")
  ap.add_argument("--work", default="", help="the parts' shared folder (default: a fresh temporary one)")
  ap.add_argument("--cache", default="", help=argparse.SUPPRESS)  # a part's compilation cache
  ap.add_argument("--compare", default="", metavar="REV")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--device", default="cpu", help="torch's device for the peers (cuda: ours on JAX's GPU too)")
  ap.add_argument("--no_reference", action="store_true",
                  help="skip the float64 references (minutes on CPU at W's scale): no error columns")
  ap.add_argument("--second", action="store_true", help="also time a second call in the same process")
  ap.add_argument("--overhead", action="store_true",
                  help="time the step with linear CKA alone and with more measures and the null")
  args = ap.parse_args()
  if args.part:
    s = _setup(args)
    parts = {"ours": part_ours, "reference": part_reference, "torch_reference": part_torch_reference,
             "weights": part_weights, "linear": part_step,
             "measures": lambda s: part_step(s, MEASURED, True),
             **{t: lambda s, t=t: part_peer(s, t) for t in PEERS}, "torch_cka": lambda s: part_peer(s, "torch-cka")}
    print(json.dumps(parts[args.part](s)))
    return
  peers = [] if args.peers in ("", "none") else [p.strip().replace("_", "-") for p in args.peers.split(",")]
  unknown = [p for p in peers if p not in PEERS]
  if unknown:
    raise SystemExit(f"--peers: {unknown} are not among {list(PEERS)}.")
  peers = [p for p in peers if not (args.skip_torch_cka and p == "torch-cka")]
  if args.overhead and args.workload != "W":
    raise SystemExit("--overhead runs workload W.")
  with tempfile.TemporaryDirectory(prefix="cka_bench_") as tmp:
    args.work = args.work or tmp
    s = _setup(args)
    if args.compare:
      compare(args.compare, s, args.rounds)
    elif args.overhead:
      overhead(s, args.rounds)
    else:
      run_all(s, peers, args.json)


if __name__ == "__main__":
  main()

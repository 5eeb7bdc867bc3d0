"""The float64 references every tool's CKA is checked against: ours from our
activations, the peers' from timm's, both the unbiased (HSIC_1) minibatch CKA and
the biased (HSIC_0) one that tells the two estimators apart."""

from __future__ import annotations

import numpy as np

from benchmarks import peaks
from benchmarks import torch_side
from benchmarks import workload


def centred(x: np.ndarray, biased: bool = False) -> np.ndarray:
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


def cka_of(hsic: np.ndarray) -> np.ndarray:
  d = np.sqrt(np.diag(hsic))
  return hsic / np.outer(d, d)


def plain(hsic: np.ndarray, lx: int) -> np.ndarray:
  """The CKA of the first network's `lx` layers (rows) against the second's."""
  return cka_of(hsic)[:lx, lx:]


def with_eps(hsic: np.ndarray, lx: int) -> np.ndarray:
  """`plain` with 1e-4 under the root, as cka-pytorch computes it."""
  d = np.diag(hsic)
  return hsic[:lx, lx:] / np.sqrt(np.outer(d[:lx], d[lx:]) + 1e-4)


def part_reference(s: workload.Setup) -> dict:
  """float64 CKA from our activations (a few layers at a time), against ours."""
  import jax
  from vitcnn_jax.inputs import preprocess

  models = workload.jax_models(s)
  images = workload.images(s)
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
      rows += [centred(out[n]) for n in names]
      del out
    rows = np.stack(rows)
    hsic = hsic + rows @ rows.T
  ref = cka_of(hsic)
  np.save(s.path("reference.npy"), ref)
  ours = np.load(s.path("ours.npy"))
  return dict(max_abs_err=float(np.abs(ours - ref).max()), peak_gib=peaks.process_gib())


def part_torch_reference(s: workload.Setup) -> dict:
  """float64 HSIC (unbiased) and CKA (biased) from timm's activations, for the peers."""
  import torch
  m1, m2, l1, l2, loader, _ = torch_side.torch_setup(s)
  rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
  keys = [(1, n) for n in l1] + [(2, n) for n in l2]

  def hook(key):
    def keep(mod, inp, out):
      out = out.cpu().numpy()
      rows[key] = centred(out), centred(out, True)
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
  np.savez(s.path("torch_reference.npz"), hsic=hsic[0], biased=cka_of(hsic[1])[:len(l1), len(l1):])
  return dict(peak_gib=peaks.process_gib())

"""PyTorch state dicts (timm's and transformers' safetensors, ONNX exports of
them): torch's leaf names and layouts read as Flax's, for every family's readers."""

from __future__ import annotations

import numpy as np

from vitcnn_jax.models.formats.base import CheckpointError, Keys

TORCH_LEAVES = {"kernel": "weight", "scale": "weight", "bias": "bias"}  # ours -> torch's
BN_LEAVES = {"scale": "weight", "bias": "bias", "mean": "running_mean", "var": "running_var"}


def take_torch_norm(keys: Keys, p: dict, name: str, ours: str) -> None:
  """A torch LayerNorm (or GRN) `name`: weight and bias as our scale and bias."""
  p[f"{ours}/scale"], p[f"{ours}/bias"] = keys.take(f"{name}.weight"), keys.take(f"{name}.bias")


def take_torch_linear(keys: Keys, name: str, bias: bool = True
                      ) -> tuple[np.ndarray, np.ndarray | None]:
  """A torch Linear `name` as a Flax (in, out) kernel and its bias (None where
  `bias` is False and the file has none)."""
  w = keys.take(f"{name}.weight")
  if w.ndim != 2:
    raise CheckpointError(f"{keys.path}: {keys.shape(name + '.weight')} is not a matrix.")
  b = keys.take(f"{name}.bias") if bias or keys.has(f"{name}.bias") else None
  return w.T, b


def take_head_torch(keys: Keys, p: dict, cfg: dict, ev: dict, name: str = "head") -> None:
  """A torch Linear classifier `name`, if the file has one."""
  if keys.has(f"{name}.weight"):
    p["head/kernel"], p["head/bias"] = take_torch_linear(keys, name)
    cfg["num_classes"], ev["num_classes"] = p["head/kernel"].shape[1], keys.shape(f"{name}.weight")
  else:
    cfg["num_classes"], ev["num_classes"] = None, f"no {name}.weight in the file"



def take_torch_conv(keys: Keys, p: dict, name: str, ours: str, bias: bool = False,
                    refused: str = "") -> np.ndarray:
  """A torch Conv2d `name` as a Flax (h, w, in, out) kernel, with its bias if
  `bias`; returns torch's kernel. `refused` says which variants a 4-D kernel
  would have to be, for the message."""
  w = keys.take(f"{name}.weight")
  if w.ndim != 4:
    raise CheckpointError(f"{keys.path}: {keys.shape(name + '.weight')} is not a conv kernel "
                          f"(out, in, h, w){refused}.")
  p[f"{ours}/kernel"] = w.transpose(2, 3, 1, 0)
  if bias:
    p[f"{ours}/bias"] = keys.take(f"{name}.bias")
  return w


def take_torch_bn(keys: Keys, p: dict, name: str, ours: str) -> None:
  """A torch BatchNorm2d `name`: its affine and running statistics."""
  for leaf, theirs in BN_LEAVES.items():
    p[f"{ours}/{leaf}"] = keys.take(f"{name}.{theirs}")


def take_torch_dense(keys: Keys, p: dict, name: str, ours: str) -> np.ndarray:
  """A torch Linear `name` as our Dense `ours`; returns its (in, out) kernel."""
  p[f"{ours}/kernel"], p[f"{ours}/bias"] = take_torch_linear(keys, name)
  return p[f"{ours}/kernel"]

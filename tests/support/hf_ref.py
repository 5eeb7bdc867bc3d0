"""Hugging Face transformers (PyTorch) models: tiny random instances saved as
`save_pretrained` writes them (config.json beside model.safetensors), and their
own forwards, the references for our readers of transformers' layouts."""

from __future__ import annotations

import json
import os

import numpy as np

from conftest import require
from support import timm_ref  # torch, with torchvision importable on the CPU build

torch = timm_ref.torch
transformers = require("transformers")


def randomized(model, seed: int = 0):
  """`model` with every vector (biases, norms, layer scales) and token moved off its
  init, so that a swapped or dropped one shows in the outputs."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.ndim == 1 or "token" in name or "embedding" in name or "probe" in name:
        p.add_(0.2 * torch.randn(p.shape, generator=g))
      else:
        p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[-1] if p.ndim == 2 else
                                                               np.prod(p.shape[1:])))
  return model.eval()


def save(model, folder, processor: dict | None = None) -> str:
  """The model's `save_pretrained` folder, with a preprocessor_config.json if given."""
  model.save_pretrained(str(folder))
  if processor is not None:
    with open(os.path.join(folder, "preprocessor_config.json"), "w", encoding="utf-8") as f:
      json.dump(processor, f)
  return str(folder)


def run(model, images: np.ndarray, **kwargs):
  """The model's outputs (hidden states of every layer too) for NHWC float32 images."""
  x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
  with torch.no_grad():
    return model(pixel_values=x, output_hidden_states=True, **kwargs)

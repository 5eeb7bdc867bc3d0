"""torchvision beside the CPU build of torch (tests/requirements.txt), for timm."""

from __future__ import annotations

import torch

_LIBRARY = None


def declare_detection_ops() -> None:
  """torchvision's PyPI wheels build its C++ ops against CUDA torch, so with the CPU
  torch that library cannot load, and torchvision 0.28's import then fails
  registering meta kernels for two detection ops (nms, qnms). timm never calls
  them: declaring their schemas lets torchvision import, and a call to either
  would still fail. Call before importing timm or torchvision."""
  global _LIBRARY
  if torch.version.cuda is not None or _LIBRARY is not None:  # a CUDA torch loads its own
    return
  _LIBRARY = torch.library.Library("torchvision", "DEF")
  for op in ("nms", "qnms"):
    _LIBRARY.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

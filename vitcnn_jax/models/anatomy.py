"""What an analysis may ask of a model, whatever its family.

Every family (`ViT`, `BiT`, `ResNet`, `Mixer`, `ConvNeXt`, `Swin`) implements `Anatomy`; analyses read these
members and refuse a model that lacks what they need (`require`), naming it.
Point names are those of the model's `out` dict (`models/*.py` docstrings).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import numpy as np

from vitcnn_jax.models import sizes


@dataclasses.dataclass(frozen=True)
class Residual:
  """One residual connection of a block: `out` = `skip` + `branch`."""
  block: str  # the block's point prefix, e.g. "block03" or "block2/unit01"
  sublayer: str  # e.g. "attn", "mlp", "token", "channel", "unit"
  skip: str  # the input carried by the skip connection (z)
  branch: str  # the long branch's output (f(z))
  out: str  # after the add (the branch alone where the block was built without its skip)
  has_skip: bool = True


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionLayer:
  """A block's multi-head attention and where its tokens lie on the image, so that
  attention can be measured in pixels whatever the family.

  `weights`: (B, H, T, T) over every token, or (B, windows, H, T, T) within windows.
  `heads`: (B, tokens, H, hd) per-head outputs before the output projection, window
  after window. `positions`: (windows, N, 2) the pixel centre (row, column) of each
  window's spatial tokens, which follow `num_prefix` tokens (class token, registers)
  that lie nowhere. `allowed`: (windows, N, N) the pairs the layer's mask lets attend
  (None: all)."""
  block: int
  weights: str
  heads: str
  num_heads: int
  positions: np.ndarray
  num_prefix: int = 0
  allowed: np.ndarray | None = None


def grid_centres(grid: tuple[int, int], pixels: tuple[int, int]) -> np.ndarray:
  """(rows * columns, 2) pixel centres of a row-major grid of tokens `pixels` in size."""
  rows, cols = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
  return (np.stack([rows, cols], axis=-1) + 0.5) * np.asarray(pixels, np.float64)


class Anatomy(Protocol):
  """The members every model family has."""
  num_blocks: int  # residual blocks (ViT/Mixer blocks, ResNet units)
  sublayers: tuple[str, ...]  # the residual sublayers of one block, in order
  stem: str | None  # the stem's spatial map shown before the blocks (None: a patch embedding)
  grid: tuple[int, int] | None  # the token grid (None: feature maps of varying size)
  token_pixels: tuple[int, int] | None  # pixels per token (patch size)
  prefix_tokens: tuple[str, ...]  # tokens before the spatial ones, e.g. ("cls",)
  num_prefix_tokens: int
  default_policy: str  # the preprocessing it was trained with
  layer_presets: dict[str, tuple[str, ...]]  # "paper", "blocks", "all", "attention" (with any) -> globs

  def residuals(self) -> list[Residual]: ...

  def attention(self) -> list[AttentionLayer]: ...

  def head_projection(self, params: Any, block: int) -> Any:
    """(H, hd, D): the output projection of block `block`'s attention heads."""

  def for_inference(self, params: Any) -> tuple[Any, Any]:
    """(model, params) of the same function with the work that depends on the
    parameters alone (e.g. weight standardisation) done once, not in every step."""


@dataclasses.dataclass(frozen=True)
class Outline:
  """What a comparison of models reads of each one's anatomy: kept with a model's
  pass (`run/kept.py`), so that kept passes are compared without loading a model."""
  tokens: bool  # one token grid (`grid` is set)
  attention: bool  # it has attention layers
  presets: dict[str, tuple[str, ...]]  # `layer_presets`

  @property
  def kind(self) -> str:
    """"ViT" (attention over one token grid), "CNN" (neither) or "other" (a Swin's
    attention over maps, a Mixer's tokens without attention)."""
    return "ViT" if self.tokens and self.attention else "CNN" if not (self.tokens or self.attention) else "other"

  def record(self) -> dict[str, Any]:
    return {"tokens": self.tokens, "attention": self.attention,
            "presets": {k: list(v) for k, v in self.presets.items()}}

  @classmethod
  def of_record(cls, record: dict[str, Any]) -> Outline:
    return cls(bool(record["tokens"]), bool(record["attention"]),
               {k: tuple(v) for k, v in record["presets"].items()})


def outline(model: Anatomy) -> Outline:
  return Outline(model.grid is not None, bool(model.attention()), dict(model.layer_presets))


def require(model: Anatomy, what: str, where: str) -> None:
  """Raises, naming the model and what it lacks, unless it has `what`: "attention",
  "tokens" (a token grid) or "residuals"."""
  has = {"attention": lambda: bool(model.attention()), "tokens": lambda: model.grid is not None,
         "residuals": lambda: bool(model.residuals())}[what]
  if not has():
    raise ValueError(f"{where}: this analysis needs a model with {what}, and a "
                     f"{type(model).__name__} has none.")


def capture_patterns(model: Anatomy, capture: str | Sequence[str]) -> list[str]:
  """Capture globs with preset names ("paper", "blocks", "all", "attention") expanded for `model`."""
  given = [capture] if isinstance(capture, str) else list(capture)
  out = []
  for p in given:
    out += list(model.layer_presets.get(p, (p,)))
  return out


class PatchTokens:
  """The anatomy of a model of patch tokens in residual blocks (ViT, Mixer): each
  block `blockNN` has the residual connections `RESIDUALS` names, as (sublayer,
  skip, branch, out) relative to the block."""
  RESIDUALS = ()

  @property
  def sublayers(self) -> tuple[str, ...]:
    return tuple(r[0] for r in self.RESIDUALS)

  @property
  def grid(self) -> tuple[int, int]:
    return sizes.patch_grid(self.patch_size, self.image_size)

  @property
  def token_pixels(self) -> tuple[int, int]:
    return sizes.to_pair(self.patch_size)

  def residuals(self) -> list[Residual]:
    skipless = tuple(getattr(self, "no_skip", ()))  # ablation models (Fig 8)
    return [Residual(f"block{b:02d}", s, f"block{b:02d}/{z}", f"block{b:02d}/{f}", f"block{b:02d}/{o}",
                     b not in skipless)
            for b in range(self.num_blocks) for s, z, f, o in self.RESIDUALS]


class Stages:
  """The anatomy of a network of stages of `depths` blocks, each block's points
  under `stageS/blockBB` (ConvNeXt, Swin)."""

  @property
  def num_blocks(self) -> int:
    return sum(self.depths)

  def block_names(self) -> list[str]:
    return [f"stage{s}/block{b:02d}" for s, n in enumerate(self.depths) for b in range(n)]


class ParamsAsRead:
  """The anatomy of a family whose forward does no work on its parameters alone."""

  def for_inference(self, params: Any) -> tuple[Any, Any]:
    return self, params


class FeatureMaps:
  """The anatomy of a network of feature maps rather than tokens (ResNet, ConvNeXt, Swin)."""
  grid = None
  token_pixels = None
  prefix_tokens = ()
  num_prefix_tokens = 0


class NoAttention:
  """The anatomy of a model without attention (Mixer, ResNet)."""

  def attention(self) -> list[AttentionLayer]:
    return []

  def head_projection(self, params: Any, block: int) -> Any:
    raise ValueError(f"A {type(self).__name__} has no attention heads.")

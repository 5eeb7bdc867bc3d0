"""Localization: CKA between each output token and each raw input patch (Figs 9, 10, D.1-D.3).

ViT tokens are those of one layer without CLS (row-major); a ResNet "token" is
every channel at one spatial position of a chosen feature map. Input patches
tile the image on the same grid as the tokens (pixels flattened, in [-1, 1]).
Minibatch CKA (unbiased HSIC summed over minibatches) for every token x patch
pair at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax.plotting import localization
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results
from vitcnn_jax.similarity import linear_cka

DEFAULTS = {
    "num_examples": 10240,  # the CKA protocol of the paper (Appendix A)
    "batch_size": 1024,
    "seed": 0,
    "layer": "",  # the point read; "": the output of the model's last block
    "tokens": (),  # tokens plotted (row-major, CLS excluded); (): one off-centre, the centre
}


def to_tokens(act: jax.Array, prefix: int) -> tuple[jax.Array, tuple[int, int] | None]:
  """(B,h,w,C) maps or (B,T,C) tokens -> (B, N, C) spatial tokens and their grid."""
  if act.ndim == 4:
    return act.reshape(act.shape[0], -1, act.shape[-1]), act.shape[1:3]
  return act[:, prefix:], None


def to_patches(images: jax.Array, grid: tuple[int, int]) -> jax.Array:
  """(B,H,W,3) -> (B, gh*gw, ph*pw*3), row-major patches on `grid`."""
  b, h, w, c = images.shape
  gh, gw = grid
  if h % gh or w % gw:
    raise ValueError(f"Image {h}x{w} does not tile into a {gh}x{gw} grid of patches.")
  x = images.reshape(b, gh, h // gh, gw, w // gw, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, gh * gw, -1)


def to_stacks(tokens: jax.Array, patches: jax.Array) -> list[jax.Array]:
  """[tokens (N, B, C), patches (P, B, features)]: the layers token 0, ..., token
  N-1, patch 0, ..., patch P-1, each stack made by one batched program."""
  return [jnp.moveaxis(tokens, 1, 0), jnp.moveaxis(patches, 1, 0)]


class Localization(protocol.HsicPass, protocol.Analysis):
  """One pass: the HSIC of every token and every input patch, all pairs at once."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    (self.key, self.m), = models.items()
    self.config = config
    self.layer = config.layer or self.m.model.residuals()[-1].out
    if self.layer not in self.m.names:
      raise ValueError(f"config.layer={self.layer!r} is not a representation point of {self.m.path}; "
                       f"e.g. {self.m.names[-3:]} (configs/inspect.py lists them).")
    self.points = {self.key: [self.layer]}
    size = self.m.size
    probe = jax.eval_shape(lambda p, x: self.m.model.apply({"params": p}, x, capture=self.layer)[1][self.layer],
                           self.m.params, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    self.grid = tuple(probe.shape[1:3]) if len(probe.shape) == 4 else tuple(self.m.model.grid)
    self.n = self.grid[0] * self.grid[1]
    default = [(self.grid[0] // 4) * self.grid[1] + self.grid[1] // 4,
               (self.grid[0] // 2) * self.grid[1] + self.grid[1] // 2]
    self.tokens = list(config.tokens) or default  # a token off-centre and the centre one
    bad = [t for t in self.tokens if not 0 <= t < self.n]
    if bad:
      raise ValueError(f"config.tokens {bad} are outside 0..{self.n - 1} "
                       f"({self.grid[0]}x{self.grid[1]} grid).")

  def step(self, forward, labels, mask) -> dict:
    del labels
    tokens, _ = to_tokens(forward(self.key)[self.layer], self.m.model.num_prefix_tokens)
    return forward.stacked_sums(to_stacks(tokens, to_patches(forward.inputs(self.key), self.grid)), mask)

  def finalize(self, sums):
    names = [f"token{i}" for i in range(self.n)] + [f"patch{j}" for j in range(self.n)]
    s = sums[0][0]
    tok_patch = linear_cka.cka_from_hsic(s["hsic"], names, s["moments"] / self.config.num_examples)
    tok_patch = tok_patch[:self.n, self.n:]
    summary = {"analysis": "localization", "checkpoint": self.m.path, "label": self.m.label,
               "layer": self.layer, "grid": list(self.grid), "num_examples": self.config.num_examples,
               "tokens": self.tokens, "own_patch_cka_mean": float(np.mean(np.diag(tok_patch))),
               "class_token": "cls" in self.m.model.prefix_tokens,
               "prefix_tokens": list(self.m.model.prefix_tokens),  # left out: spatial tokens only
               "own_patch_best_fraction": float(np.mean(tok_patch.argmax(axis=1) == np.arange(self.n)))}
    return {"cka": tok_patch, "grid": np.asarray(self.grid)}, summary

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    return [localization.token_patches(arrays["cka"], self.grid, self.tokens, f"{self.m.label} {self.layer}",
                                       results.workdir_path(workdir, "localization.png"), figures)]


def _own_patch(s: dict) -> declaration.Verdict:
  if not s["class_token"]:
    return None  # the finding is about models trained with a class token
  return (s["own_patch_best_fraction"] > 0.5,
          f"{100 * s['own_patch_best_fraction']:.0f}% of {s['layer']}'s tokens are most similar to "
          f"their own patch (mean CKA with it {s['own_patch_cka_mean']:.3f})")


def key_numbers(s: dict) -> list[tuple[str, str]]:
  return [("layer", s["layer"]), ("mean CKA of a token with its own patch", f"{s['own_patch_cka_mean']:.3f}"),
          ("tokens most similar to their own patch", f"{100 * s['own_patch_best_fraction']:.0f}%")]


DECLARATION = declaration.Declaration(
    name="localization", build=Localization, models=declaration.Models(any_names=True, count=1),
    needs=(("*", "tokens"),),
    defaults=DEFAULTS, layers="all", figures="Figs 9, 10, D.1-D.3", hsic_minibatches=True,
    key_numbers=key_numbers,
    findings=(declaration.Finding(
        "Higher-layer ViT tokens trained with a CLS token stay localised: each is most similar "
        "to its own input patch (here: for more than half of the tokens, their own patch is the "
        "most similar one). GAP training weakens this (compare a run of a GAP model).",
        _own_patch),))

"""Skip-connection norm ratio ||z|| / ||f(z)|| (paper Figs 7, E.1, E.2).

For every residual connection of every model (`Anatomy.residuals`: a ViT's
attention and MLP, a Mixer's token and channel mixing, a ResNet-v2 unit), z is
the input carried by the skip connection and f(z) the long branch. Models with
tokens get a ratio per token (App. H for the Mixer); feature maps are averaged
over their positions. Ratios (and the cosine similarity between branch and
output, Fig E.2) are averaged over images; a zero branch gives an infinite
ratio, never NaN. Each model with tokens gets a figure, beside the others'.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax.plotting import skip_ratio
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results

DEFAULTS = {
    "num_examples": 2560,  # the paper does not say
    "batch_size": 128,  # per device (any size gives the same result)
    "seed": 0,
    "plot_tokens": 9,  # tokens shown in the heatmaps (Fig 7 shows 0-8)
}


def ratio_and_cosine(z: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per position (last axis = channels): ||z|| / ||f|| and cos(f, z + f)."""
  hp = jax.lax.Precision.HIGHEST
  zn = jnp.sqrt(jnp.einsum("...c,...c->...", z, z, precision=hp))
  fn = jnp.sqrt(jnp.einsum("...c,...c->...", f, f, precision=hp))
  ratio = jnp.where(fn > 0, zn / jnp.where(fn > 0, fn, 1.0), jnp.inf)
  out = z + f
  on = jnp.sqrt(jnp.einsum("...c,...c->...", out, out, precision=hp))
  den = fn * on
  cos = jnp.where(den > 0, jnp.einsum("...c,...c->...", f, out, precision=hp) / jnp.where(den > 0, den, 1.0), 0.0)
  return ratio, cos


def _masked_sum(x: jax.Array, mask: jax.Array, axis: int) -> jax.Array:
  """Sum over the examples axis of the valid rows only: a padding row's infinite
  ratio times a zero mask would be NaN."""
  shape = [1] * x.ndim
  shape[axis] = -1
  return jnp.where(mask.reshape(shape) > 0, x, 0.0).sum(axis=axis)


class SkipRatio(protocol.Analysis):
  """One pass: ratios and cosines summed over images, per residual (and token)."""

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    self.config, self.models = config, models
    self.tokens = [k for k, m in models.items() if m.model.grid is not None]
    if not self.tokens:
      raise ValueError(f"config.models has {list(models)}, none with tokens; skip ratios per "
                       "token need a ViT or a Mixer (a ResNet is shown beside one).")
    self.residuals = {k: m.model.residuals() for k, m in models.items()}
    self.points = {k: list(dict.fromkeys(p for r in rs for p in (r.skip, r.branch)))
                   for k, rs in self.residuals.items()}

  def step(self, forward, labels, mask) -> dict:
    del labels
    sums = {}
    for k, residuals in self.residuals.items():
      out = forward(k)
      r, c = zip(*[ratio_and_cosine(out[x.skip], out[x.branch]) for x in residuals])
      if k not in self.tokens:  # feature maps: the mean over positions
        r, c = ([x.mean(axis=(1, 2)) for x in v] for v in (r, c))
      sums[f"{k}_ratio"] = _masked_sum(jnp.stack(r), mask, 1)  # (residuals[, tokens])
      sums[f"{k}_cosine"] = _masked_sum(jnp.stack(c), mask, 1)
    return sums

  def finalize(self, sums):
    s, n = sums[0][0], self.config.num_examples
    summary, arrays = {"analysis": "skip_ratio", "num_examples": n, "models": {}}, {}
    for k, m in self.models.items():
      ratio, cosine = s[f"{k}_ratio"] / n, s[f"{k}_cosine"] / n
      entry = {"checkpoint": m.path, "label": m.label, "tokens": k in self.tokens}
      if k in self.tokens:
        shape = (m.model.num_blocks, len(m.model.sublayers), -1)  # (block, sublayer, token)
        ratio, cosine = ratio.reshape(shape), cosine.reshape(shape)
        prefix = m.model.num_prefix_tokens
        entry.update(sublayers=list(m.model.sublayers), prefix_tokens=list(m.model.prefix_tokens),
                     cls_ratio=ratio[:, :, 0].tolist() if "cls" in m.model.prefix_tokens else None,
                     spatial_ratio=ratio[:, :, prefix:].mean(axis=-1).tolist())
      else:
        units = [r.block for r in self.residuals[k]]
        entry.update(units=units, ratio=ratio.tolist(), cosine=cosine.tolist())
        arrays[f"{k}_units"] = np.asarray(units)
      summary["models"][k] = entry
      arrays[f"{k}_ratio"], arrays[f"{k}_cosine"] = ratio, cosine
    return arrays, summary

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    others = [(arrays[f"{k}_ratio"], m.label) for k, m in self.models.items() if k not in self.tokens]
    out = []
    for k in self.tokens:
      m = self.models[k].model
      out.append(skip_ratio.ratios(arrays[f"{k}_ratio"], arrays[f"{k}_cosine"], m.num_prefix_tokens,
                                   self.config.plot_tokens, self.models[k].label, others, m.sublayers,
                                   results.workdir_path(workdir, f"skip_ratio_{k}.png"), figures))
    return out


def _halves(v) -> tuple[float, float]:
  v = np.asarray(v, np.float64).ravel()
  return float(v[:len(v) // 2].mean()), float(v[len(v) // 2:].mean())


_PARTS = {"halves": "first / second half", "thirds": "first / last third"}


def _parts(v, parts: str) -> tuple[float, float]:
  """The two halves, as the finding reads them (`_halves`: an odd middle sublayer
  in the second), or the first and last thirds."""
  return _halves(v) if parts == "halves" else declaration.ends(np.ravel(v), parts)


def _cls_then_spatial(s: dict) -> declaration.Verdict | declaration.Variants:
  """By halves of the sublayers, as the finding reads them, and by their first and last thirds."""
  with_cls = {k: e for k, e in s["models"].items() if e.get("cls_ratio") is not None}
  if not with_cls:
    return None

  def check(parts: str) -> declaration.Verdict:
    shown, text = True, []
    for e in with_cls.values():
      cls, spatial = _parts(e["cls_ratio"], parts), _parts(e["spatial_ratio"], parts)
      shown &= cls[0] > spatial[0] and spatial[1] > cls[1]
      text.append(f"{e['label']}: CLS {cls[0]:.2f} / {cls[1]:.2f}, spatial {spatial[0]:.2f} / "
                  f"{spatial[1]:.2f} ({_PARTS[parts]})")
    return shown, "; ".join(text)
  return declaration.each("parts", ("halves", "thirds"), check)


def _above_cnn(s: dict) -> declaration.Verdict:
  return declaration.above(
      {e["label"]: float(np.mean(e["spatial_ratio"])) for e in s["models"].values() if e["tokens"]},
      {e["label"]: float(np.mean(e["ratio"])) for e in s["models"].values() if not e["tokens"]})


def key_numbers(s: dict) -> list[tuple[str, str]]:
  out = []
  for e in s["models"].values():
    if not e["tokens"]:
      out.append((f"{e['label']} ratio, mean over units", f"{np.mean(e['ratio']):.2f}"))
      continue
    if e["cls_ratio"] is not None:
      out.append((f"{e['label']} CLS ratio, first / second half", "%.2f / %.2f" % _halves(e["cls_ratio"])))
    out.append((f"{e['label']} spatial ratio, first / second half",
                "%.2f / %.2f" % _halves(e["spatial_ratio"])))
  return out


DECLARATION = declaration.Declaration(
    name="skip_ratio", build=SkipRatio, models=declaration.Models(any_names=True),
    needs=(("*", "residuals"),),
    defaults=DEFAULTS, layers="all", figures="Figs 7, E.1, E.2", key_numbers=key_numbers,
    findings=(
        declaration.Finding(
            "ViT skip connections carry much of the signal: the CLS token's norm ratio is high "
            "in the first half of the network and the spatial tokens' in the second half (here: "
            "CLS above spatial over the first half of the sublayers, spatial above CLS over the "
            "second).", _cls_then_spatial),
        declaration.Finding(
            "ViT ratios are far above a ResNet's (here: every token model's mean spatial ratio "
            "above every feature-map model's mean ratio).", _above_cnn)))

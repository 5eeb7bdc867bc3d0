"""Few-shot linear probes of every captured point (Figs 11, 13, D.4, F.1-F.3).

For each seed, `shots` examples per class are drawn from the training split
(less its last `holdout` examples); a closed-form probe (`vitcnn_jax.similarity.probe`) is
fitted to each point's features (`config.models.NAME.features`, e.g. the class
token, the token mean, every token alone). With `config.l2 = 0` the ridge
strength is chosen per probe and seed on the held-out examples from
`config.l2_sweep`, as the paper tuned on a held-out part of train; otherwise
that l2 is used (big_vision: 2**10). Accuracy on the test split, mean and
spread over seeds. Passes: a mean of the seed-0 shots (a shift that keeps the
float32 sums exact enough), the fit (sums, or the shots' rows where they are
fewer than the features), then held-out and test scoring for every l2 at once.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vitcnn_jax.models import representations
from vitcnn_jax.plotting import probes
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration
from vitcnn_jax.run import protocol
from vitcnn_jax.run import results
from vitcnn_jax.similarity import probe

DEFAULTS = {
    "batch_size": 256,  # per device (any size gives the same result)
    "seed": 0,
    "shots": 10,  # per class; 0: every training example (then seeds=1)
    "seeds": 3,  # draws of the shots; mean and spread over them
    "l2": 1024.0,  # ridge strength (big_vision: 2**10); 0: chosen per probe on held-out examples
    "l2_sweep": (),  # the l2 values tried when l2=0; (): 2**-10 .. 2**19, Google's usual list
    "holdout": 0,  # the last N training examples, which choose l2 (the paper: part of train)
    "test_examples": 0,  # the first N of the test split; 0: all
}


@dataclasses.dataclass
class Group:
  """One point of one model read one way: `tokens` probes of `dim` features each."""
  model: str
  point: str
  how: str
  tokens: int
  dim: int
  prefix: int  # class tokens first in the model's tokens
  final_grid: tuple[int, int] | None  # the model's last map grid (ResNets)
  grid: tuple[int, int] | None  # the token grid, where there is one
  rows: bool = False  # fit from the shots' rows (N < dim + 1), else from sums

  def features(self, act: jax.Array) -> jax.Array:
    return probe.features(act, self.how, self.prefix, self.final_grid)

  @property
  def key(self) -> str:
    return f"{self.model}/{self.point}/{self.how}"


class Pass(protocol.Pass):
  """A sweep of the probe: `kind` is "shift", "fit" or "score"."""
  labels = True

  def __init__(self, owner: "LinearProbe", kind: str, repeats: int):
    self.owner, self.kind, self.repeats = owner, kind, repeats
    self.points = owner.points

  def examples(self, repeat: int, sources) -> tuple[str, np.ndarray]:
    return self.owner.examples_of(self.kind, repeat, sources)

  def setup(self, done) -> None:
    self.constants = self.owner.constants_of(self.kind, done)

  def step(self, forward, labels, mask) -> dict:
    return self.owner.step_of(self.kind, forward, labels, mask)


class LinearProbe(protocol.Analysis):

  def __init__(self, config: ml_collections.ConfigDict, models: dict):
    if config.shots < 0 or config.seeds < 1:
      raise ValueError(f"config.shots={config.shots} must be >= 0 and config.seeds={config.seeds} >= 1.")
    if config.shots == 0 and config.seeds != 1:
      raise ValueError(f"config.shots=0 fits on every training example, so config.seeds="
                       f"{config.seeds} would repeat one fit; set config.seeds=1.")
    if config.l2 < 0 or config.holdout < 0 or config.test_examples < 0:
      raise ValueError("config.l2, config.holdout and config.test_examples must be >= 0.")
    if not config.l2 and not config.holdout:
      raise ValueError("config.l2=0 chooses l2 on held-out examples, but config.holdout=0; "
                       "hold some out (the paper: part of train) or fix config.l2 (big_vision: 1024).")
    self.config, self.models = config, models
    self.l2s = [config.l2] if config.l2 else [float(v) for v in config.l2_sweep or probe.L2_SWEEP]
    self.points = {k: m.names for k, m in models.items()}
    self.groups = [g for k, m in models.items() for g in self._groups(k, m)]
    self._shots: dict[int, np.ndarray] = {}
    self._pool_labels: np.ndarray | None = None

  def _groups(self, name: str, m) -> list[Group]:
    spec = self.config.models[name]
    hows = list(spec.get("features") or (("cls", "mean") if "cls" in m.model.prefix_tokens
                                         else ("mean",)))
    shapes = {k: v.shape for k, v in representations.point_shapes(m.model, m.params, m.names).items()}
    maps = [s[1:3] for s in shapes.values() if len(s) == 4]
    final_grid = tuple(min(maps)) if maps else None
    prefix = m.model.num_prefix_tokens
    out = []
    for point, shape in shapes.items():
      for how in hows:
        why = probe.check_features(how, shape, prefix, final_grid)
        if why:
          raise ValueError(f"config.models.{name}.features: {point} {tuple(shape)}: {why}.")
        grid = tuple(shape[1:3]) if len(shape) == 4 else m.model.grid
        g = Group(name, point, how, 0, 0, prefix, final_grid, grid and tuple(grid))
        g.tokens, g.dim = jax.eval_shape(g.features, jax.ShapeDtypeStruct(shape, jnp.float32)).shape[1:]
        out.append(g)
    return out

  def passes(self):
    return [Pass(self, "shift", 1), Pass(self, "fit", self.config.seeds),
            Pass(self, "score", 1 if self.config.l2 else 2)]

  def examples_of(self, kind: str, repeat: int, sources) -> tuple[str, np.ndarray]:
    data = sources["data"]
    if kind in ("shift", "fit"):
      return "data", self.shots(repeat, data)
    if kind == "score" and repeat == 0 and not self.config.l2:
      return "data", np.arange(len(data) - self.config.holdout, len(data))
    test = sources["test"]
    n = self.config.test_examples or len(test)
    if n > len(test):
      raise ValueError(f"config.test_examples={n}, but {test.name} has {len(test)}.")
    return "test", np.arange(n)

  def shots(self, seed: int, source) -> np.ndarray:
    if seed not in self._shots:
      pool = len(source) - self.config.holdout
      if pool < 1 or not source.num_classes:
        raise ValueError(f"{source.name} ({len(source)} examples, {source.num_classes} classes) "
                         f"leaves no labelled shots after config.holdout={self.config.holdout}.")
      if self._pool_labels is None and self.config.shots:  # read once for every seed
        self._pool_labels = source.labels(np.arange(pool))
      try:
        self._shots[seed] = (probe.few_shot(self._pool_labels, source.num_classes,
                                            self.config.shots, seed)
                             if self.config.shots else np.arange(pool))
      except ValueError as e:
        raise ValueError(f"config.shots={self.config.shots}: {source.name}: {e}") from e
      self.num_classes, n = source.num_classes, len(self._shots[seed])
      for g in self.groups:
        g.rows = n < g.dim + 1
    return self._shots[seed]

  def constants_of(self, kind: str, done) -> dict | None:
    """Before the fit: each group's shift; before scoring: the fitted probes, float32."""
    if kind == "shift":
      return None
    if kind == "fit":
      s = done[0][0]
      return {g.key: (s[g.key] / s["count"]).astype(np.float32) for g in self.groups if not g.rows}
    shift, fits = self.constants_of("fit", done[:1]), done[1]
    out = {}
    for g in self.groups:
      sols = [[self._fit(g, f, t, shift) for t in range(g.tokens)] for f in fits]
      out[g.key] = {k: np.asarray([[getattr(sol, k) for sol in per] for per in sols], np.float32)
                    for k in ("mean", "std", "lhs", "eigs", "rhs")}
    return out

  def _fit(self, g: Group, sums: dict, t: int, shift: dict) -> probe.Solution:
    if g.rows:
      return probe.fit_rows(sums[f"rows/{g.key}"][:, t], sums["rows/labels"], self.num_classes)
    m = probe.Moments(sums["count"], sums[f"{g.key}/total"][t], sums[f"{g.key}/gram"][t],
                      sums[f"{g.key}/class_totals"][t], sums["class_counts"])
    return probe.fit_moments(m, shift[g.key][t].astype(np.float64))

  def step_of(self, kind: str, forward, labels, mask) -> dict:
    outs = {k: forward(k) for k in self.points}
    feats = {g.key: g.features(outs[g.model][g.point]).astype(jnp.float32) for g in self.groups}
    hp = jax.lax.Precision.HIGHEST
    out = {"count": mask.sum()}
    onehot = jax.nn.one_hot(labels, getattr(self, "num_classes", 1)) * mask[:, None]
    for g in self.groups:
      f = feats[g.key]
      if kind == "shift":
        out[g.key] = jnp.einsum("b,btf->tf", mask, f, precision=hp)
      elif kind == "fit" and g.rows:
        out[f"rows/{g.key}"], out["rows/labels"] = f, labels
      elif kind == "fit":
        x = (f - forward.constants[g.key]) * mask[:, None, None]
        out[f"{g.key}/total"] = x.sum(axis=0)
        out[f"{g.key}/gram"] = jnp.einsum("btf,btg->tfg", x, x, precision=hp)
        out[f"{g.key}/class_totals"] = jnp.einsum("bc,btf->tcf", onehot, x, precision=hp)
        out["class_counts"] = onehot.sum(axis=0)
      else:
        sol = forward.constants[g.key]
        per_token = jax.vmap(lambda s, x: probe.predict(s, x, self.l2s), in_axes=(0, 1))
        pred = jax.vmap(per_token, in_axes=(0, None))(sol, f)  # (S, T, K, B)
        out[g.key] = jnp.einsum("stkb,b->stk", (pred == labels).astype(jnp.float32), mask)
    return out

  def finalize(self, sums):
    score = sums[2]
    arrays, summary = {}, {"analysis": "linear_probe", "shots": self.config.shots,
                           "seeds": self.config.seeds, "l2": self.l2s, "models": {}}
    for g in self.groups:
      test = score[-1][g.key] / score[-1]["count"]  # (S, T, K)
      if len(score) == 2:  # chosen on held-out; ties go to the larger l2
        held = score[0][g.key] / score[0]["count"]
        k = held.shape[-1] - 1 - np.argmax(held[..., ::-1], axis=-1)
        arrays[f"holdout/{g.key}"], arrays[f"test_all_l2/{g.key}"] = held, test
      else:
        k = np.zeros(test.shape[:2], int)
      acc = np.take_along_axis(test, k[..., None], axis=-1)[..., 0]  # (S, T)
      arrays[f"accuracy/{g.key}"], arrays[f"l2/{g.key}"] = acc, np.asarray(self.l2s)[k]
      spatial = acc[:, g.prefix:] if g.how == "each" else acc
      entry = summary["models"].setdefault(g.model, {}).setdefault(g.how, {
          "points": [], "accuracy": [], "std_over_seeds": []})
      entry["points"].append(g.point)
      entry["accuracy"].append(float(spatial.mean()))
      entry["std_over_seeds"].append(float(spatial.mean(axis=1).std()))
    summary["test_examples"] = int(score[-1]["count"])
    # `each` rows of accuracy/ arrays start with these tokens; the json's `each` means skip them.
    summary["prefix_tokens"] = {k: list(m.model.prefix_tokens)
                                for k, m in self.models.items()}
    return arrays, summary

  def plot(self, arrays, summary, workdir: str, figures: style.Figures) -> list:
    labels = {k: m.label for k, m in self.models.items()}
    shots = f"{self.config.shots}-shot" if self.config.shots else "Full-data"
    over = _over(self.config.seeds, self.config.shots)
    band = self.config.seeds > 1
    title = (f"{shots} linear probes, {summary['test_examples']} test images\n"
             f"{over}{' (band: +-1 sd)' if band else ''}")
    out = [probes.by_depth(summary["models"], labels, title, results.workdir_path(workdir, "linear_probe.png"),
                           figures, band)]
    for name, m in self.models.items():
      each = [g for g in self.groups if g.model == name and g.how == "each"]
      if each:
        out.append(probes.by_token([(g.point, arrays[f"accuracy/{g.key}"].mean(axis=0), g.grid)
                                    for g in each], each[0].prefix,
                                   f"{m.label}: a probe per token, {title.splitlines()[0]}, {over}",
                                   results.workdir_path(workdir, f"linear_probe_tokens_{name}.png"), figures))
    return out


def _over(seeds: int, shots: int) -> str:
  """What the plotted accuracy is: a mean over draws of the shots, or one fit
  (a spread over one seed would say nothing)."""
  if seeds > 1:
    return f"mean over {seeds} seeds"
  return "one draw of the shots" if shots else "one fit on every training example"


# Every probe at least this accurate: they have nothing to rank, and a finding about
# them says nothing.
SATURATED = 0.99
CLASSES_HINT = ("give the probes classes to separate (photographs in class sub-folders: "
                "--config.data.path=DIR)")


def _uninformative(s: dict) -> declaration.Verdict:
  """(None, why) where the probes' labels are no classes (crops labelled by their
  photograph) or every probe of the run is saturated, else None."""
  labels = {d.get("labels") for d in s.get("data", {}).values()} - {"classes"}
  if labels:
    return None, (f"the labels are the {', '.join(sorted(labels))} the images come from, not classes: "
                  f"telling them apart says little about class information; {CLASSES_HINT}")
  accuracy = [np.ravel(np.asarray(v["accuracy"], np.float64)) for hows in s["models"].values()
              for v in hows.values()]
  least = min((float(np.nanmin(a)) for a in accuracy if a.size), default=0.0)
  if least < SATURATED:
    return None
  return None, f"every probe at {100 * least:.1f}% or more: saturated, nothing to rank; {CLASSES_HINT}"


def _rises(s: dict) -> declaration.Verdict | declaration.Variants:
  """Every model's probe on its last point beats its probe on its first (and, as
  a variant, on its highest quarter of points against its lowest)."""
  if uninformative := _uninformative(s):
    return uninformative
  return declaration.each("ends", ("first and last", "quarters"), lambda reading: _risen(s, reading))


def _risen(s: dict, reading: str) -> declaration.Verdict:
  lines = {f"{k} {how}": v["accuracy"] for k, hows in s["models"].items() for how, v in hows.items()
           if how != "each" and len(v["accuracy"]) > 1}
  if not lines:
    return None
  got = {k: declaration.ends(v, reading) for k, v in lines.items()}
  return (all(high > low for low, high in got.values()),
          ", ".join(f"{k}: {100 * low:.1f} -> {100 * high:.1f}%" for k, (low, high) in got.items()))


def _cls_spatial(s: dict) -> declaration.Verdict | declaration.Variants:
  """A model read as `each` token with a class token: its spatial tokens' mean at the
  last point is below its class token's probe there (and, as a variant, over
  its highest quarter of points)."""
  found = {k: hows for k, hows in s["models"].items() if "each" in hows and "cls" in hows}
  if not found:
    return None
  if uninformative := _uninformative(s):
    return uninformative

  def check(reading: str) -> declaration.Verdict:
    pairs = {k: (declaration.ends(h["each"]["accuracy"], reading)[1],
                 declaration.ends(h["cls"]["accuracy"], reading)[1]) for k, h in found.items()}
    return (all(e < c for e, c in pairs.values()),
            ", ".join(f"{k}: spatial tokens {100 * e:.1f}% vs CLS {100 * c:.1f}%"
                      for k, (e, c) in pairs.items()))
  return declaration.each("ends", ("first and last", "quarters"), check)


def key_numbers(s: dict) -> list[tuple[str, str]]:
  return [(f"{k} {how}: first / last point (%)",
           f"{100 * v['accuracy'][0]:.1f} / {100 * v['accuracy'][-1]:.1f}")
          for k, hows in s["models"].items() for how, v in hows.items()]


DECLARATION = declaration.Declaration(
    name="linear_probe", build=LinearProbe, models=declaration.Models(any_names=True),
    defaults=DEFAULTS, layers="blocks", figures="Figs 11, 13, D.4, F.1-F.3", test_split=True,
    model_fields=("features",), key_numbers=key_numbers,
    findings=(
        declaration.Finding(
            "With a CLS token, spatial tokens of the last blocks hold little class information "
            "(the CLS token gathers it; with GAP every token does). Here: a model probed per "
            "token ('each') and on its CLS token scores lower on its spatial tokens at the last "
            "point.", _cls_spatial),
        declaration.Finding(
            "Layer-wise probes rise with depth (here: every model's probe on its last point "
            "beats its probe on its first).", _rises)))

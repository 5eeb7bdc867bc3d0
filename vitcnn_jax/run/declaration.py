"""How an analysis declares itself (no jax here: configs read declarations too).

Each module of `vitcnn_jax/analyses/` ends with `DECLARATION = Declaration(...)`:
the models it reads, whether its steps are HSIC minibatches, its config fields
and their defaults (`DEFAULTS`, a literal, so that configs read it without
importing the analysis: `defaults(name)`), the paper's figures and findings in
our words with a check of each on the run's own summary, and its key numbers.
`main.py`, the notebook API, the configs and the report read nothing else.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from typing import Any, Callable, Sequence

# A finding's verdict on one run: (shown?, the numbers that decide it), or None
# where the finding does not apply to the run (e.g. no ResNet among its models);
# shown None: the run cannot tell (e.g. every probe at 100%), the numbers say why.
Verdict = tuple[bool | None, str] | None
# A finding's verdict under each alternative of the choices it could rest on, keyed
# "choice=option, choice=option" (e.g. "cls=drop, blocks=two lowest and highest"),
# the run's own options first.
Variants = dict[str, Verdict]


# How a finding about "lower" and "higher" layers reads a sequence by depth: its two
# ends, or the means of its lowest and highest part.
ENDS = {"first and last": 0, "quarters": 4, "thirds": 3}


def ends(values: Sequence[float], reading: str) -> tuple[float, float]:
  """(low, high) of `values` (by depth) as `reading` (`ENDS`) reads them."""
  v = [float(x) for x in values]
  part = max(1, len(v) // ENDS[reading]) if ENDS[reading] else 1
  return sum(v[:part]) / part, sum(v[-part:]) / part


def each(choice: str, options: Sequence[str], check: Callable[[str], Verdict]) -> Verdict | Variants:
  """`check` under each option of one `choice` (the first the finding's own
  reading): variants keyed "choice=option" (an option that reads the same
  values as an earlier one, as on a short sequence, left out), or the one verdict."""
  out: Variants = {}
  for o in options:
    got = check(o)
    if got not in out.values():
      out[f"{choice}={o}"] = got
  return out if len(out) > 1 else next(iter(out.values()))


@dataclasses.dataclass(frozen=True)
class Judgement:
  """A finding's verdict over its variants: `status` "shown" (under every variant
  that applies), "not shown" (under none), "depends on C" (C: the choices whose
  options split it) or "uninformative"; `numbers`, the run's own variant's;
  `variants`, each (key, status, numbers)."""
  status: str
  numbers: str
  variants: tuple[tuple[str, str, str], ...] = ()

  @property
  def shown(self) -> bool | None:
    return {"shown": True, "not shown": False}.get(self.status)


def _status(shown: bool | None) -> str:
  return "uninformative" if shown is None else "shown" if shown else "not shown"


def _choices(key: str) -> dict[str, str]:
  return dict(part.split("=", 1) for part in key.split(", "))


def judge(result: Verdict | Variants) -> Judgement | None:
  """One finding's `Judgement` from its check's result (None where no variant applies)."""
  if not isinstance(result, dict):
    return None if result is None else Judgement(_status(result[0]), result[1])
  applies = {k: v for k, v in result.items() if v is not None}
  if not applies:
    return None
  own = next(iter(applies.values()))
  variants = tuple((k, _status(v[0]), v[1]) for k, v in applies.items())
  outcomes = {v[0] for v in applies.values()}
  if len(outcomes) == 1:
    return Judgement(_status(own[0]), own[1], variants)
  # A choice splits the verdict where two variants that differ in it alone disagree.
  parsed = {k: _choices(k) for k in applies}
  split = [c for c in _choices(next(iter(applies)))
           if any(parsed[a].get(c) != parsed[b].get(c) and applies[a][0] != applies[b][0]
                  and all(parsed[a][o] == parsed[b].get(o) for o in parsed[a] if o != c)
                  for a in applies for b in applies)]
  return Judgement(f"depends on {' and '.join(split) or 'the combination of choices'}", own[1], variants)


@dataclasses.dataclass(frozen=True)
class Models:
  """The names in `config.models` an analysis reads: `required` ones, `optional`
  ones, at least one of `one_of`; or any names (`any_names`), `count` of them if set."""
  required: tuple[str, ...] = ()
  optional: tuple[str, ...] = ()
  one_of: tuple[str, ...] = ()
  any_names: bool = False
  count: int | None = None

  def describe(self) -> str:
    if self.any_names:
      return f"{self.count or 'any number of'} model{'s' if self.count != 1 else ''} under any names"
    return ", ".join([*self.required, *(f"{n} (optional)" for n in self.optional)])

  def check(self, names: Sequence[str], hint: str = "") -> None:
    """Raises a ValueError naming what is missing, extra or too many."""
    wanted = self.describe()
    if not names:
      raise ValueError(f"config.models is empty; give it the models to analyse ({wanted}){hint}")
    if self.any_names:
      if self.count is not None and len(names) != self.count:
        raise ValueError(f"config.models has {list(names)}; this analysis reads {wanted}.")
      return
    missing = [n for n in self.required if n not in names]
    extra = [n for n in names if n not in (*self.required, *self.optional)]
    if missing or extra:
      raise ValueError(f"config.models has {list(names)}; this analysis reads {wanted}"
                       f"{f', so {missing} is missing' if missing else ''}"
                       f"{f', so {extra} would be ignored: remove or rename it' if extra else ''}.")
    if self.one_of and not set(self.one_of) & set(names):
      raise ValueError(f"config.models has {list(names)}; this analysis reads {wanted}, and at "
                       f"least one of {list(self.one_of)}.")


def above(high: dict[str, float], low: dict[str, float], unit: str = "") -> Verdict:
  """Whether every value of `high` is above every value of `low`, with the numbers
  (None where either is empty: nothing to compare)."""
  if not high or not low:
    return None
  return (min(high.values()) > max(low.values()),
          ", ".join(f"{k} {v:.{1 if unit else 3}f}{unit}" for k, v in {**high, **low}.items()))


@dataclasses.dataclass(frozen=True)
class Finding:
  """A finding of the paper (our words) and its check on a run's summary: one
  verdict, or one per variant of the choices the verdict could rest on."""
  text: str
  check: Callable[[dict], Verdict | Variants]


@dataclasses.dataclass(frozen=True)
class Declaration:
  """Everything the rest of the package knows about one analysis."""
  name: str  # config.analysis, and the stem of its files (NAME.npz, NAME.json)
  build: Callable[..., Any]  # (config, models) -> protocol.Analysis
  models: Models
  defaults: dict[str, Any]  # its config fields (the module's DEFAULTS)
  figures: str  # the paper's figures it reproduces, e.g. "Figs 3, 4, C.5, C.6"
  findings: tuple[Finding, ...]
  key_numbers: Callable[[dict], list[tuple[str, str]]]  # from its own summary
  layers: str | tuple[str, ...] = "paper"  # default capture (a preset or patterns)
  hsic_minibatches: bool = False  # steps are HSIC minibatches: sizes checked first
  test_split: bool = False  # also reads config.data.test_split (as source "test")
  model_fields: tuple[str, ...] = ()  # per-model config fields it reads (config.models.NAME.X)
  hint: str = ""  # appended to messages about missing models
  # (model name or "*", capability of models/anatomy.require): checked at load, so that a
  # model without it is refused by name before anything else is asked of it
  needs: tuple[tuple[str, str], ...] = ()
  # Its models' passes are kept and compared pair by pair (`run/many.py`), not run fused.
  kept: bool = False

  def verdicts(self, summary: dict) -> list[tuple[Finding, Judgement | None]]:
    """Each finding with its judgement on `summary` (None where it does not apply
    or the summary lacks what the check reads)."""
    out = []
    for f in self.findings:
      try:
        out.append((f, judge(f.check(summary))))
      except (KeyError, ValueError, TypeError, IndexError):
        out.append((f, None))
    return out


ANALYSES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analyses")


def names() -> list[str]:
  """Every analysis: the modules of `analyses/` that end with a DECLARATION."""
  return sorted(f[:-3] for f in os.listdir(ANALYSES_DIR)
                if f.endswith(".py") and not f.startswith("_")
                and "\nDECLARATION = " in _source(f[:-3]))


def _source(name: str) -> str:
  path = os.path.join(ANALYSES_DIR, f"{name}.py")
  if not os.path.exists(path):
    raise ValueError(f"config.analysis={name!r} is not an analysis; they are {names()}.")
  with open(path) as f:
    return f.read()


def defaults(name: str) -> dict[str, Any]:
  """The `DEFAULTS` of analysis `name`, read from its source without importing it
  (it imports jax; a config should not have to), over those of the analysis its
  `BASE` literal names, if any (an analysis that extends another's fields)."""
  own, base = None, {}
  for node in ast.parse(_source(name)).body:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
      target = getattr(node.targets[0], "id", None)
      if target == "DEFAULTS":
        own = ast.literal_eval(node.value)
      elif target == "BASE":
        base = defaults(ast.literal_eval(node.value))
  if own is None:
    raise ValueError(f"vitcnn_jax/analyses/{name}.py has no DEFAULTS literal.")
  return {**base, **own}

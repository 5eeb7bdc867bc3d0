"""The package's shape, read from its source: no import cycle, no use of another
module's private names, configs without jax, a short driver, short functions,
analyses asking models for capabilities rather than their family."""

from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "vitcnn_jax")


def _modules() -> dict[str, str]:
  """{dotted module name: path} of the package, the configs, main.py and the benchmarks."""
  out = {"main": os.path.join(ROOT, "main.py")}
  for top in ("vitcnn_jax", "configs", "benchmarks"):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
      for f in files:
        if f.endswith(".py"):
          rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
          out[rel.removesuffix(".__init__")] = os.path.join(d, f)
  return out


MODULES = _modules()


def _tree(name: str) -> ast.Module:
  with open(MODULES[name]) as f:
    return ast.parse(f.read())


def _imports(name: str) -> dict[str, str]:
  """{local alias: module} of every import of our modules in `name`, at any depth
  (an import inside a function hides a cycle, it does not remove it), including
  importlib.import_module of a literal name. `from pkg import mod` is `pkg.mod`."""
  out = {}
  for node in ast.walk(_tree(name)):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name in MODULES:
          out[a.asname or a.name] = a.name
    elif isinstance(node, ast.ImportFrom) and node.module in MODULES:
      for a in node.names:
        sub = f"{node.module}.{a.name}"
        out[a.asname or a.name] = sub if sub in MODULES else node.module
    elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
          and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in MODULES):
      out[f"<importlib {node.args[0].value}>"] = node.args[0].value
  return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan), or a self-import."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1 or v in graph.get(v, ()):
        out.append(sorted(comp))

  for v in graph:
    if v not in index:
      visit(v)
  return out


def test_no_import_cycle():
  graph = {m: set(_imports(m).values()) for m in MODULES}
  assert graph["vitcnn_jax.models.loader"] >= {"vitcnn_jax.models.formats.arrays", "vitcnn_jax.models"}  # sanity
  assert graph["benchmarks.accelerator"] >= {"benchmarks.clocks", "benchmarks.parts"}  # the benchmarks too
  assert not _cycles(graph)
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_calls_another_modules_private_names():
  found = []
  for m in MODULES:
    aliases = _imports(m)
    for node in ast.walk(_tree(m)):
      if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
          and isinstance(node.value, ast.Name) and node.value.id in aliases):
        found.append(f"{m}: {node.value.id}.{node.attr}")
      if isinstance(node, ast.ImportFrom) and node.module in MODULES:
        found += [f"{m}: from {node.module} import {a.name}" for a in node.names
                  if a.name.startswith("_") and not a.name.startswith("__")]
  assert not found


def test_configs_import_no_jax():
  """Every config, each of its report variants too, in a fresh interpreter."""
  code = ("import sys; from configs import report; report.get_config('demo'); "
          "report.get_config('paper'); import configs.train, configs.inspect; "
          "configs.train.get_config(); configs.inspect.get_config(); "
          "print(sorted({m.split('.')[0] for m in sys.modules} & "
          "{'jax', 'jaxlib', 'flax', 'optax', 'matplotlib', 'tensorflow'}))")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "[]", r.stdout


def test_the_driver_is_short_and_no_function_or_module_is_long():
  """A module of the package does one job in at most 450 lines, a function in 60."""
  with open(MODULES["vitcnn_jax.run.driver"]) as f:
    assert len(f.read().splitlines()) < 250
  long = [f"{m}.{n.name} ({n.end_lineno - n.lineno + 1} lines)" for m in MODULES for n in ast.walk(_tree(m))
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
  assert not long
  sizes = {m: len(open(path).read().splitlines()) for m, path in MODULES.items() if m.startswith("vitcnn_jax")}
  assert not {m: n for m, n in sizes.items() if n > 450}


def test_no_comment_silences_a_tool_that_does_not_run():
  """ruff is the one linter (`make test`): its noqa comments are checked by ruff
  itself (RUF100); a pylint comment anywhere is noise no tool reads."""
  tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
  found = [f"{path}:{i}" for path in tracked
           for i, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines(), 1)
           if re.search(r"#.*\bpylint:", line)]
  assert not found


FAMILY_TEST = re.compile(r"family\s*(==|!=)|(==|!=)\s*\S*family\b|\.family\s+(not\s+)?in\b|\[[^\]\n]*\.family\]"
                         r"|\.get\([^)\n]*\.family")


def test_no_family_test_outside_the_models():
  """Analyses, loading, the driver and the rest ask a model what it has (its
  anatomy), never which family it is."""
  found = [f"{m}:{i}: {line.strip()}" for m, path in MODULES.items()
           if not m.startswith("vitcnn_jax.models")
           for i, line in enumerate(open(path).read().splitlines(), 1) if FAMILY_TEST.search(line)]
  assert not found
  assert FAMILY_TEST.search('if m.model.family == "vit":') and FAMILY_TEST.search("X[model.family]")


def test_every_family_reads_its_own_parameters_through_layers_param():
  """A family module's `self.param(...)` would bring back flax's initializer
  trace for every parameter at every apply (`models.layers.param`)."""
  found = [f"{m}:{node.lineno}" for m, path in MODULES.items() if m.startswith("vitcnn_jax.models.")
           for node in ast.walk(_tree(m))
           if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "param"
           and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"]
  assert not found
  uses = [m for m in MODULES if m.startswith("vitcnn_jax.models.") and "layers.param(self" in open(MODULES[m]).read()]
  assert len(uses) >= 5, uses  # BiT, ResNet, ViT, Swin, ConvNeXt


ANALYSIS_MODULES = sorted(n.split(".")[-1] for n in MODULES if n.startswith("vitcnn_jax.analyses."))


def _declared() -> list[str]:
  from vitcnn_jax.run import declaration
  return declaration.names()


@pytest.mark.parametrize("name", _declared())
def test_every_analysis_declares_itself(name):
  from vitcnn_jax import analyses
  from vitcnn_jax.run import declaration
  declared = analyses.get(name)
  assert declared.name == name
  assert declaration.defaults(name) == declared.defaults  # what configs read is what it uses
  assert declared.findings and declared.figures and callable(declared.key_numbers)


def test_every_other_module_of_the_analyses_serves_one_by_name():
  """A module of analyses/ without a DECLARATION is a part of one analysis (its
  findings, say), named for it (`cka_findings` of `cka`), and imported by it: never
  an analysis that forgot to declare itself."""
  declared = _declared()
  parts = [m for m in ANALYSIS_MODULES if m not in declared]
  orphans = [m for m in parts if not any(m.startswith(f"{a}_") and f"vitcnn_jax.analyses.{m}" in
                                         _imports(f"vitcnn_jax.analyses.{a}").values() for a in declared)]
  assert not orphans
  assert set(declared) <= set(ANALYSIS_MODULES) and "cka_findings" in parts


# The README's architecture table: what each folder (or top-level module) may import
# beside itself, a name allowing all below it. Modules not named here (jobs, api, report,
# main) sit on top and may import anything.
FAMILIES = tuple(f"vitcnn_jax.models.{d}" for d in sorted(os.listdir(
    os.path.join(ROOT, "vitcnn_jax", "models"))) if os.path.isfile(
        os.path.join(ROOT, "vitcnn_jax", "models", d, "__init__.py")) and d != "formats")
MODEL_PARTS = ("vitcnn_jax.models.anatomy", "vitcnn_jax.models.capturing",
               "vitcnn_jax.models.representations", "vitcnn_jax.models.sizes")  # what a model is to analyses
NO_JAX = ("vitcnn_jax.run.declaration", "vitcnn_jax.run.control", "vitcnn_jax.inputs.zoo",
          "vitcnn_jax.inputs.data", "vitcnn_jax.inputs.datasets", "vitcnn_jax.inputs.packaged",
          "vitcnn_jax.fileio",
          "=vitcnn_jax.similarity")  # "=": that package alone (its MIN_BATCH), not below it
ALLOWED = {
    "vitcnn_jax.fileio": (),
    "vitcnn_jax.similarity": (),
    "vitcnn_jax.inputs": ("vitcnn_jax.fileio",),
    "vitcnn_jax.plotting": ("vitcnn_jax.fileio",),
    "vitcnn_jax.models": ("vitcnn_jax.fileio", "vitcnn_jax.inputs.preprocess"),
    "vitcnn_jax.checkpoints": ("vitcnn_jax.fileio", "vitcnn_jax.inputs", "vitcnn_jax.models"),
    "vitcnn_jax.run": ("vitcnn_jax.fileio", "vitcnn_jax.inputs", "vitcnn_jax.similarity",
                       "vitcnn_jax.checkpoints", "vitcnn_jax.plotting", "vitcnn_jax.models.formats",
                       *MODEL_PARTS),
    "vitcnn_jax.analyses": ("vitcnn_jax.run.declaration", "vitcnn_jax.run.protocol",
                            "vitcnn_jax.run.results", "vitcnn_jax.run.accuracy", "vitcnn_jax.inputs.data",
                            "vitcnn_jax.similarity", "vitcnn_jax.plotting", *MODEL_PARTS),
    "vitcnn_jax.train": ("vitcnn_jax.fileio", "vitcnn_jax.inputs", "vitcnn_jax.models",
                         "vitcnn_jax.checkpoints", "vitcnn_jax.run"),
    "vitcnn_jax.demos": ("vitcnn_jax.fileio", "vitcnn_jax.inputs", "vitcnn_jax.run", "vitcnn_jax.train"),
    "vitcnn_jax.describe": ("vitcnn_jax.inputs", "vitcnn_jax.models", "vitcnn_jax.checkpoints",
                            "vitcnn_jax.run"),
    "configs": ("configs", *NO_JAX),
    "benchmarks": ("vitcnn_jax", "configs"),  # readme_numbers reads the report's sections
}
# Within models/: the formats know no family, and no family reads through another's readers.
# Nothing but the tests imports the benchmarks.
FORBIDDEN = {
    "vitcnn_jax.models.formats": ("vitcnn_jax.models", "vitcnn_jax.models.loader", *FAMILIES),
    **{f: (*(g for g in FAMILIES if g != f), "vitcnn_jax.models.loader") for f in FAMILIES},
    **{top: ("benchmarks",) for top in ("vitcnn_jax", "configs", "main")},
}


def _within(name: str, scope: str) -> bool:
  return name == scope or name.startswith(scope + ".")


def _forbidden(module: str, dep: str) -> bool:
  """Allowed: a name or anything below it ("=name": that module alone). Banned within
  models/: `vitcnn_jax.models` alone (the registry of families), not its sub-modules."""
  for scope, allowed in ALLOWED.items():
    if _within(module, scope) and not _within(dep, scope) and not any(
        dep == a[1:] if a.startswith("=") else _within(dep, a) for a in allowed):
      return True
  return any(_within(module, scope) and any(dep == b or (_within(dep, b) and b != "vitcnn_jax.models")
                                            for b in banned) for scope, banned in FORBIDDEN.items())


def test_imports_follow_the_layers():
  bad = [f"{m} -> {d}" for m in MODULES for d in set(_imports(m).values()) if _forbidden(m, d)]
  assert not bad
  assert _forbidden("vitcnn_jax.analyses.cka", "vitcnn_jax.models.vit.google")
  assert _forbidden("vitcnn_jax.models.vit.transformers", "vitcnn_jax.models.resnet.timm")
  assert _forbidden("vitcnn_jax.models.formats.base", "vitcnn_jax.models.vit.model")
  assert not _forbidden("vitcnn_jax.models.vit.transformers", "vitcnn_jax.models.formats.base")
  assert _forbidden("vitcnn_jax.analyses.cka", "vitcnn_jax.models")
  assert not _forbidden("vitcnn_jax.analyses.cka", "vitcnn_jax.models.anatomy")
  assert _forbidden("vitcnn_jax.run.driver", "vitcnn_jax.analyses.cka")
  assert _forbidden("vitcnn_jax.similarity.hsic", "vitcnn_jax.run.control")
  assert _forbidden("vitcnn_jax.run.loading", "vitcnn_jax.models.vit.google")
  assert _forbidden("configs.cka_vit_resnet", "vitcnn_jax.similarity.measures")
  assert not _forbidden("vitcnn_jax.jobs", "vitcnn_jax.analyses.cka")
  assert not _forbidden("benchmarks.ours", "vitcnn_jax.run.driver")
  assert not _forbidden("benchmarks.accelerator", "benchmarks.parts")
  assert _forbidden("vitcnn_jax.jobs", "benchmarks.clocks") and _forbidden("main", "benchmarks")


def test_no_reader_reads_through_another_reader():
  """Within a family, readers share pieces through its modules that are no reader
  (`model.py`, `vit/torch_pieces.py`, `vit/resize.py`), never through each other."""
  readers = {m for m in MODULES if m.startswith(FAMILIES) and any(
      isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "READER" for t in n.targets)
      for n in _tree(m).body)}
  found = [f"{m} -> {d}" for m in readers for d in set(_imports(m).values()) if d in readers]
  assert "vitcnn_jax.models.vit.timm" in readers and not found


# tests/ folders beside the package's own: the benchmarks, and the top-level modules by
# what they serve (interface: api, jobs, main.py, report; train: train, demos; project: the
# repository's shape, README and installs); support: helpers, no tests.
TEST_FOLDERS = ("benchmarks", "interface", "train", "project", "support")


def test_the_tests_are_laid_out_like_the_package():
  """A test's folder says what it tests: one folder per package folder, none at the top."""
  tests = os.path.join(ROOT, "tests")
  package = {d for d in os.listdir(PACKAGE) if os.path.isfile(os.path.join(PACKAGE, d, "__init__.py"))}
  folders = {d for d in os.listdir(tests) if os.path.isdir(os.path.join(tests, d)) and not d.startswith((".", "_"))}
  assert not glob.glob(os.path.join(tests, "test_*.py")) + glob.glob(os.path.join(tests, "support", "test_*.py"))
  assert package <= folders and folders <= package | set(TEST_FOLDERS), folders ^ package

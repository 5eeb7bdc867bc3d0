"""Every Python block of the README and of docs/ runs, in order, in one namespace: an import or
a call that goes stale fails here. Tiny stand-ins replace what needs a download
or minutes of training: a 224-px ViT file under the name the README loads, and
tiny random models in the demo cache, all run in a new one-device Python process."""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest

from conftest import ROOT, device_env
from support import forked
from support import upstream_files as uf
from vitcnn_jax import train
from vitcnn_jax.inputs import datasets
from vitcnn_jax.inputs import zoo

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _text(page: str) -> str:
  with open(os.path.join(ROOT, page)) as f:
    return f.read()


# The README, then the pages of docs/ in the order its table lists them.
PAGES = ["README.md"] + re.findall(r"^\| \[(docs/\w+\.md)\]", _text("README.md"), re.M)


def test_the_readme_is_short_and_lists_every_page_of_docs():
  assert len(_text("README.md").splitlines()) <= 300
  assert sorted(PAGES[1:]) == sorted(f"docs/{f}" for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))


def _blocks() -> list[tuple[str, str]]:
  """(page and its block number, code) of every Python block, in reading order."""
  return [(f"{page} python block {i + 1}", code) for page in PAGES
          for i, code in enumerate(BLOCK.findall(_text(page)))]


def _demo_cache(home: str) -> None:
  """Tiny random models (upstream files, nothing to compile) where `demos.checkpoint`
  looks for the trained demo models."""
  files = {"vit_demo": uf.vt_vit(0, width=48, depth=1, heads=3, mlp=96, patch=8, num_classes=10),
           "bit_demo": uf.bt_bit(0, depth=(1, 1), num_classes=10)}
  for variant, arrays in files.items():
    path = train.cache_path(zoo.demo_training(variant), os.path.join(home, ".cache", "vitcnn_jax"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    uf.save(path, arrays)


# The README's Python blocks in order, in one namespace, as a user runs them: a new
# Python on one CPU device. Prints the block that fails.
RUN_BLOCKS = textwrap.dedent("""
    import json, sys
    namespace = {}
    for where, code in json.loads(sys.argv[1]):
      try:
        exec(compile(code, where, "exec"), namespace)
      except Exception:
        print(f"{where} fails:\\n{code}", file=sys.stderr)
        raise
    print("RESULT", json.dumps([bool(namespace["p"].names["vit"]), namespace["logits"].shape,
                                len(namespace["figures"]), namespace["r"].xy.shape]))
""")


def test_every_python_block_of_the_readme_and_docs_runs(tmp_path):
  if not os.path.isdir(datasets.FASHION_MNIST_DIR) and not os.environ.get("CI"):
    pytest.skip("Debian's dataset-fashion-mnist is not installed (make test installs it)")
  blocks = _blocks()
  assert len(blocks) >= 5, "the README's Python blocks were not found"
  _demo_cache(str(tmp_path / "home"))
  uf.save(tmp_path / "ViT-B_16-224.npz", uf.vt_vit(0, patch=16, grid=14))
  env = dict(device_env(1), HOME=str(tmp_path / "home"), PYTHONPATH=ROOT, MPLBACKEND="Agg")
  r = forked.start(["-c", RUN_BLOCKS, json.dumps(blocks)], env, str(tmp_path)).wait(600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.loads(r.stdout.split("RESULT ")[-1]) == [True, [2, 7], 3, [1, 1]], r.stdout[-2000:]


# --- the README's commands ------------------------------------------------------------


def _readme() -> str:
  """The README and every page of docs/, as one text."""
  return "\n".join(_text(page) for page in PAGES)


def _fields(config, prefix: str = "") -> set[str]:
  """Every dotted field path of a ConfigDict."""
  out = set()
  for k, v in config.items():
    out.add(prefix + k)
    if hasattr(v, "items"):
      out |= _fields(v, f"{prefix}{k}.")
  return out


def _known(path: str, fields: set[str]) -> bool:
  """A flag's field path is some config's field; an upper-case segment (NAME, FIELD) is a
  placeholder for any name."""
  pattern = re.compile(r"\.".join("[^.]+" if p.isupper() else re.escape(p) for p in path.split(".")))
  return any(pattern.fullmatch(f) for f in fields)


def test_every_config_variant_and_flag_the_readme_names_exists():
  """Each `configs/NAME.py:ARG` of the README parses, each `--config.FIELD` is a field
  of some config it names, each other flag of main.py and of a benchmark exists,
  each `make` target too: a renamed variant, field or flag fails here."""
  import importlib
  text = _readme()
  configs = {f[:-3] for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py")}
  used = set(re.findall(r"configs/(\w+)\.py(?::([\w,=.+/-]*\w))?", text))
  used |= {(n, a) for n, a in re.findall(r"\b(\w+)\.py:(\w+)", text) if n in configs}
  for name, listed in re.findall(r"configs/(\w+)\.py\[:([^\]]+)\]", text):  # the configs table
    used |= {(name, a) for a in re.split(r", | or ", listed)  # PAIR: a placeholder
             if re.fullmatch(r"\w+", a) and a.lower() == a}
  used = sorted(used)
  assert len(used) > 60, used
  fields: set[str] = set()
  for name, arg in used:
    module = importlib.import_module(f"configs.{name}")
    try:
      fields |= _fields(module.get_config(arg or None))
    except Exception as e:
      raise AssertionError(f"README names configs/{name}.py:{arg}, which does not parse") from e
  flags = sorted(set(re.findall(r"--config\.([\w.]+)", text)))
  assert flags and not [f for f in flags if not _known(f, fields)], flags
  with open(os.path.join(ROOT, "main.py")) as f:
    main_py = f.read()
  for line in re.findall(r"python main\.py[^`\n]*", text):
    for flag in re.findall(r"--(\w+)", line):
      assert flag == "config" or f'"{flag}"' in main_py, (flag, line)
  for path, module, rest in re.findall(r"(?:(?<![\w/])benchmarks/(\w+)\.py|-m benchmarks\.([a-z]\w*))([^`\n]*)",
                                      text):
    with open(os.path.join(ROOT, "benchmarks", f"{path or module}.py")) as f:
      source = f.read()
    for flag in re.findall(r"(?<![\w-])--(\w+)", re.split(r"benchmarks[/.]", rest)[0]):
      assert f'"--{flag}"' in source, (path or module, flag)
  with open(os.path.join(ROOT, "Makefile")) as f:
    targets = set(re.findall(r"^([\w-]+):", f.read(), re.M))
  for target in re.findall(r"`make (\w[\w-]*)", text):
    assert target in targets, target



def test_every_figure_and_page_the_readme_and_docs_link_is_in_the_repository():
  missing = []
  for page in PAGES:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _text(page)):  # figures and links to pages
      if "://" not in target and not os.path.exists(os.path.join(ROOT, os.path.dirname(page), target)):
        missing.append((page, target))
  assert missing == []


def test_the_measured_blocks_match_their_results_file():
  """`python -m benchmarks.readme_numbers check`: the README's marked numbers are what
  the committed results file gives."""
  import subprocess
  import sys
  r = subprocess.run([sys.executable, "-m", "benchmarks.readme_numbers", "check"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr
  assert len(re.findall(r"<!-- numbers:", _readme())) >= 4

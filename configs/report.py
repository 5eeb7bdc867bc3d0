r"""Every analysis of the paper, run (or reused) into one workdir, and one HTML page.

  python main.py --config=configs/report.py:demo --workdir=/tmp/report

writes WORKDIR/<section>/ (each analysis's own files) and WORKDIR/report.html:
per paper figure the figures, what the paper found, the key numbers of the
json, the checkpoints and the config. Sections already finished in the workdir
are reused, so a report can be re-made after adding a section.

Variants: `demo` (every `:demo` config, offline on Fashion-MNIST; the first run
trains the demo models, about 25 minutes on 2 CPU cores, later runs reuse them),
`paper` (each config's default, the paper's checkpoints and ImageNet; set
their data flags, e.g. --config.runs.cka.data.data_dir=DIR) or `real` (each
config's `:real` variant where it has one: a real pretrained DINOv2 ViT-S/14 and
ResNet-50-1by2 on crops of the offline photographs, after `make real`). Then
`only=cka+skip_ratio` keeps some sections. Sections are the configs that
declare `REPORT` (section -> demo variant, paper variant, order).
"""

import importlib
import os

import ml_collections

from configs import common

CONFIGS = os.path.dirname(os.path.abspath(__file__))


def sections(real: bool = False) -> dict[str, tuple[str, str, str, int]]:
  """Section -> (config file, its demo variant, its paper variant, order): every
  config that declares `REPORT`, in the order of the paper's figures; with `real`,
  those that also declare a variant on the real pretrained pair (`REAL`), which
  then stands as the paper variant."""
  found = []
  for f in sorted(os.listdir(CONFIGS)):
    if f.endswith(".py") and f not in ("__init__.py", "report.py"):
      module = importlib.import_module(f"configs.{f[:-3]}")
      on_real = getattr(module, "REAL", {})
      found += [(order, name, (f[:-3], demo, on_real.get(name, "") if real else paper, order))
                for name, (demo, paper, order) in getattr(module, "REPORT", {}).items()
                if not real or name in on_real]
  return {name: entry for _, name, entry in sorted(found)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = common.parse_arg(arg, variant="demo", only="")
  if arg.variant not in ("demo", "paper", "real"):
    raise ValueError(f"Unknown variant {arg.variant!r}; expected demo, paper or real.")
  known = sections(arg.variant == "real")
  only = [s for s in arg.only.split("+") if s]
  unknown = [s for s in only if s not in known]
  if unknown:
    raise ValueError(f"only={arg.only}: {unknown} are not sections; they are {list(known)}.")
  config = ml_collections.ConfigDict()
  config.analysis = "report"
  config.title = f"vitcnn_jax report ({arg.variant})"
  config.runs = ml_collections.ConfigDict()
  for name, (module, demo, paper, _) in known.items():
    if not only or name in only:
      config.runs[name] = importlib.import_module(f"configs.{module}").get_config(
          demo if arg.variant == "demo" else paper)
  config.order = tuple(n for n in known if n in config.runs)  # sections in the paper's order
  return config

r"""Every analysis of the paper, run (or reused) into one workdir, and one HTML page.

  python main.py --config=configs/report.py:demo --workdir=/tmp/report

writes WORKDIR/<section>/ (each analysis's own files) and WORKDIR/report.html:
per paper figure the figures, what the paper found, the key numbers of the
json, the checkpoints and the config. Sections already finished in the workdir
are reused, so a report can be re-made after adding a section.

Variants: `demo` (every `:demo` config, offline on Fashion-MNIST; the first run
trains the demo models, about 25 minutes on 2 CPU cores, later runs reuse them)
or `paper` (each config's default, the paper's checkpoints and ImageNet; set
their data flags, e.g. --config.runs.cka.data.data_dir=DIR). Then
`only=cka+skip_ratio` keeps some sections.
"""

import importlib

import ml_collections

from configs import common

# Section -> (config file, its demo variant, its paper variant).
SECTIONS = {
    "cka": ("cka_vit_resnet", "demo", "b16_r50"),
    "attention_distance": ("attention_distance", "demo", "l16"),
    "head_subsets": ("head_subsets", "demo", "l16_r50"),
    "receptive_field": ("receptive_field", "demo", "b32_r50"),
    "skip_ratio": ("skip_ratio", "demo", "b16_r50"),
    "skip_ablation": ("skip_ablation", "demo", "b32"),
    "localization": ("localization", "demo", "l16"),
    "linear_probe": ("linear_probe", "demo_tokens", "b32_tokens"),
    "layerwise_probe": ("linear_probe", "demo", "imagenet10"),
    "data_scale": ("data_scale", "demo", "b32"),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = common.parse_arg(arg, variant="demo", only="")
  if arg.variant not in ("demo", "paper"):
    raise ValueError(f"Unknown variant {arg.variant!r}; expected demo or paper.")
  only = [s for s in arg.only.split("+") if s]
  unknown = [s for s in only if s not in SECTIONS]
  if unknown:
    raise ValueError(f"only={arg.only}: {unknown} are not sections; they are {list(SECTIONS)}.")
  config = ml_collections.ConfigDict()
  config.analysis = "report"
  config.title = f"vitcnn_jax report ({arg.variant})"
  config.runs = ml_collections.ConfigDict()
  for name, (module, demo, paper) in SECTIONS.items():
    if not only or name in only:
      config.runs[name] = importlib.import_module(f"configs.{module}").get_config(
          demo if arg.variant == "demo" else paper)
  config.order = tuple(n for n in SECTIONS if n in config.runs)  # sections in the paper's order
  return config

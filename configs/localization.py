r"""Localization: CKA between each output token and each input patch (paper Figs 9, 10, D.1-D.3).

  python main.py --config=configs/localization.py --workdir=/tmp/loc \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants: `l16` (default; Fig 9 uses ViT-L/16, final block), `b32`, `r50`
(ResNet: every channel at one position of the last stage), `mixer_b16` (App. H),
`demo` (the demo ViT), `demo_gap` (the demo ViT trained with global average
pooling instead of a CLS token: Fig 10's comparison, run it beside `demo`),
`demo_mixer` (the demo MLP-Mixer); then `examples=`, `batch=`.
`--config.layer=` picks another point,
`--config.tokens=...` the tokens plotted (row-major, CLS excluded).
"""

import ml_collections

from configs import common

MODELS = {  # variant -> (checkpoint, label, config name); the layer: the last block's output
    "l16": ("ViT-L/16", "ViT-L/16", "vit"),
    "b32": ("ViT-B/32", "ViT-B/32", "vit"),
    "r50": ("BiT-R50x1", "BiT-R50x1", "resnet"),
    "mixer_b16": ("Mixer-B/16", "Mixer-B/16", "mixer"),
}
DEMOS = {"demo": "vit", "demo_gap": "vit_gap", "demo_mixer": "mixer"}  # -> demo model
REPORT = {"localization": ("demo", "l16", 9)}  # report section: demo and paper variants, order
REAL = {"localization": "real"}  # report section on the real pretrained pair


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.analysis("localization")
  arg = common.protocol_arg(arg, config, "l16")
  if arg.variant in DEMOS:
    common.demo_models(config, (DEMOS[arg.variant],), "all")
  elif arg.variant == "real":
    common.real_models(config, ("vit",), "all")
  elif arg.variant in MODELS:
    path, label, name = MODELS[arg.variant]
    overrides = {"resolution": 224} if arg.variant == "r50" else {}
    config.models = {name: common.model(path, "all", label, **overrides)}
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of "
                     f"{sorted(MODELS) + sorted(DEMOS) + ['real']}.")
  common.protocol(config, arg)
  return config

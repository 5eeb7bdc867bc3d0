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

from configs import cka_vit_resnet
from configs import common
from vitcnn_jax import zoo

MODELS = {
    "l16": (zoo.CHECKPOINTS["ViT-L/16"], "ViT-L/16", "block23/out"),
    "b32": (zoo.CHECKPOINTS["ViT-B/32"], "ViT-B/32", "block11/out"),
    "r50": (zoo.CHECKPOINTS["BiT-R50x1"], "BiT-R50x1", "block4/unit03/out"),
    "mixer_b16": (zoo.CHECKPOINTS["Mixer-B/16"], "Mixer-B/16", "block11/out"),
}
DEMOS = {"demo": "vit", "demo_gap": "vit_gap", "demo_mixer": "mixer"}  # -> demo model


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  demo = common.is_demo(arg)
  arg = common.parse_arg(arg, variant="l16", examples=2560 if demo else 10240,
                         batch=256 if demo else 1024)
  config = ml_collections.ConfigDict()
  config.analysis = "localization"
  if arg.variant in DEMOS:
    name = DEMOS[arg.variant]
    cka_vit_resnet.demo_models(config, (name,))
    config.models[name].capture = ("**",)
    config.layer = "block03/out"
  elif arg.variant in MODELS:
    path, label, layer = MODELS[arg.variant]
    overrides = {"resolution": 224} if arg.variant == "r50" else {}
    name = {"r50": "resnet", "mixer_b16": "mixer"}.get(arg.variant, "vit")
    config.models = {name: common.model(path, ["**"], label, **overrides)}
    config.data = common.imagenet_validation()
    config.cache_dir = ""
    config.layer = layer
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of {sorted(MODELS) + sorted(DEMOS)}.")
  config.num_examples = arg.examples
  config.batch_size = arg.batch  # per device (a CKA minibatch)
  config.seed = 0
  config.tokens = []  # default: one off-centre token and the centre token
  common.run_control(config)
  return config

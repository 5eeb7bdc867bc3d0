r"""Mean attention distance per layer and head (paper Figs 3, 4, C.5, C.6).

  python main.py --config=configs/attention_distance.py[:l16] --workdir=/tmp/attn \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants: `b16`, `b32`, `l16` (default; the paper's Fig 3 model family), `h14`,
`demo` (the offline demo ViT on Fashion-MNIST); then `examples=`, `batch=`.
"""

import ml_collections

from configs import common

VIT = {"b16": "ViT-B/16", "b32": "ViT-B/32", "l16": "ViT-L/16", "h14": "ViT-H/14"}  # names in zoo.ZOO
REPORT = {"attention_distance": ("demo", "l16", 3)}  # report section: demo and paper variants, order


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.analysis("attention_distance")
  arg = common.protocol_arg(arg, config, "l16")
  capture = "block*/attn/weights"
  if arg.variant == "demo":
    common.demo_models(config, ("vit",), capture)
  elif arg.variant in VIT:
    name = VIT[arg.variant]
    config.models = dict(vit=common.model(name, capture, name))
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of {sorted(VIT) + ['demo']}.")
  common.protocol(config, arg)
  return config

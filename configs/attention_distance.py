r"""Mean attention distance per layer and head (paper Figs 3, 4, C.5, C.6).

  python main.py --config=configs/attention_distance.py[:l16] --workdir=/tmp/attn \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants: `b16`, `b32`, `l16` (default; the paper's Fig 3 model family), `h14`,
`demo` (the offline demo ViT on Fashion-MNIST); `dino_vs_clip` (DINO-B/16 and
CLIP-B/16, self-distillation against image-text contrast, as Walmer et al. 2023
and Park et al. 2023 compare them), `vit_vs_swin` (ViT-B/16 against Swin-B, each
ImageNet-21k then ImageNet-1k: global attention against shifted 7x7 windows,
distances in image pixels with the windows' rolls undone), `demo_vs_gap` (the demo ViTs with CLS and with GAP,
offline); then `examples=`, `batch=`. With several models, each has its own
figure and `attention_distance_compare.png` shows them all.
"""

import ml_collections

from configs import common

VIT = {"b16": "ViT-B/16", "b32": "ViT-B/32", "l16": "ViT-L/16", "h14": "ViT-H/14"}  # names in zoo.ZOO
COMPARE = {"dino_vs_clip": {"dino": "DINO-B/16", "clip": "CLIP-B/16"},
           "vit_vs_swin": {"vit": "ViT-B/16 ImageNet", "windows": "Swin-B"}}  # name order: ViT first
REPORT = {"attention_distance": ("demo", "l16", 3)}  # report section: demo and paper variants, order
REAL = {"attention_distance": "real"}  # report section on the real pretrained pair


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.analysis("attention_distance")
  arg = common.protocol_arg(arg, config, "l16")
  capture = "attention"  # each family's preset: every block's attention weights
  if arg.variant == "demo":
    common.demo_models(config, ("vit",), capture)
  elif arg.variant == "demo_vs_gap":
    common.demo_models(config, ("vit", "vit_gap"), capture)
  elif arg.variant == "real":
    common.real_models(config, ("vit",), capture)
  elif arg.variant in VIT:
    name = VIT[arg.variant]
    config.models = dict(vit=common.model(name, capture, name))
    config.data = common.imagenet_validation()
  elif arg.variant in COMPARE:  # each at 224 px, with its zoo entry's preprocessing
    config.models = {k: common.model(v, capture, v) for k, v in COMPARE[arg.variant].items()}
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of "
                     f"{sorted(VIT) + sorted(COMPARE) + ['demo', 'demo_vs_gap', 'real']}.")
  common.protocol(config, arg)
  return config

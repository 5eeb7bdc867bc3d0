r"""CKA between subsets of first-block ViT heads and lower ResNet layers (paper Fig 5).

  python main.py --config=configs/head_subsets.py --workdir=/tmp/heads \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants: `l16_r50` (default; Fig 5 uses ViT-L/16 and R50), `h14_r152`, `demo`;
then `examples=`, `batch=`. The paper does not give the subset size or the tap
point; the defaults here are sliding windows of a quarter of the heads
(stride 1) and the per-head outputs before the output projection.
"""

import ml_collections

from configs import common

LOWER_RESNET = ["block1/unit01/out", "block1/unit02/out", "block1/unit03/out",
                "block2/unit01/out", "block2/unit02/out"]
PAIRS = {"l16_r50": ("ViT-L/16", "BiT-R50x1"), "h14_r152": ("ViT-H/14", "BiT-R152x2")}  # zoo names
REPORT = {"head_subsets": ("demo", "l16_r50", 5)}  # report section: demo and paper variants, order
REAL = {"head_subsets": "real"}  # report section on the real pretrained pair


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.analysis("head_subsets")  # subsets of a quarter of the heads, stride 1
  arg = common.protocol_arg(arg, config, "l16_r50")
  if arg.variant == "demo":
    common.demo_models(config)
    config.models.vit.capture = ("all",)
    config.models.resnet.capture = ("block1/unit01/out", "block2/unit01/out")
  elif arg.variant == "real":
    common.real_models(config, capture="all")
    config.models.resnet.capture = tuple(LOWER_RESNET)
  elif arg.variant in PAIRS:
    vit, res = PAIRS[arg.variant]
    config.models = dict(
        vit=common.model(vit, "all", vit),
        resnet=common.model(res, LOWER_RESNET, res, resolution=224))
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of {sorted(PAIRS) + ['demo', 'real']}.")
  common.protocol(config, arg)
  return config

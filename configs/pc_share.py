r"""Each layer's share of variance in its first principal component, beside the CKA maps.

  python main.py --config=configs/pc_share.py:demo --workdir=/tmp/pc_share

Variants (`:arg`, then `examples=`, `batch=`): `b16_r50` (default; ViT-B/16 and
BiT-R50x1 with the paper's layers, ImageNet validation, minibatches of 1,024 as
the CKA protocol), `demo` (the demo ViT and ResNet on Fashion-MNIST, minibatches
of 256). The share depends on the minibatch size: compare at one `batch`.
`--config.drop_fraction=0.05` (the demo's) adds the CKA maps with and without
each minibatch's 5% most dominant examples (`without_dominant_A_B.png`).
"""

import ml_collections

from configs import common

REPORT = {"pc_share": ("demo", "b16_r50", 2)}  # report section: demo and paper variants, order
REAL = {"pc_share": "real"}  # report section on the real pretrained pair


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.analysis("pc_share")
  arg = common.protocol_arg(arg, config, "b16_r50")
  if arg.variant == "demo":
    common.demo_models(config)
    config.drop_fraction = 0.05
  elif arg.variant == "real":
    common.real_models(config)
  elif arg.variant == "b16_r50":
    config.models = dict(
        vit=common.model("ViT-B/16", "paper", "ViT-B/16"),
        resnet=common.model("BiT-R50x1", "paper", "BiT-R50x1", resolution=224))
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected b16_r50, demo or real.")
  common.protocol(config, arg)
  return config

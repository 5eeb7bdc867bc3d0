r"""Inspect a checkpoint: inferred architecture and its representation points.

  python main.py --config=configs/inspect.py --workdir=/tmp/inspect \
      --config.checkpoint=gs://vit_models/imagenet21k/ViT-B_16.npz

`--config.checkpoint` also takes a zoo name (`DINOv2-B/14`, see vitcnn_jax/inputs/zoo.py)
or an hf-hub:ORG/REPO location.

`--config.capture='block00/**'` lists only the matching points. A tower of a
two-tower file: `--config.checkpoint=/path/siglip.npz:img`.
"""

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.analysis = "inspect"
  config.checkpoint = arg or ""
  config.capture = ""  # glob(s) over point names; empty = all
  config.overrides = common.overrides()  # e.g. --config.overrides.resolution=384
  config.policy = ""  # preprocessing shown; empty = its zoo entry's or its format's
  return config

r"""Mean attention distance per layer and head (paper Figs 3, 4, C.5, C.6).

  python main.py --config=configs/attention_distance.py[:l16] --workdir=/tmp/attn \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants: `b16`, `b32`, `l16` (default; the paper's Fig 3 model family), `h14`,
`demo` (the offline demo ViT on Fashion-MNIST); then `examples=`, `batch=`.
"""

import ml_collections

from configs import cka_vit_resnet
from configs import common
from vitcnn_jax import zoo

VIT = {"b16": "ViT-B/16", "b32": "ViT-B/32", "l16": "ViT-L/16", "h14": "ViT-H/14"}  # zoo.CHECKPOINTS


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  demo = common.is_demo(arg)
  arg = common.parse_arg(arg, variant="l16", examples=2560 if demo else 5000,
                         batch=256 if demo else 100)
  config = ml_collections.ConfigDict()
  config.analysis = "attention_distance"
  capture = ["block*/attn/weights"]
  if demo:
    cka_vit_resnet.demo_models(config, ("vit",))
    config.models.vit.capture = capture
  elif arg.variant in VIT:
    name = VIT[arg.variant]
    config.models = dict(vit=common.model(zoo.CHECKPOINTS[name], capture, name))
    config.data = common.imagenet_validation()
    config.cache_dir = ""
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of {sorted(VIT) + ['demo']}.")
  config.num_examples = arg.examples  # paper: 5,000 ImageNet validation images
  config.batch_size = arg.batch  # per device
  config.seed = 0
  config.cls = "drop"  # "drop" (authors' gist: no renormalisation) or "renormalize"
  config.plot_blocks = []  # blocks for the sorted-heads panel; default first two and last two
  common.run_control(config)
  return config

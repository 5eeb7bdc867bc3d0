r"""Effective receptive fields of every ViT and ResNet layer (paper Figs 6, C.1-C.4).

  python main.py --config=configs/receptive_field.py --workdir=/tmp/rf \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants: `b32_r50` (default; Fig 6 compares ViT-B/32 and ResNet-50), `mixer_b16`
(App. H: Mixer-B/16 too), `demo`, `demo_mixer` (the demo Mixer too);
then `examples=` (paper: 32), `batch=`. `--config.pre_residual=True` gives the
before-the-skip-connection maps of Fig C.4.
"""

import ml_collections

from configs import common

REPORT = {"receptive_field": ("demo", "b32_r50", 6)}  # report section: demo and paper variants, order
REAL = {"receptive_field": "real"}  # report section on the real pretrained pair


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.analysis("receptive_field")  # 32 images, as the paper
  arg = common.protocol_arg(arg, config, "b32_r50", demo_examples=config.num_examples,
                            demo_batch=config.batch_size, real_examples=config.num_examples)
  if arg.variant == "demo_mixer":
    common.demo_models(config, ("vit", "resnet", "mixer"), "all")
  elif arg.variant == "demo":
    common.demo_models(config, capture="all")
  elif arg.variant == "real":
    common.real_models(config, capture="all")
  elif arg.variant in ("b32_r50", "mixer_b16"):
    config.models = dict(
        vit=common.model("ViT-B/32 ImageNet", "all", "ViT-B/32", resolution=224),
        resnet=common.model("BiT-R50x1", "all", "BiT-R50x1", resolution=224))
    if arg.variant == "mixer_b16":
      config.models.mixer = common.model("Mixer-B/16", "all", "Mixer-B/16")
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected b32_r50, mixer_b16, demo, "
                     "demo_mixer or real.")
  common.protocol(config, arg)
  return config

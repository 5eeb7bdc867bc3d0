r"""Effective receptive fields of every ViT and ResNet layer (paper Figs 6, C.1-C.4).

  python main.py --config=configs/receptive_field.py --workdir=/tmp/rf \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants: `b32_r50` (default; Fig 6 compares ViT-B/32 and ResNet-50), `mixer_b16`
(App. H: Mixer-B/16 too), `demo`, `demo_mixer` (the demo Mixer too);
then `examples=` (paper: 32), `batch=`. `--config.pre_residual=True` gives the
before-the-skip-connection maps of Fig C.4.
"""

import ml_collections

from configs import cka_vit_resnet
from configs import common
from vitcnn_jax import zoo


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  demo = common.is_demo(arg)
  arg = common.parse_arg(arg, variant="b32_r50", examples=32, batch=8)
  config = ml_collections.ConfigDict()
  config.analysis = "receptive_field"
  if arg.variant == "demo_mixer":
    cka_vit_resnet.demo_models(config, ("vit", "resnet", "mixer"))
  elif demo:
    cka_vit_resnet.demo_models(config)
  elif arg.variant in ("b32_r50", "mixer_b16"):
    config.models = dict(
        vit=common.model(zoo.CHECKPOINTS["ViT-B/32 ImageNet"], ["**"],
                         "ViT-B/32", resolution=224),
        resnet=common.model(zoo.CHECKPOINTS["BiT-R50x1"], ["**"], "BiT-R50x1",
                            resolution=224))
    if arg.variant == "mixer_b16":
      config.models.mixer = common.model(zoo.CHECKPOINTS["Mixer-B/16"], ["**"],
                                         "Mixer-B/16")
    config.data = common.imagenet_validation()
    config.cache_dir = ""
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected b32_r50, mixer_b16, demo or "
                     "demo_mixer.")
  config.num_examples = arg.examples  # paper: 32 randomly selected images
  config.batch_size = arg.batch  # per device
  config.seed = 0
  config.pre_residual = False  # True: taps before the residual add (Fig C.4)
  common.run_control(config)
  return config

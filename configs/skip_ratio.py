r"""Skip-connection norm ratios ||z|| / ||f(z)|| for a ViT and a ResNet (paper Figs 7, E.1, E.2).

  python main.py --config=configs/skip_ratio.py --workdir=/tmp/skip \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants: `b16_r50` (default: ViT-B/16 fine-tuned on ImageNet, as in Fig 7, and
BiT-M-R50x1), `b32_r50` (Fig E.1 uses ViT-B/32), `mixer_b16` (App. H: Mixer-B/16
beside ViT-B/16 and BiT-M-R50x1), `demo`, `demo_mixer` (the demo Mixer too,
written to skip_ratio_mixer.png); then `examples=`, `batch=`.
"""

import ml_collections

from configs import cka_vit_resnet
from configs import common
from vitcnn_jax import zoo

PAIRS = {
    "b16_r50": (zoo.CHECKPOINTS["ViT-B/16 ImageNet"], "ViT-B/16"),
    "b32_r50": (zoo.CHECKPOINTS["ViT-B/32"], "ViT-B/32"),
}
MIXER_B16 = zoo.CHECKPOINTS["Mixer-B/16"]


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  demo = common.is_demo(arg)
  arg = common.parse_arg(arg, variant="b16_r50", examples=512 if demo else 2560, batch=128)
  config = ml_collections.ConfigDict()
  config.analysis = "skip_ratio"
  if arg.variant == "demo_mixer":
    cka_vit_resnet.demo_models(config, ("vit", "resnet", "mixer"))
  elif demo:
    cka_vit_resnet.demo_models(config)
  elif arg.variant == "mixer_b16":
    config.models = dict(
        vit=common.model(PAIRS["b16_r50"][0], ["**"], "ViT-B/16"),
        mixer=common.model(MIXER_B16, ["**"], "Mixer-B/16"),
        resnet=common.model(zoo.CHECKPOINTS["BiT-R50x1"], ["**"], "BiT-R50x1", resolution=224))
    config.data = common.imagenet_validation()
    config.cache_dir = ""
  elif arg.variant in PAIRS:
    path, label = PAIRS[arg.variant]
    config.models = dict(
        vit=common.model(path, ["**"], label),
        resnet=common.model(zoo.CHECKPOINTS["BiT-R50x1"], ["**"], "BiT-R50x1", resolution=224))
    config.data = common.imagenet_validation()
    config.cache_dir = ""
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of "
                     f"{sorted(PAIRS) + ['mixer_b16', 'demo', 'demo_mixer']}.")
  config.num_examples = arg.examples  # unspecified in the paper
  config.batch_size = arg.batch  # per device
  config.seed = 0
  config.plot_tokens = 9  # tokens shown in the heatmap (Fig 7 shows 0-8)
  common.run_control(config)
  return config

r"""Skip-connection norm ratios ||z|| / ||f(z)|| for a ViT and a ResNet (paper Figs 7, E.1, E.2).

  python main.py --config=configs/skip_ratio.py --workdir=/tmp/skip \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants: `b16_r50` (default: ViT-B/16 fine-tuned on ImageNet, as in Fig 7, and
BiT-M-R50x1), `b32_r50` (Fig E.1 uses ViT-B/32), `mixer_b16` (App. H: Mixer-B/16
beside ViT-B/16 and BiT-M-R50x1), `demo`, `demo_mixer` (the demo Mixer too,
written to skip_ratio_mixer.png); then `examples=`, `batch=`.
"""

import ml_collections

from configs import common

PAIRS = {
    "b16_r50": ("ViT-B/16 ImageNet", "ViT-B/16"),
    "b32_r50": ("ViT-B/32", "ViT-B/32"),
}
REPORT = {"skip_ratio": ("demo", "b16_r50", 7)}  # report section: demo and paper variants, order
REAL = {"skip_ratio": "real"}  # report section on the real pretrained pair


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.analysis("skip_ratio")
  arg = common.protocol_arg(arg, config, "b16_r50", demo_examples=512, demo_batch=config.batch_size,
                            real_examples=512)
  if arg.variant == "demo_mixer":
    common.demo_models(config, ("vit", "resnet", "mixer"), "all")
  elif arg.variant == "demo":
    common.demo_models(config, capture="all")
  elif arg.variant == "real":
    common.real_models(config, capture="all")
  elif arg.variant in ("mixer_b16", *PAIRS):
    path, label = PAIRS["b16_r50" if arg.variant == "mixer_b16" else arg.variant]
    config.models = dict(
        vit=common.model(path, "all", label),
        resnet=common.model("BiT-R50x1", "all", "BiT-R50x1", resolution=224))
    if arg.variant == "mixer_b16":
      config.models.mixer = common.model("Mixer-B/16", "all", "Mixer-B/16")
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of "
                     f"{sorted(PAIRS) + ['mixer_b16', 'demo', 'demo_mixer', 'real']}.")
  common.protocol(config, arg)
  return config

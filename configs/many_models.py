r"""Any number of models compared pair by pair, each model's pass run once and kept.

  python main.py --config=configs/many_models.py:demo --workdir=/tmp/models

Variants (`:arg`, comma-separated): `demo` (offline, 10 models: the real pair of
`make real`, the four demo models, and seeded untrained initialisations of the
demo ViT and BiT at two widths each, on the offline photo crops), `paper` (the
paper's public checkpoints: ViT-B/32, B/16, L/16, H/14 and BiT-R50x1, R152x2, on
ImageNet's validation split; what is missing is listed before anything runs),
`prh` (the demo's models under the Platonic Representation Hypothesis'
protocol: one minibatch of 1,024 examples, mutual k-NN with k = 10, the last
representation of each model, no layer search); then `examples=`, `batch=`,
`repeats=`, `seed=`, `draws=`.

Each model's pass is kept under WORKDIR/passes/NAME; a longer model list in the
same workdir runs the new passes and the new pairs only. Pass `--config.measures`
and the other CKA fields as for `configs/cka_vit_resnet.py`; the calibration's
fields are `config.calibration.{draws, alpha, aggregate}`.
"""

import ml_collections

from configs import common
from configs import train as train_configs
from vitcnn_jax.inputs import zoo

PAPER = {"vit_b32": "ViT-B/32", "vit_b16": "ViT-B/16", "vit_l16": "ViT-L/16", "vit_h14": "ViT-H/14",
         "bit_r50": "BiT-R50x1", "bit_r152": "BiT-R152x2"}  # zoo names, also the labels
# Untrained baselines: (name, demo architecture, width field, width, label).
UNTRAINED = (("vit_w32_init", "vit_demo", "width", 32, "ViT w32 (untrained)"),
             ("vit_w128_init", "vit_demo", "width", 128, "ViT w128 (untrained)"),
             ("bit_w05_init", "bit_demo", "width", 0.5, "BiT w0.5 (untrained)"),
             ("bit_w1_init", "bit_demo", "width", 1.0, "BiT w1 (untrained)"))
DEMO_MEASURES = ("linear_cka", "mutual_knn", "rsa")
REPORT = {"many_models": ("demo", "paper", 14)}  # report section: demo and paper variants, order


REAL = {"dinov2_s14": "vit", "resnet50_1by2": "resnet"}  # our names for `common.real_models`' pair
DEMO = {"vit_demo": "vit", "vit_gap_demo": "vit_gap", "bit_demo": "resnet", "mixer_demo": "mixer"}


def demo_models(config: ml_collections.ConfigDict, capture="blocks") -> None:
  """The real pair, the four demo models and the untrained baselines, on the photo
  crops (each block's output: 10 models make 45 pairs, each with its draws)."""
  common.real_models(config, capture=capture)
  real = config.models
  config.models = ml_collections.ConfigDict({name: real[was] for name, was in REAL.items()})
  for name, was in DEMO.items():
    variant, label = common.DEMO_MODELS[was]
    config.models[name] = common.trained(zoo.demo_training(variant), capture, label)
  for name, variant, field, width, label in UNTRAINED:
    init = train_configs.changed(zoo.demo_training(variant, untrained=True), f"{variant}-untrained-{field}{width}",
                                 **{field: width})
    config.models[name] = common.trained(init, capture, label)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.analysis("many_models")
  variant = (arg or "paper").split(",")[0]
  sizes = {"demo": (512, 256, 1), "prh": (1024, 1024, 1)}  # examples, minibatch, repeats
  examples, batch, repeats = sizes.get(variant, (config.num_examples, config.batch_size, config.repeats))
  arg = common.parse_arg(arg, variant="paper", examples=examples, batch=batch, repeats=repeats,
                         seed=config.seed, draws=config.calibration.draws)
  if arg.variant == "demo":
    demo_models(config)
    config.measures = DEMO_MEASURES
  elif arg.variant == "prh":  # the last representation of each model, nothing searched
    demo_models(config, capture="pre_logits")
    config.measures, config.knn_k, config.calibration.aggregate = ("mutual_knn",), 10, "last"
  elif arg.variant == "paper":
    config.models = {name: common.model(zoo_name, "paper", zoo_name, resolution=224)
                     for name, zoo_name in PAPER.items()}
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected demo, paper or prh.")
  common.protocol(config, arg)
  config.calibration.draws = arg.draws
  return config

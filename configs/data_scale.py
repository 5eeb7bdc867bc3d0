r"""Models trained on less data, or fine-tuned, against a reference (paper Figs 12, G.1).

  python main.py --config=configs/data_scale.py:demo --workdir=/tmp/data_scale

Variants (`:arg`, then `examples=`, `batch=`, `repeats=`):
  demo           the demo ViT trained on 3%, 10%, 30% and 100% of Fashion-MNIST's
                 training images (seeded subsets; the same 250 steps each, about
                 6 minutes for the four on 2 CPU cores, cached), each against the
                 100% model: CKA per layer, a line per fraction (Fig 12), heatmaps,
                 and test accuracy.
  demo_finetune  the demo ViT pre-trained on classes 0-4 of Fashion-MNIST, then
                 fine-tuned (head zeroed) on classes 5-9: CKA of each layer before
                 vs after fine-tuning (Fig G.1), on the test images of classes 5-9.
  b32            the paper's setting: ViT-B/32 trained on 3%, 10%, 30% of JFT-300M
                 against the 100% model. Those were never released: pass
                 --config.models.NAME.checkpoint for NAME in fraction003, fraction010,
                 fraction030, fraction100 (names sort in plotting order), or
                 train your own with configs/train.py (`fraction=F`).
"""

import ml_collections

from configs import common
from configs import train as train_configs
from vitcnn_jax.inputs import zoo

FRACTIONS = (0.03, 0.1, 0.3)
REPORT = {"data_scale": ("demo", "b32", 12)}  # report section: demo and paper variants, order
PRETRAIN, FINETUNE = (0, 1, 2, 3, 4), (5, 6, 7, 8, 9)  # Fashion-MNIST classes


def _fractions_demo(config: ml_collections.ConfigDict) -> None:
  base = train_configs.sweep_base("vit_demo")
  config.models = {}
  for f, train in train_configs.sweep("vit_demo", "data_fraction", FRACTIONS).items():
    config.models[f"fraction{round(100 * f):03d}"] = common.trained(
        train, "paper", f"ViT, {100 * f:g}% of train")
  config.models["fraction100"] = common.trained(base, "paper", "ViT, 100% of train")
  config.reference = "fraction100"
  config.accuracy = True
  config.data = zoo.fashion_mnist("t10k")


def _finetune_demo(config: ml_collections.ConfigDict) -> None:
  pre = train_configs.changed(train_configs.sweep_base("vit_demo"), "vit_demo-classes0-4",
                              classes=PRETRAIN)
  tuned = train_configs.changed(pre, "vit_demo-classes0-4-finetuned5-9", classes=FINETUNE)
  tuned.pretrain = pre
  tuned.lr, tuned.warmup_steps = 3e-4, 20  # fine-tuning: a lower rate, a short warmup
  config.models = {"pretrained": common.trained(pre, "paper", "ViT before fine-tuning"),
                   "finetuned": common.trained(tuned, "paper", "ViT after fine-tuning")}
  config.reference = "pretrained"
  config.accuracy = False  # the two heads answer different class sets
  config.data = zoo.fashion_mnist("t10k")
  config.data.classes = FINETUNE


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  # Demo: one repeat of 2,048 (the spread over 3 repeats of 2,560 was below 0.01 CKA),
  # so that a re-run with the models cached takes about a minute.
  config = common.analysis("reference_cka")
  arg = common.protocol_arg(arg, config, "b32", demo_examples=2048, demo_repeats=1)
  if arg.variant == "demo":
    _fractions_demo(config)
  elif arg.variant == "demo_finetune":
    _finetune_demo(config)
  elif arg.variant == "b32":
    config.models = {f"fraction{p:03d}": common.model("", "paper", f"ViT-B/32, {p}% of JFT")
                     for p in (3, 10, 30, 100)}
    config.reference = "fraction100"
    config.accuracy = False  # JFT heads; ImageNet labels would not match
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected demo, demo_finetune or b32.")
  common.protocol(config, arg)
  return config

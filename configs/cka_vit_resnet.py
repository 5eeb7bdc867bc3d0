r"""Minibatch CKA within and across a ViT and a ResNet (paper Figs 1, 2 and B.1).

  python main.py --config=configs/cka_vit_resnet.py --workdir=/tmp/cka \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants (`:arg`, comma-separated): a pair name `b16_r50` (default), `b32_r50`,
`l16_r152`, `h14_r152`, `demo`, `demo3` or `demo_mixer`; then `examples=`, `batch=`,
`repeats=`, `seed=`, e.g. `configs/cka_vit_resnet.py:l16_r152,examples=2560,repeats=10`.

`demo` runs offline: it trains a tiny ViT and a tiny BiT ResNet-v2 on
Fashion-MNIST (once; cached in `cache_dir`), reloads them through load_model
and runs the same CKA job on the held-out test images. `demo3` adds a third
model, the ViT trained with GAP instead of CLS; `demo_mixer` an MLP-Mixer
(App. H: CKA within the Mixer and against the ViT and the ResNet).

Models are the mapping `config.models` (name -> model spec), here `vit` and
`resnet`; it takes any number of checkpoints under any names (add one with
`--config.models.NAME...` only in a config file: flags set existing fields).
Every pair of models, in name order, gets its block of the one CKA matrix
(arrays `cka_A_B`) and a heatmap `cka_A_B.png`.

The JFT-300M models of the paper were never released; the defaults are the
public ImageNet-21k checkpoints of the same architectures (both at 224 px).
"""

import ml_collections

from configs import common
from vitcnn_jax import zoo

PAIRS = {
    "b16_r50": ("ViT-B/16", "BiT-R50x1"),
    "b32_r50": ("ViT-B/32", "BiT-R50x1"),
    "l16_r152": ("ViT-L/16", "BiT-R152x2"),
    "h14_r152": ("ViT-H/14", "BiT-R152x2"),
}


DEMO_MODELS = {  # name -> (demo training variant, layers, label)
    "vit": ("vit_demo", zoo.VIT_LAYERS, "ViT (demo)"),
    "resnet": ("bit_demo", zoo.BIT_LAYERS, "BiT (demo)"),
    "vit_gap": ("vit_gap_demo", zoo.VIT_LAYERS, "ViT GAP (demo)"),
    "mixer": ("mixer_demo", zoo.MIXER_LAYERS, "Mixer (demo)"),
}


def demo_models(config: ml_collections.ConfigDict, names=("vit", "resnet")) -> None:
  """Tiny Fashion-MNIST models trained on first use (cached in config.cache_dir)."""
  config.models = ml_collections.ConfigDict()
  for name in names:
    variant, layers, label = DEMO_MODELS[name]
    config.models[name] = common.trained(zoo.demo_training(variant), layers, label)
  config.data = zoo.fashion_mnist("t10k")
  config.cache_dir = "~/.cache/vitcnn_jax"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  demo = common.is_demo(arg)
  arg = common.cka_arg(arg, "b16_r50")
  config = ml_collections.ConfigDict()
  config.analysis = "cka"
  if arg.variant == "demo3":
    demo_models(config, ("vit", "resnet", "vit_gap"))
  elif arg.variant == "demo_mixer":
    demo_models(config, ("vit", "resnet", "mixer"))
  elif demo:
    demo_models(config)
  elif arg.variant in PAIRS:
    vit, bit = PAIRS[arg.variant]  # names in zoo.CHECKPOINTS, also the labels
    config.models = dict(
        vit=common.model(zoo.CHECKPOINTS[vit], zoo.VIT_LAYERS, vit),
        resnet=common.model(zoo.CHECKPOINTS[bit], zoo.BIT_LAYERS, bit, resolution=224))
    config.data = common.imagenet_validation()
    config.cache_dir = ""
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of {sorted(PAIRS) + ['demo', 'demo3', 'demo_mixer']}.")
  common.cka_protocol(config, arg)
  return config

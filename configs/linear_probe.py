r"""Few-shot linear probes of every block (paper Figs 11, 13, D.4, F.1-F.3).

  python main.py --config=configs/linear_probe.py:demo --workdir=/tmp/probe_demo
  python main.py --config=configs/linear_probe.py:imagenet10 --workdir=/tmp/probe \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants (`:arg`, comma-separated):
  demo         layer-wise probes (Fig 13) of the demo ViT (CLS token, token mean),
               the demo GAP ViT and the demo BiT, 10-shot Fashion-MNIST.
  demo_tokens  a probe per token of every block (Figs 11, D.4) and Fig 11's five
               aggregations: CLS;CLS token, CLS;GAP except CLS, CLS;GAP (the CLS
               ViT), GAP;first token, GAP;GAP (the GAP ViT).
  demo_mixer   layer-wise probes of the demo MLP-Mixer (mean over tokens) beside the
               demo ViT (App. H).
  imagenet10   Fig 13's protocol: ViT-B/16 and BiT-R50x1 (ImageNet-21k), 10-shot
               ImageNet train, l2 chosen on its last 10,000 images, scored on
               validation.
  b32_tokens   per-token probes of ViT-B/32 on 10-shot ImageNet (Fig D.4's CLS model).
  cifar10, cifar100
               the paper's CIFAR protocol: every one of the first 45,000 train
               images, l2 chosen on the last 5,000, scored on test.
then `shots=`, `seeds=`, `test=` (test examples; 0: all), `batch=`.

Per model, `config.models.NAME.features` says how a point becomes features:
cls, first, spatial_mean, mean, final_grid, each (see vitcnn_jax/probe.py).
ResNet blocks are read as `mean` by default: each block output averaged over
its positions, the pooling the network's own head applies to its last block.
The paper's wording ("pooled to the final stage's spatial size") is
`final_grid`: average-pooled to the last stage's grid (7x7 at 224 px) and
flattened, 7*7*C features (up to 100,352 for R50): feasible only with few shots,
where the fit keeps the shots' rows.
"""

import ml_collections

from configs import cka_vit_resnet
from configs import common
from vitcnn_jax import probe
from vitcnn_jax import zoo

VIT_BLOCKS, BIT_BLOCKS = ("block*/out",), ("block*/unit*/out",)
CIFAR = {"cifar10": "cifar10", "cifar100": "cifar100"}


def _vit(path: str, label: str, features) -> ml_collections.ConfigDict:
  spec = common.model(path, VIT_BLOCKS, label)
  spec.features = tuple(features)
  return spec


def _bit(path: str, label: str) -> ml_collections.ConfigDict:
  spec = common.model(path, BIT_BLOCKS, label, resolution=224)
  spec.features = ("mean",)
  return spec


def _demo(config: ml_collections.ConfigDict, variant: str) -> None:
  tokens = variant == "demo_tokens"
  names = {"demo": ("vit", "vit_gap", "resnet"), "demo_tokens": ("vit", "vit_gap"),
           "demo_mixer": ("vit", "mixer")}[variant]
  cka_vit_resnet.demo_models(config, names)
  features = {"vit": ("cls", "spatial_mean", "mean", "each") if tokens else ("cls", "mean"),
              "vit_gap": ("first", "mean", "each") if tokens else ("mean",),
              "resnet": ("mean",), "mixer": ("mean",)}
  for name in names:
    config.models[name].capture = BIT_BLOCKS if name == "resnet" else VIT_BLOCKS
    config.models[name].features = features[name]
  config.data = zoo.fashion_mnist("train")
  config.data.test_split = "t10k"
  config.holdout = 5000  # the last 5,000 of the 60,000 train images choose l2


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  demo = common.is_demo(arg)
  arg = common.parse_arg(arg, variant="imagenet10", shots=10, seeds=3, test=5000 if demo else 0,
                         batch=256)
  config = ml_collections.ConfigDict()
  config.analysis = "linear_probe"
  config.shots = arg.shots  # per class; 0: every training example (then seeds=1)
  config.seeds = arg.seeds  # draws of the shots; mean and spread over them
  config.l2 = 0.0  # 0: chosen per probe on held-out examples from l2_sweep; big_vision fixes 2**10
  config.l2_sweep = probe.L2_SWEEP
  config.test_examples = arg.test  # the first N of the test split; 0: all
  if arg.variant in ("demo", "demo_tokens", "demo_mixer"):
    _demo(config, arg.variant)
  elif arg.variant in ("imagenet10", "b32_tokens"):
    if arg.variant == "imagenet10":
      config.models = dict(vit=_vit(zoo.CHECKPOINTS["ViT-B/16"], "ViT-B/16", ("cls", "mean")),
                           resnet=_bit(zoo.CHECKPOINTS["BiT-R50x1"], "BiT-R50x1"))
    else:
      config.models = dict(vit=_vit(zoo.CHECKPOINTS["ViT-B/32"], "ViT-B/32", ("cls", "spatial_mean", "each")))
    config.data = zoo.data_spec("tfds", name="imagenet2012", split="train", test_split="validation")
    config.holdout = 10000  # the paper: "a held-out part of the training set"
    config.cache_dir = ""
  elif arg.variant in CIFAR:
    config.models = dict(vit=_vit(zoo.CHECKPOINTS["ViT-B/16"], "ViT-B/16", ("cls", "mean")),
                         resnet=_bit(zoo.CHECKPOINTS["BiT-R50x1"], "BiT-R50x1"))
    config.data = zoo.data_spec("tfds", name=CIFAR[arg.variant], split="train", test_split="test")
    config.holdout = 5000
    config.shots, config.seeds = 0, 1
    config.cache_dir = ""
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of demo, demo_tokens, demo_mixer, "
                     f"imagenet10, b32_tokens, {', '.join(CIFAR)}.")
  config.batch_size = arg.batch  # per device
  config.seed = 0
  common.run_control(config)
  return config

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
cls, first, spatial_mean, mean, final_grid, each (see vitcnn_jax/similarity/probe.py).
ResNet blocks are read as `mean` by default: each block output averaged over
its positions, the pooling the network's own head applies to its last block.
The paper's wording ("pooled to the final stage's spatial size") is
`final_grid`: average-pooled to the last stage's grid (7x7 at 224 px) and
flattened, 7*7*C features (up to 100,352 for R50): feasible only with few shots,
where the fit keeps the shots' rows.
"""

import ml_collections

from configs import common
from vitcnn_jax.inputs import zoo

CIFAR = {"cifar10": "cifar10", "cifar100": "cifar100"}
DEMOS = {"demo": ("vit", "vit_gap", "resnet"), "demo_tokens": ("vit", "vit_gap"),
         "demo_mixer": ("vit", "mixer")}
# Report sections: the per-token probes (Fig 11) and the layer-wise ones (Fig 13).
REPORT = {"linear_probe": ("demo_tokens", "b32_tokens", 11), "layerwise_probe": ("demo", "imagenet10", 13)}
REAL = {"linear_probe": "real_tokens", "layerwise_probe": "real"}  # on the real pretrained pair
# The real pair's probes: which of the 15 photographs a crop comes from (train and test crops
# at other seeded positions), l2 chosen on the last 256 training crops.
REAL_PROBE = dict(train=1024, test=512, holdout=256)


def _model(path: str, label: str, features, **overrides) -> ml_collections.ConfigDict:
  spec = common.model(path, "blocks", label, **overrides)
  spec.features = tuple(features)
  return spec


def _demo(config: ml_collections.ConfigDict, variant: str) -> None:
  tokens = variant == "demo_tokens"
  common.demo_models(config, DEMOS[variant], "blocks")
  features = {"vit": ("cls", "spatial_mean", "mean", "each") if tokens else ("cls", "mean"),
              "vit_gap": ("first", "mean", "each") if tokens else ("mean",),
              "resnet": ("mean",), "mixer": ("mean",)}
  for name in DEMOS[variant]:
    config.models[name].features = features[name]
  config.data = zoo.fashion_mnist("train")
  config.data.test_split = "t10k"
  config.holdout = 5000  # the last 5,000 of the 60,000 train images choose l2


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  demo = common.is_demo(arg)
  config = common.analysis("linear_probe")
  arg = common.parse_arg(arg, variant="imagenet10", shots=config.shots, seeds=config.seeds,
                         test=5000 if demo else 0, batch=config.batch_size)
  config.shots, config.seeds, config.test_examples = arg.shots, arg.seeds, arg.test
  config.l2 = 0.0  # chosen per probe on held-out training examples, as the paper
  if arg.variant in DEMOS:
    _demo(config, arg.variant)
  elif arg.variant in ("real", "real_tokens"):
    tokens = arg.variant == "real_tokens"
    common.real_models(config, ("vit",) if tokens else ("vit", "resnet"), "blocks")
    config.models.vit.features = ("cls", "spatial_mean", "each") if tokens else ("cls", "mean")
    if not tokens:
      config.models.resnet.features = ("mean",)
    config.data = zoo.data_spec("photos", num_examples=REAL_PROBE["train"], split="train",
                                test_split="test")
    config.holdout, config.shots, config.seeds = REAL_PROBE["holdout"], 0, 1
    config.test_examples = arg.test or REAL_PROBE["test"]
  elif arg.variant == "imagenet10":
    config.models = dict(vit=_model("ViT-B/16", "ViT-B/16", ("cls", "mean")),
                         resnet=_model("BiT-R50x1", "BiT-R50x1", ("mean",),
                                       resolution=224))
  elif arg.variant == "b32_tokens":
    config.models = dict(vit=_model("ViT-B/32", "ViT-B/32",
                                    ("cls", "spatial_mean", "each")))
  elif arg.variant in CIFAR:
    config.models = dict(vit=_model("ViT-B/16", "ViT-B/16", ("cls", "mean")),
                         resnet=_model("BiT-R50x1", "BiT-R50x1", ("mean",),
                                       resolution=224))
    config.data = zoo.data_spec("tfds", name=CIFAR[arg.variant], split="train", test_split="test")
    config.holdout = 5000
    config.shots, config.seeds = 0, 1
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of {', '.join(DEMOS)}, "
                     f"imagenet10, b32_tokens, {', '.join(CIFAR)}, real, real_tokens.")
  if arg.variant in ("imagenet10", "b32_tokens"):
    config.data = zoo.data_spec("tfds", name="imagenet2012", split="train", test_split="validation")
    config.holdout = 10000  # the paper: "a held-out part of the training set"
  config.batch_size = arg.batch
  return config

"""What the package knows by name: the public checkpoints, the data specs, and
the tiny offline demo models' training configs (`demos` trains them once). No jax
here: configs import it. The paper's layer sets are each family's
`layer_presets` ("paper", "blocks", "all"), named in capture lists."""

from __future__ import annotations

import ml_collections

from vitcnn_jax import data as data_lib

# The public checkpoints the paper's figures use (its JFT-300M models were never
# released; these are the same architectures on ImageNet-21k).
CHECKPOINTS = {
    "ViT-B/16": "gs://vit_models/imagenet21k/ViT-B_16.npz",
    "ViT-B/32": "gs://vit_models/imagenet21k/ViT-B_32.npz",
    "ViT-L/16": "gs://vit_models/imagenet21k/ViT-L_16.npz",
    "ViT-H/14": "gs://vit_models/imagenet21k/ViT-H_14.npz",
    "ViT-B/16 ImageNet": "gs://vit_models/imagenet21k+imagenet2012/ViT-B_16-224.npz",
    "ViT-B/32 ImageNet": "gs://vit_models/imagenet21k+imagenet2012/ViT-B_32.npz",
    "BiT-R50x1": "gs://bit_models/BiT-M-R50x1.npz",
    "BiT-R152x2": "gs://bit_models/BiT-M-R152x2.npz",
    "Mixer-B/16": "gs://mixer_models/imagenet21k/Mixer-B_16.npz",
}

DEMO_ARCHITECTURES = {
    "vit_demo": dict(family="vit", patch_size=4, image_size=32, width=64, depth=4, mlp_dim=128,
                     num_heads=4, pool="token"),
    "vit_gap_demo": dict(family="vit", patch_size=4, image_size=32, width=64, depth=4, mlp_dim=128,
                         num_heads=4, pool="gap"),
    "vit_noskip_demo": dict(family="vit", patch_size=4, image_size=32, width=64, depth=4,
                            mlp_dim=128, num_heads=4, pool="token", no_skip=[1]),
    "bit_demo": dict(family="bit", width=0.5, depth=[1, 1, 1, 1], image_size=32),
    "mixer_demo": dict(family="mixer", patch_size=4, image_size=32, hidden_dim=64, num_blocks=4,
                       tokens_mlp_dim=64, channels_mlp_dim=128),
}
DEMO_STEPS = {"vit_demo": 700, "vit_gap_demo": 700, "vit_noskip_demo": 700, "bit_demo": 400,
              "mixer_demo": 700}  # about 3, 2.5 (BiT) and 3 minutes on 2 CPU cores


def checkpoint(name: str) -> str:
  """The path of a checkpoint by its name in `CHECKPOINTS`, or `name` itself."""
  return CHECKPOINTS.get(name, name)


def data_spec(source: str = "tfds", **kw) -> ml_collections.ConfigDict:
  """A data config; every field exists for every source, so flags can switch sources."""
  fields = dict(source=source, name="", split="", test_split="", data_dir="", path="",
                labels="", image_key="image", label_key="label", num_examples=0, size=32,
                classes=())  # classes: keep only these labels, renumbered 0..k-1
  fields.update(kw)
  return ml_collections.ConfigDict(fields)


def fashion_mnist(split: str, path: str = data_lib.FASHION_MNIST_DIR) -> ml_collections.ConfigDict:
  return data_spec("idx", path=path, split=split)


def demo_training(variant: str, steps: int = 0, batch: int = 128,
                  data: str = data_lib.FASHION_MNIST_DIR) -> ml_collections.ConfigDict:
  """The training config of a demo model (`DEMO_ARCHITECTURES`) on Fashion-MNIST."""
  if variant not in DEMO_ARCHITECTURES:
    raise ValueError(f"Unknown training variant {variant!r}; expected one of "
                     f"{sorted(DEMO_ARCHITECTURES)}.")
  config = ml_collections.ConfigDict()
  config.name = variant
  config.model = ml_collections.ConfigDict(DEMO_ARCHITECTURES[variant])
  config.data = fashion_mnist("train", data)
  config.data.test_split = "t10k"
  config.policy = ""  # family default
  config.batch_size = batch
  config.steps = steps or DEMO_STEPS[variant]
  config.lr = 1e-3
  config.warmup_steps = 100
  config.weight_decay = 1e-4
  config.seed = 0
  config.save_every_seconds = 60
  config.stop_after = 0  # >0: stop (resumably) after this many steps
  config.data_fraction = 1.0  # train on a seeded subset of this fraction of config.data
  config.subset_seed = 0
  config.init = ""  # fine-tune from this checkpoint (head zeroed); see also `pretrain`
  return config

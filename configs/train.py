r"""Train one of our models and export it in the upstream npz format.

  python main.py --config=configs/train.py:vit_demo --workdir=/tmp/train_vit

Variants: `vit_demo` and `bit_demo` (the tiny Fashion-MNIST models of the
offline demo), `vit_gap_demo` (GAP instead of CLS pooling), `vit_noskip_demo`
(block 1 without skip connections), `mixer_demo` (an MLP-Mixer of the same
size); then `steps=`, `batch=`, `data=DIR`.
"""

import ml_collections

from configs import common

MODELS = {
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
STEPS = {"vit": 700, "bit": 400, "mixer": 700}  # about 3, 2.5 and 3 minutes on 2 CPU cores


def train_config(variant: str, steps: int = 0, batch: int = 128,
                 data: str = "/usr/share/datasets/fashion-mnist") -> ml_collections.ConfigDict:
  if variant not in MODELS:
    raise ValueError(f"Unknown training variant {variant!r}; expected one of {sorted(MODELS)}.")
  config = ml_collections.ConfigDict()
  config.name = variant
  config.model = ml_collections.ConfigDict(MODELS[variant])
  config.data = common.fashion_mnist("train", data)
  config.data.test_split = "t10k"
  config.policy = ""  # family default
  config.batch_size = batch
  config.steps = steps or STEPS[MODELS[variant]["family"]]
  config.lr = 1e-3
  config.warmup_steps = 100
  config.weight_decay = 1e-4
  config.seed = 0
  config.save_every_seconds = 60
  config.stop_after = 0  # >0: stop (resumably) after this many steps
  return config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = common.parse_arg(arg, variant="vit_demo", steps=0, batch=128,
                         data="/usr/share/datasets/fashion-mnist")
  config = ml_collections.ConfigDict()
  config.analysis = "train"
  config.train = train_config(arg.variant, arg.steps, arg.batch, arg.data)
  config.export = ""  # default: WORKDIR/<variant>.npz
  return config

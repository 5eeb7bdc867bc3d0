r"""Train one of our models and export it in the upstream npz format.

  python main.py --config=configs/train.py:vit_demo --workdir=/tmp/train_vit

Variants: `vit_demo` and `bit_demo` (the tiny Fashion-MNIST models of the
offline demo), `vit_gap_demo` (GAP instead of CLS pooling), `vit_noskip_demo`
(block 1 without skip connections), `mixer_demo` (an MLP-Mixer of the same
size); then `steps=`, `batch=`, `data=DIR`, and the training ablations:
`no_skip=K` (block K without its two skip connections, Fig 8), `fraction=F`
(a seeded subset of round(F * N) training examples, Fig 12; `subset_seed=`),
`init=FILE.npz` (fine-tune from a checkpoint, head zeroed, Fig G.1), e.g.

  python main.py --config=configs/train.py:vit_demo,fraction=0.03 --workdir=/tmp/f3

Paper scale is the same code on other data and models: point `config.train.data`
at a tfds dataset (source, name, split, test_split, data_dir) and set
`config.train.model` (e.g. width 768, depth 12, patch 32 for ViT-B/32).
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
SWEEP_STEPS = 250  # each model of a demo sweep (5 of them in the skip ablation): ~1.5 min


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
  config.data_fraction = 1.0  # train on a seeded subset of this fraction of config.data
  config.subset_seed = 0
  config.init = ""  # fine-tune from this checkpoint (head zeroed); see also `pretrain`
  return config


def changed(config: ml_collections.ConfigDict, name: str, **changes) -> ml_collections.ConfigDict:
  """A copy of a training config named `name` with fields changed: model fields
  (no_skip, pool, ...) go to config.model, data fields (classes) to config.data."""
  out = ml_collections.ConfigDict(config.to_dict())
  out.name = name
  for k, v in changes.items():
    if k == "no_skip" and isinstance(v, int):
      v = [v]
    target = out.model if k in out.model or k == "no_skip" else out.data if k in out.data else out
    if k not in target and target is out:
      raise ValueError(f"{k!r} is not a training config field.")
    target[k] = v
  return out


def sweep_base(variant: str, steps: int = SWEEP_STEPS) -> ml_collections.ConfigDict:
  """The unablated model of a demo sweep: one file shared by every sweep of `variant`."""
  return changed(train_config(variant, steps), f"{variant}-{steps}steps")


def sweep(variant: str, field: str, values, steps: int = SWEEP_STEPS) -> dict:
  """A training config per value of one field, named `BASE-FIELDVALUE`: a training
  ablation (no_skip=k, data_fraction=f) as a family of models around `sweep_base`."""
  base = sweep_base(variant, steps)
  return {v: changed(base, f"{base.name}-{field}{v}", **{field: v}) for v in values}

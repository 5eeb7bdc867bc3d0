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
from vitcnn_jax.inputs import datasets
from vitcnn_jax.inputs import zoo

SWEEP_STEPS = 250  # each model of a demo sweep (5 of them in the skip ablation): ~1.5 min


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = common.parse_arg(arg, variant="vit_demo", steps=0, batch=128, data=datasets.FASHION_MNIST_DIR,
                         no_skip=-1, fraction=1.0, subset_seed=0, init="")
  train = zoo.demo_training(arg.variant, arg.steps, arg.batch, arg.data)
  changes = dict(data_fraction=arg.fraction, subset_seed=arg.subset_seed, init=arg.init)
  if arg.no_skip >= 0:
    changes["no_skip"] = arg.no_skip
  config = ml_collections.ConfigDict()
  config.analysis = "train"
  config.train = changed(train, train.name, **changes)
  config.export = ""  # default: WORKDIR/<name>.npz
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
  return changed(zoo.demo_training(variant, steps), f"{variant}-{steps}steps")


def sweep(variant: str, field: str, values, steps: int = SWEEP_STEPS) -> dict:
  """A training config per value of one field, named `BASE-FIELDVALUE`: a training
  ablation (no_skip=k, data_fraction=f) as a family of models around `sweep_base`."""
  base = sweep_base(variant, steps)
  return {v: changed(base, f"{base.name}-{field}{v}", **{field: v}) for v in values}

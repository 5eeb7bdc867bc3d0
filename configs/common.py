"""Shared config pieces: `arg` parsing, model specs, the driver's fields (the
paper's layer sets, checkpoints and data specs live in `vitcnn_jax.zoo`)."""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from vitcnn_jax import driver
from vitcnn_jax import zoo


def run_control(config: ml_collections.ConfigDict) -> None:
  """The driver's fields, the same for every analysis (`driver.CONTROL` documents them)."""
  config.update(ml_collections.ConfigDict(driver.CONTROL))


def cka_arg(arg: str | None, variant: str, demo_examples: int = 2560,
            demo_repeats: int = 3) -> ml_collections.ConfigDict:
  """`:arg` of a minibatch-CKA config: the paper's protocol by default, smaller for demos."""
  demo = is_demo(arg)
  return parse_arg(arg, variant=variant, examples=demo_examples if demo else 10240,
                   batch=256 if demo else 1024, repeats=demo_repeats if demo else 20, seed=0)


def cka_protocol(config: ml_collections.ConfigDict, arg: ml_collections.ConfigDict) -> None:
  """The minibatch-CKA fields from a parsed `cka_arg`, and the driver's fields."""
  config.num_examples = arg.examples  # paper: 10,240 ...
  config.batch_size = arg.batch  # ... in minibatches of 1,024
  config.repeats = arg.repeats  # paper: mean of 20 repeats
  config.seed = arg.seed
  run_control(config)


def is_demo(arg: str | None) -> bool:
  """Whether `:arg` asks for an offline demo variant (its first word starts with `demo`)."""
  return (arg or "").split(",")[0].startswith("demo")


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """'name' or 'name,key=value,...' -> ConfigDict over `defaults` (big_vision style).

  The first bare word sets `variant`; values take the type of their default.
  """
  out = ml_collections.ConfigDict(defaults)
  for part in filter(None, (arg or "").split(",")):
    if "=" not in part:
      out.variant = part
      continue
    key, value = part.split("=", 1)
    if key not in defaults:
      raise ValueError(f"Unknown config arg {key!r}; known: {sorted(defaults)}.")
    kind = type(defaults[key])
    out[key] = (value.lower() in ("1", "true", "yes")) if kind is bool else kind(value)
  return out


def overrides(**given) -> ml_collections.ConfigDict:
  """`load_model` overrides, each settable from the command line (unset: None)."""
  fields = dict(resolution=placeholder(int), pool=placeholder(str), gelu=placeholder(str),
                root_pool_pad=placeholder(str), no_skip=placeholder(tuple))
  fields.update(given)
  return ml_collections.ConfigDict(fields)


def model(checkpoint: str, capture, label: str, **given) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      checkpoint=checkpoint, label=label, capture=tuple(capture), policy="",
      overrides=overrides(**given)))


def trained(train: ml_collections.ConfigDict, capture, label: str) -> ml_collections.ConfigDict:
  """A model this tool trains on first use (cached by its training config)."""
  spec = model("", capture, label, resolution=train.model.image_size)  # npz files of BiT
  spec.train = train  # models do not record their input size: run at the training one
  return spec


def imagenet_validation(data_dir: str = "") -> ml_collections.ConfigDict:
  return zoo.data_spec("tfds", name="imagenet2012", split="validation", data_dir=data_dir)

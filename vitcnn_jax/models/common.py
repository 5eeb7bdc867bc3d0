"""Pieces shared by the model families: representation capture and MLPs."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable, Sequence

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

GELUS: dict[str, Callable[[Array], Array]] = {
    # The official checkpoints were trained with Flax's default, the tanh form.
    "tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "exact": lambda x: jax.nn.gelu(x, approximate=False),  # PyTorch's default (timm, DINOv2, MAE)
    "quick": lambda x: x * jax.nn.sigmoid(1.702 * x),  # OpenAI CLIP
}
MLPS = ("gelu", "swiglu")


def flatten(tree: dict) -> dict[str, Any]:
  """A parameter tree as {"a/b/c": array}, the key style of npz checkpoints."""
  return traverse_util.flatten_dict(tree, sep="/")


def unflatten(flat: dict[str, Any]) -> dict:
  return traverse_util.unflatten_dict(flat, sep="/")


def per_architecture(fn: Callable) -> Callable:
  """`fn(model, *keys)` made once per distinct arguments, for what an architecture
  alone decides and costs a trace (a sweep or a notebook asks many times); with a
  model that does not hash (a list field) it runs each time."""
  cached = functools.lru_cache(maxsize=64)(fn)

  @functools.wraps(fn)
  def call(*args):
    try:
      hash(args)
    except TypeError:
      return fn(*args)
    return cached(*args)
  return call


def conv(x: Array, w: Array, stride: int) -> Array:
  """NHWC by HWIO, padding (kernel - 1) // 2 on each side, in the form XLA:CPU runs
  fastest: a 1x1 conv as a dot over the channels of every stride-th pixel (about
  1.3x faster than its convolution), and one whose output has at most 2x2 pixels
  as one dot over its kernel's shifted windows (those not all padding): there its
  convolution ran at 7 to 27 GFLOP/s (a 3x3 256 -> 256 at 2x2 over 1,000 images:
  0.78 s against 0.05 s)."""
  k = w.shape[0]
  if k == 1:
    return jnp.einsum("nhwc,co->nhwo", x[:, ::stride, ::stride] if stride > 1 else x, w[0, 0])
  pad = (k - 1) // 2
  out = [(d + 2 * pad - k) // stride + 1 for d in x.shape[1:3]]
  if out[0] * out[1] > 4:
    return jax.lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad)] * 2,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
  real = [[i for i in range(k) if any(pad <= i + stride * t < pad + d for t in range(o))]
          for d, o in zip(x.shape[1:3], out)]
  taps = [(i, j) for i in real[0] for j in real[1]]
  x = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  windows = jnp.stack([x[:, i:i + stride * (out[0] - 1) + 1:stride, j:j + stride * (out[1] - 1) + 1:stride]
                       for i, j in taps], 3)
  return jnp.einsum("nhwkc,kco->nhwo", windows, jnp.stack([w[i, j] for i, j in taps]))


def random_params(model: nn.Module, images, seed: int = 0) -> dict:
  """Parameters of `model` at the shapes its init gives for `images`, drawn with
  NumPy: normals over sqrt(fan-in), norm scales near one, biases near zero. For
  random-init benchmarks and tests: Flax's compiled init costs seconds a model
  (a random generator per array), a fresh draw here none."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]

  def draw(path, leaf) -> np.ndarray:
    name, shape = getattr(path[-1], "key", ""), leaf.shape
    if name == "scale":
      value = 1 + 0.1 * rng.standard_normal(shape)
    elif name == "bias":
      value = 0.1 * rng.standard_normal(shape)
    else:
      value = rng.standard_normal(shape) / np.sqrt(max(1, int(np.prod(shape[:-1]))))
    return value.astype(leaf.dtype)
  return jax.tree_util.tree_map_with_path(draw, shapes)


def patch_grid(patch_size, image_size) -> tuple[int, int]:
  """Rows and columns of the patch tokens of a ViT or Mixer."""
  (ph, pw), (h, w) = to_pair(patch_size), to_pair(image_size)
  if h % ph or w % pw:
    raise ValueError(f"image_size {(h, w)} is not a multiple of patch_size {(ph, pw)}.")
  return h // ph, w // pw


def get_gelu(name: str) -> Callable[[Array], Array]:
  if name not in GELUS:
    raise ValueError(f"gelu={name!r} is not one of {sorted(GELUS)}.")
  return GELUS[name]


@functools.lru_cache(maxsize=None)
def _glob_regex(pattern: str) -> re.Pattern:
  parts = re.split(r"(\*\*/?|\*|\?|\[[^\]]+\])", pattern)
  table = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
  return re.compile("".join(
      table.get(p, p if p.startswith("[") and len(p) > 2 else re.escape(p)) for p in parts))


def matches(name: str, patterns: Sequence[str]) -> bool:
  """Whether a representation name matches any of the Capture globs."""
  return any(_glob_regex(p).fullmatch(name) for p in patterns)


@dataclasses.dataclass(frozen=True)
class Capture:
  """Which named representation points a forward pass keeps.

  Names read like paths (`block03/attn/out`); `patterns` are globs matched
  against the full name, where `*` stays within one path segment and `**`
  crosses segments: `block*/out` is every block output, `block03/**` all of
  block 3, `**/attn/weights` every attention map. `None` keeps every point.
  Filtering where each tensor is made (not at the end) keeps eager callers from
  holding every activation of the network at once.
  """
  patterns: tuple[str, ...] | None = None
  prefix: str = ""
  # Applied to each kept point where it is made (e.g. its Gram, `grams.scaled_layer`):
  # inside a scan over identical blocks (`run_blocks`) the activation then dies
  # within its block, and the reduction is compiled once for the run.
  reduce: Callable[[Array], Any] | None = None

  @classmethod
  def of(cls, spec: "Capture | str | Sequence[str] | None") -> "Capture":
    if isinstance(spec, Capture):
      return spec
    if spec is None:
      return cls(None)
    if isinstance(spec, str):
      spec = (spec,)
    return cls(tuple(spec))

  def child(self, name: str) -> "Capture":
    return dataclasses.replace(self, prefix=f"{self.prefix}{name}/")

  def wants(self, name: str) -> bool:
    if self.patterns is None:
      return True
    full = self.prefix + name
    return matches(full, self.patterns)

  def put(self, out: dict[str, Any], name: str, value: Array) -> Array:
    """Records `value` under its full name if wanted; returns it unchanged."""
    if self.wants(name):
      out[self.prefix + name] = value if self.reduce is None else self.reduce(value)
    return value


def apply_blocks(parent: nn.Module, make: Callable[..., nn.Module], names: Sequence[str], x: Array,
                 captures: Sequence[Capture], out: dict, *args, scan: bool = True) -> Array:
  """Identical blocks `make(name=names[i])` of `parent` applied in turn as
  `block(x, captures[i], out, *args) -> x`: made one by one when `parent` is
  initialised (their parameters as they are stored) or not `scan` (training:
  differentiated, a scan of the demo ViT compiled in 3.1 s against 1.3 s and
  stepped in 179 ms against 124), scanned otherwise (`run_blocks`)."""
  if parent.is_initializing() or not scan:
    for name, capture in zip(names, captures):
      x = make(name=name)(x, capture, out, *args)
    return x
  params = parent.variables["params"]
  return run_blocks(make(parent=None), [params[n] for n in names], x, captures, out, *args)


# Runs of fewer blocks are applied one by one: for one or two blocks a scan's loop
# and stacked parameters cost more to trace and compile than they save (the tiny
# test models: 19% more suite time on two analysis test files).
MIN_SCAN = 3


def run_blocks(block: nn.Module, params: Sequence[Any], x: Array, captures: Sequence[Capture],
               out: dict, *args) -> Array:
  """`block` (unbound: `parent=None`) applied in turn with `params[i]`, capturing
  with `captures[i]`, as `block(x, capture, out, *args) -> x`: each run of at
  least `MIN_SCAN` consecutive blocks that keep the same points is one
  `lax.scan` (its points stacked by the scan, then handed out per block), so a
  network of identical blocks is traced and compiled once, not once per block.
  Parameters are stacked for each run: a copy of those blocks' weights per call."""
  # Too few blocks to scan: no points asked for, so one run, applied block by block.
  names = _block_points(block, params[0], x, args) if len(params) >= MIN_SCAN else []
  wanted = [tuple(c.wants(n) for n in names) for c in captures]
  start = 0
  while start < len(params):
    stop = start + 1
    while stop < len(params) and wanted[stop] == wanted[start]:
      stop += 1
    if stop - start < MIN_SCAN:
      for i in range(start, stop):
        x = block.apply({"params": params[i]}, x, captures[i], out, *args)
    else:
      x = _scan(block, params[start:stop], x, captures[start:stop], out, args)
    start = stop
  return x


def _block_points(block: nn.Module, params: Any, x: Array, args: tuple) -> list[str]:
  """Every point `block` can capture (abstract evaluation: nothing runs)."""
  abstract = lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype)

  def points(p, x):
    local: dict = {}
    block.apply({"params": p}, x, Capture(None), local, *args)
    return local
  return list(jax.eval_shape(points, jax.tree.map(abstract, params), abstract(x)))


def _scan(block: nn.Module, params: Sequence[Any], x: Array, captures: Sequence[Capture],
          out: dict, args: tuple) -> Array:
  """One `lax.scan` over the blocks. (Eager, a scan is compiled and a run applied
  block by block is not: their roundings differ, so points that split a scan into
  short runs can move the logits by a rounding there; under jit they do not.)"""
  first, order = captures[0], []

  def body(x, p):
    local: dict = {}
    x = block.apply({"params": p}, x, first, local, *args)
    order[:] = local  # the network's order (the scan returns its dict sorted)
    return x, local

  x, stacked = jax.lax.scan(body, x, jax.tree.map(lambda *a: jnp.stack(a), *params))
  for i, c in enumerate(captures):
    for name in order:
      out[c.prefix + name[len(first.prefix):]] = jax.tree.map(lambda a, i=i: a[i], stacked[name])
  return x


class MlpBlock(nn.Module):
  """Dense -> GELU -> Dense, the MLP of every ViT and Mixer block; or, `kind`
  "swiglu", Dense to twice the hidden width -> SiLU(first half) * second half ->
  Dense (timm's packed SwiGLU, DINOv2-g). `norm_eps`: a LayerNorm (`norm`) on the
  hidden features before the last Dense (EVA-02's scale_mlp)."""
  mlp_dim: int
  gelu: str = "tanh"
  kind: str = "gelu"
  norm_eps: float | None = None

  @nn.compact
  def __call__(self, x: Array, capture: Capture, out: dict) -> Array:
    d = x.shape[-1]
    if self.kind not in MLPS:
      raise ValueError(f"mlp={self.kind!r} is not one of {MLPS}.")
    glu = self.kind == "swiglu"
    h = nn.Dense(self.mlp_dim * (2 if glu else 1), name="Dense_0",
                 kernel_init=nn.initializers.xavier_uniform(),
                 bias_init=nn.initializers.normal(1e-6))(x)
    if glu:
      h = jax.nn.silu(h[..., :self.mlp_dim]) * h[..., self.mlp_dim:]
    h = capture.put(out, "hidden", h if glu else get_gelu(self.gelu)(h))
    if self.norm_eps is not None:
      h = nn.LayerNorm(epsilon=self.norm_eps, name="norm")(h)
    return nn.Dense(d, name="Dense_1",
                    kernel_init=nn.initializers.xavier_uniform(),
                    bias_init=nn.initializers.normal(1e-6))(h)


def layer_norm(name: str, eps: float = 1e-6) -> nn.LayerNorm:
  # Flax's defaults (eps 1e-6) are what every upstream ViT and Mixer used (CLIP: 1e-5).
  return nn.LayerNorm(epsilon=eps, name=name)


def to_pair(v: int | Sequence[int]) -> tuple[int, int]:
  if isinstance(v, int):
    return (v, v)
  v = tuple(int(a) for a in v)
  if len(v) != 2:
    raise ValueError(f"Expected an int or a pair, got {v}.")
  return v  # type: ignore[return-value]


def check_image(images: Array, image_size: tuple[int, int] | None, model: str) -> None:
  """Errors early, naming both shapes, instead of failing deep inside XLA
  (`image_size` None: a model that runs at any size)."""
  if images.ndim != 4 or images.shape[-1] != 3:
    raise ValueError(
        f"{model} expects NHWC images with 3 channels, got shape {images.shape}.")
  if image_size is not None and tuple(images.shape[1:3]) != tuple(image_size):
    raise ValueError(
        f"{model} was built for {image_size[0]}x{image_size[1]} images but got "
        f"{images.shape[1]}x{images.shape[2]} (shape {images.shape}). Resize the "
        "images, or reload with load_model(path, resolution=...) to resample "
        "the position embedding.")


def dense_head(num_classes: int, name: str = "head", use_bias: bool = True) -> nn.Dense:
  return nn.Dense(num_classes, name=name, use_bias=use_bias, kernel_init=nn.initializers.zeros)

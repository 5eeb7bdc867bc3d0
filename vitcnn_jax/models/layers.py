"""The Flax layers and activations more than one family is built of: the MLP of
ViT, Mixer and Swin blocks, their GELUs, the attention's softmax, LayerNorm and
classifier defaults, the convolution of the ResNets, and the parameter reader
of every family's own modules."""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from vitcnn_jax.models.capturing import Capture

Array = jax.Array

GELUS: dict[str, Callable[[Array], Array]] = {
    # The official checkpoints were trained with Flax's default, the tanh form.
    "tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "exact": lambda x: jax.nn.gelu(x, approximate=False),  # PyTorch's default (timm, DINOv2, MAE)
    "quick": lambda x: x * jax.nn.sigmoid(1.702 * x),  # OpenAI CLIP
}
MLPS = ("gelu", "swiglu")


def get_gelu(name: str) -> Callable[[Array], Array]:
  if name not in GELUS:
    raise ValueError(f"gelu={name!r} is not one of {sorted(GELUS)}.")
  return GELUS[name]


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


def attend(logits: Array, v: Array, capture: Capture, out: dict) -> Array:
  """softmax(logits) @ v over the last axis, the weights kept as the point
  `weights`. Normalised after the product with the values, as fused attention
  kernels do: XLA:CPU ran the product of the normalised weights at under half the
  speed (ViT-B/16, batch 32: 60 against 25 ms a block), and the result is the same
  whether or not the weights are captured."""
  e = jnp.exp(logits - jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True)))
  total = e.sum(axis=-1, keepdims=True)
  if capture.wants("weights"):  # nothing else reads them: not made for an eager caller that did not ask
    capture.put(out, "weights", e / total)
  return (e @ v) / total


def param(module: nn.Module, name: str, init: Callable[..., Array], shape: tuple[int, ...],
          dtype: jnp.dtype = jnp.float32) -> Array:
  """`module.param(name, init, shape, dtype)`, its shape checked against `shape`
  directly where the parameter exists: flax's own check traces the initializer
  for every parameter at every trace (workload W's BiT: 0.15 s of its 0.8 s)."""
  if module.is_initializing() or not module.has_variable("params", name):
    return module.param(name, init, shape, dtype)
  value = module.get_variable("params", name)
  if tuple(value.shape) != tuple(shape):
    raise ValueError(f"parameter {'/'.join((*module.scope.path, name))} has shape {tuple(value.shape)}, "
                     f"and this model needs {tuple(shape)}: the parameters are not this model's "
                     "(load them with its family's loader, which checks every shape).")
  return value


def layer_norm(name: str, eps: float = 1e-6) -> nn.LayerNorm:
  # Flax's defaults (eps 1e-6) are what every upstream ViT and Mixer used (CLIP: 1e-5).
  return nn.LayerNorm(epsilon=eps, name=name)


def dense_head(num_classes: int, name: str = "head", use_bias: bool = True) -> nn.Dense:
  return nn.Dense(num_classes, name=name, use_bias=use_bias, kernel_init=nn.initializers.zeros)


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

"""Model internals: named representation points, capture filters, BiT numerics."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import forward
from support.numerics import (BIT_ROUNDINGS, MIXER_ROUNDINGS, VIT_ROUNDINGS, assert_close, likely,
                              network, worst)
from vitcnn_jax.models import BiT, Mixer, ViT, get_model
from vitcnn_jax.models.bit import model as bit
from vitcnn_jax.models.blocks import MIN_SCAN
from vitcnn_jax.models.capturing import Capture, Row, matches, stacked
from vitcnn_jax.models.param_trees import random_params
from vitcnn_jax.models.vit import model as vit

TINY_VIT = dict(num_classes=5, patch_size=8, image_size=32, width=32, depth=2, mlp_dim=64, num_heads=4)


def _added(out, total: str, a: str, b: str) -> None:
  """`total` is the float32 sum of the captured `a` and `b`: one rounding each side."""
  want = np.asarray(out[a], np.float64) + np.asarray(out[b], np.float64)
  assert_close(out[total], want, worst(2) * float(np.abs(want).max()), f"{total} = {a} + {b}")


def _init(model, size=32):
  """NumPy parameters (`random_params`) and two images of normal noise."""
  x = np.random.default_rng(1).standard_normal((2, size, size, 3)).astype(np.float32)
  return random_params(model, x), x


def test_vit_names_in_network_order_and_shapes():
  model = ViT(**TINY_VIT)
  params, x = _init(model)
  _, out = model.apply({"params": params}, x)
  per_block = ["in", "ln1", "attn/weights", "attn/heads", "attn/out", "attn/residual",
               "ln2", "mlp/hidden", "mlp/out", "out"]
  assert list(out) == (["stem", "embedded"]
                       + [f"block{i:02d}/{n}" for i in range(2) for n in per_block]
                       + ["encoded", "head_input", "pre_logits", "logits"])
  assert out["block01/attn/weights"].shape == (2, 4, 17, 17)
  assert out["block01/attn/heads"].shape == (2, 17, 4, 8)
  # A softmax row: 17 exponentials normalised by their float32 sum.
  assert_close(out["block00/attn/weights"].sum(-1), 1.0, worst(2 * 17), "softmax rows")
  # The block's pieces add up as the names say.
  _added(out, "block00/attn/residual", "block00/in", "block00/attn/out")
  _added(out, "block00/out", "block00/attn/residual", "block00/mlp/out")
  np.testing.assert_array_equal(out["block01/in"], out["block00/out"])


def test_attention_heads_project_to_attention_output():
  model = ViT(**TINY_VIT)
  params, x = _init(model)
  _, out = model.apply({"params": params}, x, capture="block00/attn/*")
  w = params["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_0"]["out"]
  manual = jnp.einsum("bthd,hdo->bto", out["block00/attn/heads"], w["kernel"]) + w["bias"]
  terms = jnp.einsum("bthd,hdo->bto", jnp.abs(out["block00/attn/heads"]), jnp.abs(w["kernel"]))
  # Two float32 evaluations of one 32-term dot (+ bias), relative to the sum of |terms|.
  assert_close(out["block00/attn/out"], manual, 2 * likely(33) * float((terms + jnp.abs(w["bias"])).max()),
               "attn/out")


def test_attention_matches_flax_reference():
  """Our attention equals flax.linen.MultiHeadDotProductAttention with the same params."""
  import flax.linen as nn
  model = ViT(**TINY_VIT)
  params, x = _init(model)
  _, out = model.apply({"params": params}, x, capture=("block00/ln1", "block00/attn/out"))
  ref = nn.MultiHeadDotProductAttention(num_heads=4)
  p = params["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_0"]
  y = ref.apply({"params": p}, out["block00/ln1"], out["block00/ln1"])
  # Two float32 attentions: q/k/v (32 terms), logits (8), softmax (17), values (17), out (32).
  assert_close(out["block00/attn/out"], y, 2 * likely(32, 8, 17, 17, 32) * float(jnp.abs(y).max()),
               "flax attention")


def test_capture_filter_keeps_only_matches_and_logits_unchanged():
  model = ViT(**TINY_VIT)
  params, x = _init(model)
  full, _ = model.apply({"params": params}, x)
  logits, out = model.apply({"params": params}, x, capture=["block01/mlp/*", "encoded"])
  assert list(out) == ["block01/mlp/hidden", "block01/mlp/out", "encoded"]
  np.testing.assert_array_equal(full, logits)
  _, out = model.apply({"params": params}, x, capture=())
  assert out == {}
  assert Capture.of("a*").child("b").wants("xyz") is False


@pytest.mark.parametrize("name,pattern,hit", [
    ("block00/out", "block*/out", True),
    ("block00/attn/out", "block*/out", False),  # `*` stays within a segment
    ("block00/attn/out", "block00/**", True),
    ("map/attn/weights", "**/attn/weights", True),
    ("block1/unit01/conv2", "block[12]/unit0?/conv*", True),
    ("block3/unit01/conv2", "block[12]/unit0?/conv*", False),
    ("blockx00/out", "block.0/out", False),  # no regex semantics
])
def test_capture_globs(name, pattern, hit):
  assert Capture.of(pattern).wants(name) is hit


def test_stacked_takes_rows_and_values_in_any_order():
  """`capturing.stacked` of scan outputs' rows and plain values, in a shuffled
  order, is the values stacked in that order: every row found in its scan's
  output, however the outputs are joined."""
  rng = np.random.default_rng(0)
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  scans = [{"a": normal(k, 2, 3), "b": normal(k)} for k in (3, 4)]
  items = [(Row(s, i), jax.tree.map(lambda v, i=i: v[i], s)) for s in scans for i in range(len(s["b"]))]
  items += [(v, v) for v in ({"a": normal(2, 3), "b": normal()} for _ in range(2))]
  order = rng.permutation(len(items))
  got = stacked([items[i][0] for i in order])
  want = jax.tree.map(lambda *v: np.stack(v), *[items[i][1] for i in order])
  for k in want:
    np.testing.assert_array_equal(got[k], want[k])


def test_capture_under_jit():
  model = ViT(**TINY_VIT)
  params, x = _init(model)
  f = jax.jit(lambda p, x: model.apply({"params": p}, x, capture="block*/out")[1])
  out = f(params, x)
  assert sorted(out) == ["block00/out", "block01/out"]


def test_no_skip_blocks_drop_the_residual():
  model = ViT(**TINY_VIT, no_skip=(1,))
  params, x = _init(model)
  _, out = model.apply({"params": params}, x)
  np.testing.assert_array_equal(out["block01/attn/residual"], out["block01/attn/out"])
  _added(out, "block00/attn/residual", "block00/in", "block00/attn/out")


def test_gelu_default_is_tanh_form():
  assert ViT().gelu == "tanh" and Mixer().gelu == "tanh"
  model = ViT(**TINY_VIT)
  params, x = _init(model)
  _, a = model.apply({"params": params}, x, capture=("block00/ln2", "block00/mlp/hidden"))
  _, b = ViT(**TINY_VIT, gelu="exact").apply({"params": params}, x, capture="block00/mlp/hidden")
  dense = params["Transformer"]["encoderblock_0"]["MlpBlock_0"]["Dense_0"]
  pre = a["block00/ln2"] @ dense["kernel"] + dense["bias"]
  # The Dense evaluated twice (33 terms with the bias); GELU's slope is at most 1.13.
  terms = jnp.abs(a["block00/ln2"]) @ jnp.abs(dense["kernel"]) + jnp.abs(dense["bias"])
  bound = 1.13 * 2 * likely(33) * float(terms.max()) + worst(8)
  assert_close(a["block00/mlp/hidden"], jax.nn.gelu(pre, approximate=True), bound, "tanh GELU")
  assert_close(b["block00/mlp/hidden"], jax.nn.gelu(pre, approximate=False), bound, "exact GELU")
  assert float(jnp.abs(a["block00/mlp/hidden"] - b["block00/mlp/hidden"]).max()) > 2 * bound


def test_variants():
  assert vit.decode_variant("B/16") == dict(width=768, depth=12, mlp_dim=3072, num_heads=12, patch_size=16)
  assert vit.decode_variant("H/14")["depth"] == 32
  with pytest.raises(ValueError, match="Unknown ViT variant 'Q/16'"):
    vit.decode_variant("Q/16")
  with pytest.raises(ValueError, match="Unknown model family"):
    get_model("densenet")
  assert bit.block_sizes(152) == (3, 8, 36, 3)
  with pytest.raises(ValueError, match="depth=34"):
    bit.block_sizes(34)


def test_bit_names_and_unit_arithmetic():
  model = BiT(num_classes=5, width=0.5, depth=(1, 2, 1, 1))
  params, x = _init(model, 64)
  out = forward(model, params, x)
  unit = ["preact", "shortcut", "conv1", "preact2", "conv2", "preact3", "conv3", "out"]
  expected = ["root/conv", "root/pool"]
  for b, n in enumerate((1, 2, 1, 1), 1):
    expected += [f"block{b}/unit{u:02d}/{k}" for u in range(1, n + 1) for k in unit]
  assert list(out) == expected + ["head/preact", "pre_logits", "logits"]
  _added(out, "block2/unit02/out", "block2/unit02/conv3", "block2/unit02/shortcut")
  np.testing.assert_array_equal(out["block2/unit02/shortcut"], out["block2/unit01/out"])
  assert out["root/conv"].shape == (2, 32, 32, 32) and out["root/pool"].shape == (2, 16, 16, 32)
  assert out["block4/unit01/out"].shape == (2, 2, 2, 1024)


@pytest.mark.parametrize("family, path, message", [
    ("bit", "block1/unit01/gn2/scale", r"parameter block1/unit01/gn2/scale has shape \(33,\).*needs \(32,\)"),
    ("bit", "block2/unit03/gn2/scale", r"blocks block2/unit02 and block2/unit03 disagree on .* gn2/scale: "
                                       r"\(64,\) against \(65,\)"),
    ("vit", "pos_embedding", r"parameter pos_embedding has shape \(1, 16, 33\).*needs \(1, 16, 32\)")])
def test_a_parameter_of_another_shape_is_named(family, path, message):
  """A parameter one wider than the model's fails with its path and both
  shapes: checked by `layers.param` (not flax's traced initializer), and across
  the identical blocks that a scan stacks (`blocks`)."""
  model = BiT(num_classes=5, width=0.5, depth=(1, 4, 1, 1)) if family == "bit" else ViT(**TINY_VIT)
  params, x = _init(model)
  *parents, leaf = path.split("/")
  node = functools.reduce(dict.__getitem__, parents, params)
  shape = node[leaf].shape
  node[leaf] = np.zeros(shape[:-1] + (shape[-1] + 1,), np.float32)
  with pytest.raises(ValueError, match=message):
    model.apply({"params": params}, x)


def test_a_missing_block_is_named():
  model = BiT(num_classes=5, width=0.5, depth=(1, 4, 1, 1))
  params, x = _init(model)
  del params["block2"]["unit03"]
  with pytest.raises(ValueError, match="block block2/unit03 are missing"):
    model.apply({"params": params}, x)


def test_bit_max_pool_pads_with_zeros_not_minus_infinity():
  model = BiT(num_classes=5, width=0.5, depth=(1, 1, 1, 1))
  params, x = _init(model, 32)
  out = forward(model, params, x, "root/*")
  conv = np.asarray(out["root/conv"])

  def pool(pad_value):
    padded = np.pad(conv, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=pad_value)
    ref = np.empty((2, 8, 8, conv.shape[-1]), np.float32)
    for i in range(8):
      for j in range(8):
        ref[:, i, j] = padded[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(1, 2))
    return ref

  np.testing.assert_array_equal(out["root/pool"], pool(0.0))
  assert (pool(0.0) != pool(-np.inf)).any()  # the padding value matters for this input


def test_weight_standardisation_and_groupnorm_numerics():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 5, 5, 64)).astype(np.float32)
  gn = bit.GroupNorm()
  p = {"scale": np.ones(64, np.float32), "bias": np.zeros(64, np.float32)}
  y = np.asarray(gn.apply({"params": p}, x))
  g = x.reshape(2, 5, 5, 32, 2).astype(np.float64)
  ref = (g - g.mean(axis=(1, 2, 4), keepdims=True)) / np.sqrt(g.var(axis=(1, 2, 4), keepdims=True) + 1e-5)
  # Mean and variance over 50 values, each relative to the group's scale, then rsqrt.
  assert_close(y, ref.reshape(x.shape), (2 * likely(50) + worst(4)) * float(np.abs(ref).max()), "GroupNorm")

  # A mean 10^4 times the spread: the one-pass statistics are taken about a shift
  # near the mean, so the error stays at the spread's scale (without the shift,
  # E[x^2] - E[x]^2 loses every digit; two passes about the rounded mean miss
  # this bound too, by 1.6e-3 here).
  far = x + np.float32(1e4)
  y = np.asarray(gn.apply({"params": p}, far))
  g = far.reshape(2, 5, 5, 32, 2).astype(np.float64)
  ref = (g - g.mean(axis=(1, 2, 4), keepdims=True)) / np.sqrt(g.var(axis=(1, 2, 4), keepdims=True) + 1e-5)
  assert_close(y, ref.reshape(x.shape), (4 * likely(50) + worst(4)) * float(np.abs(ref).max()),
               "GroupNorm, mean 1e4")

  for stride in (1, 2):  # a 1x1 conv runs as a dot over channels: the same sums
    k1 = rng.standard_normal((1, 1, 64, 8)).astype(np.float32)
    y = np.asarray(bit.StdConv(8, 1, stride).apply({"params": {"kernel": k1}}, x))
    k1d = k1.astype(np.float64)
    ks1 = ((k1d - k1d.mean(axis=(0, 1, 2))) / np.sqrt(k1d.var(axis=(0, 1, 2)) + 1e-10))[0, 0]
    xs = x[:, ::stride, ::stride].astype(np.float64)
    ref, terms = xs @ ks1, np.abs(xs) @ np.abs(ks1)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    assert_close(y, ref, 2 * likely(64) * float(terms.max()), f"1x1 conv, stride {stride}")

  conv = bit.StdConv(8, 3)
  k = rng.standard_normal((3, 3, 64, 8)).astype(np.float32) * 5 + 2
  y = np.asarray(conv.apply({"params": {"kernel": k}}, x))
  kd = k.astype(np.float64)
  ks = (kd - kd.mean(axis=(0, 1, 2))) / np.sqrt(kd.var(axis=(0, 1, 2)) + 1e-10)
  xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
  ref, terms = np.zeros((2, 5, 5, 8)), np.zeros((2, 5, 5, 8))
  for dy in range(3):
    for dx in range(3):
      ref = ref + np.einsum("bhwc,co->bhwo", xp[:, dy:dy + 5, dx:dx + 5], ks[dy, dx])
      terms = terms + np.einsum("bhwc,co->bhwo", np.abs(xp[:, dy:dy + 5, dx:dx + 5]), np.abs(ks[dy, dx]))
  # The conv sums 576 terms; standardising the kernel (mean, variance of 576) perturbs
  # each term by as much again: relative to the sum of |terms|.
  assert_close(y, ref, 2 * likely(576) * float(terms.max()), "standardised conv")


def test_mixer_names():
  model = Mixer(num_classes=5, patch_size=8, image_size=32, hidden_dim=32, num_blocks=2,
                tokens_mlp_dim=8, channels_mlp_dim=64)
  params, x = _init(model)
  _, out = model.apply({"params": params}, x)
  assert out["block01/token_mlp/hidden"].shape == (2, 32, 8)
  _added(out, "block00/out", "block00/token_mlp/residual", "block00/channel_mlp/out")
  assert list(out)[-3:] == ["encoded", "pre_logits", "logits"]


def test_bad_images():
  model = ViT(**TINY_VIT)
  params, _ = _init(model)
  with pytest.raises(ValueError, match=r"NHWC images with 3 channels, got shape \(2, 3, 32, 32\)"):
    model.apply({"params": params}, jnp.zeros((2, 3, 32, 32)))
  with pytest.raises(ValueError, match="not a multiple of patch_size"):
    ViT(**{**TINY_VIT, "image_size": 36}).init(jax.random.PRNGKey(0), jnp.zeros((1, 36, 36, 3)))


@pytest.mark.parametrize("family", sorted(__import__("vitcnn_jax.models", fromlist=["FAMILIES"]).FAMILIES))
def test_a_family_with_attention_names_it_in_its_attention_preset(family):
  """The attention analyses capture the preset "attention" by default: a family
  whose anatomy has attention layers has it, matching every layer's weights."""
  from vitcnn_jax.models import FAMILIES
  model = FAMILIES[family].module()
  layers = model.attention()
  assert ("attention" in model.layer_presets) == bool(layers), family
  for layer in layers:
    assert matches(layer.weights, model.layer_presets["attention"]), (family, layer.weights)


DOTS = ("dot_general", "conv_general_dilated")
SLICES = ("slice", "squeeze", "dynamic_slice", "gather")  # what taking one block's value out of a stack makes


def _count(jaxpr, primitives: tuple[str, ...] = DOTS) -> int:
  """Equations of `primitives` in `jaxpr` and the jaxprs inside it (a scan's body
  once)."""
  total = 0
  for eqn in jaxpr.eqns:
    total += eqn.primitive.name in primitives
    for sub in eqn.params.values():
      for j in sub if isinstance(sub, (list, tuple)) else [sub]:
        total += (_count(j.jaxpr, primitives) if hasattr(j, "jaxpr")
                  else _count(j, primitives) if hasattr(j, "eqns") else 0)
  return total


def test_a_blocks_points_are_evaluated_once_whatever_the_batch(monkeypatch):
  """Listing a model's points and tracing its steps ask for the points of the same
  blocks (`blocks._block_points`): evaluated once, whatever the batch; a block of
  other fields or parameters (a ResNet's bottleneck after its basic unit, which
  has no conv3) is evaluated anew, and its points are captured as asked."""
  from vitcnn_jax.models import ResNet, blocks
  monkeypatch.setattr(blocks, "_POINTS", blocks.collections.OrderedDict())
  evaluated = []
  real = jax.eval_shape

  def counting(fn, *args):
    evaluated.append(fn.__qualname__.startswith("_block_points"))
    return real(fn, *args)
  monkeypatch.setattr(jax, "eval_shape", counting)
  model = ViT(**{**TINY_VIT, "depth": MIN_SCAN})
  params, _ = _init(model)
  names = []
  for batch in (2, 3):
    x = jnp.zeros((batch, 32, 32, 3))
    names.append(list(jax.eval_shape(lambda p, x: model.apply({"params": p}, x)[1], params, x)))
  assert sum(evaluated) == 1, evaluated
  assert names[0] == names[1] and "block02/mlp/hidden" in names[0], names
  last = f"block1/unit{MIN_SCAN + 1:02d}/conv3"
  for kind in ("basic", "bottleneck"):
    net = ResNet(num_classes=5, depth=(MIN_SCAN + 1,), widths=(8,), stem_width=8, block=kind)
    params, x = _init(net)
    got = jax.eval_shape(lambda p, x, net=net: net.apply({"params": p}, x, capture=(last,))[1], params, x)
  assert sum(evaluated) == 3, evaluated
  assert list(got) == [last], list(got)


@pytest.mark.parametrize("family", ["vit", "bit", "resnet", "mixer"])
def test_identical_blocks_are_one_scan_and_every_point_keeps_its_value(family):
  """A ViT's and a Mixer's blocks, and the units after each stage's first of a BiT
  and a ResNet, are traced once (`blocks.run_blocks`): a deeper network has no
  more dots to compile. Captured alone, with the rest, or reduced where it is made
  (`Capture.reduce`), every point has its value and the network's order; points
  wanted by some blocks only split the scan, and the logits stay bit-equal.
  Reduced points stacked (`capturing.stacked`) take no more slices in a deeper
  network: no block's value is sliced out of the scan's output."""
  from vitcnn_jax.models import representations
  from vitcnn_jax.models import ResNet
  from vitcnn_jax.similarity import grams
  make = {"vit": lambda d: ViT(**{**TINY_VIT, "depth": d}),
          "bit": lambda d: BiT(num_classes=5, width=0.5, depth=(1, d + 1)),  # d units after the first
          "resnet": lambda d: ResNet(num_classes=5, depth=(1, d + 1), widths=(8, 16), stem_width=8,
                                     block="basic"),
          "mixer": lambda d: Mixer(num_classes=5, patch_size=8, image_size=32, hidden_dim=16, num_blocks=d,
                                   tokens_mlp_dim=8, channels_mlp_dim=32)}[family]
  gram_capture = Capture(None, reduce=grams.scaled_layer)  # made inside the scan: a block's points are `Row`s
  reduced = lambda m, p, x: stacked(list(m.apply({"params": p}, x, capture=gram_capture)[1].values()))
  dots, trained, slices = [], [], []
  for depth in (MIN_SCAN, MIN_SCAN + 1):
    model = make(depth)
    params, x = _init(model)
    params = jax.tree_util.tree_map_with_path(  # BatchNorm variances drawn positive
        lambda path, v: np.abs(v) + 0.5 if path[-1].key == "var" else v, params)
    for train, count in ((False, dots), (True, trained)):
      count.append(_count(jax.make_jaxpr(lambda p, x, m=model, t=train: m.apply({"params": p}, x, train=t))(
          params, x).jaxpr))
    slices.append(_count(jax.make_jaxpr(lambda p, x, m=model: reduced(m, p, x))(params, x).jaxpr, SLICES))
  assert dots[0] == dots[1], dots  # unrolled, one more block would add its dots and convolutions
  assert trained[0] < trained[1], trained  # trained (differentiated): block by block, faster there
  assert slices[0] == slices[1], slices  # each block's points sliced out of the scan's stack, then stacked again
  f = jax.jit(lambda p, x, capture: model.apply({"params": p}, x, capture=capture), static_argnums=2)
  logits, full = f(params, x, None)
  order = list(representations.point_shapes(model, params))  # the network's order, as traced
  last = [k for k in order if k.startswith("block")][-1]
  some = (last.rsplit("/", 1)[0] + "/**", "logits")  # one block's points: the scan splits around it
  got_logits, got = f(params, x, some)
  assert list(representations.point_shapes(model, params, some)) == [k for k in order if matches(k, some)]
  # Two programs of one network: XLA fuses a norm differently when a point is an output
  # (BiT's logits moved by 6e-8 with the capture before blocks were scanned too).
  # Each output's roundings are those of the largest values that flow into it (logits
  # can cancel far below them): the bound is relative to the network's largest point.
  scale = max(float(np.abs(v).max()) for v in full.values())
  rel = network({"vit": VIT_ROUNDINGS, "mixer": MIXER_ROUNDINGS}.get(family, BIT_ROUNDINGS))
  for k, v in [("logits", got_logits), *got.items()]:
    assert_close(v, logits if k == "logits" else full[k], rel * scale, k)
  layers = jax.jit(lambda p, x: reduced(model, p, x))(params, x)  # every point, in the network's order
  assert layers.gram.shape[0] == len(order)
  for i, k in enumerate(order):
    v, lay = full[k], jax.tree.map(lambda a, i=i: a[i], layers)
    rows = np.asarray(v, np.float64).reshape(len(v), -1)
    c = rows - rows.mean(0)
    want = np.ldexp(c @ c.T, -2 * int(lay.e))  # the centred rows' Gram at the layer's scale
    # float32: centring on the mean of 2 rows errs by a rounding of the rows themselves,
    # and each entry sums `features` products: (2 + features) u max ||x_i||^2.
    bound = worst(2, rows.shape[1]) * np.ldexp(float((rows ** 2).sum(1).max()), -2 * int(lay.e))
    assert_close(lay.gram, want, bound, k)

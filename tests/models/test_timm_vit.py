"""ViTs of today's families, as timm publishes them (safetensors state dicts):
built by timm with random weights, loaded by us, same outputs."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from conftest import compiled
from support import timm_ref
from support.numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints

torch = timm_ref.torch
TOL = network(VIT_ROUNDINGS)  # the tiny model of test_parity_timm, a few more norms
TINY = dict(patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0)
LN5 = functools.partial(torch.nn.LayerNorm, eps=1e-5)

# name -> (timm constructor arguments beyond TINY, our overrides, what the file shows)
FAMILIES = {
    "deit": (dict(num_classes=7), {}, dict(pool="token", class_token=True)),
    "deit_distilled": (dict(num_classes=7, distilled=True), {}, dict(distilled=True)),
    "deit3": (dict(num_classes=7, no_embed_class=True, init_values=1e-5), {},
              dict(layer_scale=True, pool="token")),
    "dinov2": (dict(num_classes=0, init_values=1e-5), {}, dict(layer_scale=True, num_classes=None)),
    "dinov2_reg": (dict(num_classes=0, init_values=1e-5, reg_tokens=4, no_embed_class=True), {},
                   dict(num_registers=4)),
    "dinov2_swiglu": (dict(num_classes=0, init_values=1e-5, mlp_ratio=4.0,
                           mlp_layer=timm_ref.timm.layers.SwiGLUPacked, act_layer=torch.nn.SiLU),
                      {}, dict(mlp="swiglu", mlp_dim=96)),
    "mae_finetuned": (dict(num_classes=7, global_pool="avg"), {}, dict(pool="gap", fc_norm=True)),
    "clip_openai": (dict(num_classes=5, pre_norm=True, norm_layer=LN5, act_layer="quick_gelu"),
                    dict(gelu="quick"), dict(pre_norm=True, patch_bias=False, ln_eps=1e-5)),
    "openclip": (dict(num_classes=5, pre_norm=True, norm_layer=LN5), {}, dict(pre_norm=True)),
    "siglip": (dict(num_classes=0, class_token=False, global_pool="map",
                    act_layer="gelu_tanh"), dict(gelu="tanh"), dict(pool="map", class_token=False)),
    "no_qkv_bias": (dict(num_classes=7, qkv_bias=False), {}, {}),
}


def _images(n: int = 3, size: int = 32) -> np.ndarray:
  return np.random.default_rng(1).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_timm_file_matches_timm(tmp_path, family):
  kwargs, overrides, shows = FAMILIES[family]
  x = _images()
  path = tmp_path / f"{family}.safetensors"
  ref = timm_ref.timm_vit_file(path, x, features=not kwargs["num_classes"], **{**TINY, **kwargs})
  model, params = checkpoints.load_model(str(path), num_heads=3, **overrides)
  for field, value in shows.items():
    assert getattr(model, field) == value, (family, field, getattr(model, field))
  out, _ = compiled(model, params, x)
  scale = float(np.abs(ref).max())
  assert scale > 1e-2
  assert_close(out, ref, TOL * scale, family)


def test_other_resolution_resamples_as_timm(tmp_path):
  """At another resolution timm resamples pos_embed (bicubic, antialiased);
  so do we for its files, shrinking and growing."""
  path = tmp_path / "dinov2.safetensors"
  kwargs = dict(TINY, num_classes=7, init_values=1e-5)
  timm_ref.timm_vit_file(path, _images(), **kwargs)
  import safetensors.torch
  state = safetensors.torch.load_file(str(path))
  for size in (24, 56):
    x = _images(size=size)
    ref_model = timm_ref.timm_vit.VisionTransformer(img_size=size, **kwargs).eval()
    ref_model.load_state_dict(timm_ref.timm_vit.checkpoint_filter_fn(state, ref_model))
    with torch.no_grad():
      ref = ref_model(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
    model, params = checkpoints.load_model(str(path), num_heads=3, resolution=size)
    out, _ = compiled(model, params, x)
    assert_close(out, ref, TOL * float(np.abs(ref).max()), f"resolution {size}")


@pytest.mark.parametrize("family", ["dinov2_reg", "siglip", "clip_openai"])
def test_saved_timm_file_loads_in_timm(tmp_path, family):
  """Our params written as a timm state dict (prefix tokens with their embedding
  folded in, hence no_embed_class) load strictly into timm and compute the same."""
  kwargs, overrides, _ = FAMILIES[family]
  kwargs = {**TINY, **kwargs}
  x = _images()
  ref = timm_ref.timm_vit_file(tmp_path / "a.safetensors", x, features=True, **kwargs)
  model, params = checkpoints.load_model(str(tmp_path / "a.safetensors"), num_heads=3,
                                         **overrides)
  checkpoints.save(str(tmp_path / "b.safetensors"), model, params)
  import safetensors.torch
  state = safetensors.torch.load_file(str(tmp_path / "b.safetensors"))
  again = timm_ref.timm_vit.VisionTransformer(img_size=32, **{**kwargs, "no_embed_class": True})
  again.load_state_dict(state, strict=True)
  out = timm_ref._run(again, x, features=True)
  assert_close(out, ref, TOL * float(np.abs(ref).max()), family)
  if family == "siglip":  # nothing beyond Google's options: big_vision's npz holds it
    checkpoints.save(str(tmp_path / "c.npz"), model, params)
    model, params = checkpoints.load_model(str(tmp_path / "c.npz"))
    out, _ = compiled(model, params, x, capture="head_input")
    assert_close(out, ref, TOL * float(np.abs(ref).max()), "siglip via big_vision npz")
  else:
    with pytest.raises(ValueError, match="save as .safetensors"):
      checkpoints.save(str(tmp_path / "c.npz"), model, params)

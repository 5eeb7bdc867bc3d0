"""Swin Transformers as timm and transformers build them: tiny random models
saved in each layout (timm's state dict with its config.json; transformers'
save_pretrained folder), loaded by us with nothing assumed, matching each
upstream at every stage's output and at the logits."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compiled, load_stating_everything
from support import hf_ref
from support import timm_ref
from support.numerics import VIT_ROUNDINGS, assert_close, likely, network
from vitcnn_jax import checkpoints
from vitcnn_jax.analyses import attention_distance as ad

torch, timm, T = timm_ref.torch, timm_ref.timm, hf_ref.transformers
TOL = network(VIT_ROUNDINGS)
# 16x16 then 8x8 maps in 4x4 windows: shifted windows and their mask in both stages.
TINY = dict(img_size=32, patch_size=2, embed_dim=8, depths=(2, 2), num_heads=(1, 2), window_size=4)
POINTS = ["stage0/block01/out", "stage1/block01/out"]


def _images() -> np.ndarray:
  return np.random.default_rng(5).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("swin")
  tm = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=5, **TINY)
  tm = hf_ref.randomized(tm, 0)
  timm.models.save_for_hf(tm, str(root / "timm"), safe_serialization=True)
  hm = hf_ref.randomized(T.SwinForImageClassification(T.SwinConfig(
      num_labels=5, image_size=32, patch_size=2, embed_dim=8, depths=[2, 2], num_heads=[1, 2],
      window_size=4)), 1)
  return {"timm": (str(root / "timm"), tm),
          "hf": (hf_ref.save(hm, root / "hf"), hm)}


def _reference(name: str, model, x: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
  pix = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
  with torch.no_grad():
    if name == "timm":
      y, stages = model.patch_embed(pix), []
      for layer in model.layers:
        y = layer(y)
        stages.append(y.numpy())
      return stages, model(pix).numpy()
    out = model(pixel_values=pix, output_hidden_states=True,
                output_hidden_states_before_downsampling=True)
    return [h.numpy().transpose(0, 2, 3, 1) for h in out.reshaped_hidden_states[1:]], out.logits.numpy()


@pytest.mark.parametrize("name", ["timm", "hf"])
def test_swin_matches_its_upstream_at_every_stage(folders, name, caplog):
  folder, model = folders[name]
  c = load_stating_everything(folder, caplog)
  m = c.model
  assert (m.family, m.depths, m.heads, m.window, m.embed_dim, m.image_size) == (
      "swin", (2, 2), (1, 2), 4, 8, 32)
  x = _images()
  stages, logits = _reference(name, model, x)
  out, points = compiled(m, c.params, x, capture=POINTS)
  for point, ref in zip(POINTS, stages):
    assert_close(points[point], ref, TOL * float(np.abs(ref).max()), f"{name} {point}")
  assert_close(out, logits, TOL * float(np.abs(logits).max()), f"{name} logits")


def test_swin_attention_distances_match_transformers_windows_on_the_image(folders):
  """Each block's head distances from our weights and `attention()` geometry against
  transformers' own attention weights, its windows placed by its own roll and
  window partition: shifted windows in both stages, masked pairs included."""
  from transformers.models.swin import modeling_swin as ms
  folder, hm = folders["hf"]
  c = checkpoints.load(folder)
  x = _images()
  _, out = compiled(c.model, c.params, x, capture=c.model.layer_presets["attention"])
  hm.set_attn_implementation("eager")
  weights = []
  hooks = [m.register_forward_hook(lambda m, i, o: weights.append(o[1].numpy()))
           for m in hm.modules() if isinstance(m, ms.SwinAttention)]
  with torch.no_grad():
    hm(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
  for h in hooks:
    h.remove()
  blocks = [m for m in hm.modules() if isinstance(m, ms.SwinLayer)]
  layers = c.model.attention()
  assert [a.num_heads for a in layers] == [1, 1, 2, 2] and len(weights) == len(blocks) == 4
  shifts = []
  for layer, w, block in zip(layers, weights, blocks):
    size, pixels = block.input_resolution[0], 32 // block.input_resolution[0]
    ws, shift = block.window_size, block.shift_size
    shifts.append(shift)
    at = torch.stack(torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij"), -1)[None]
    at = ms.window_partition(torch.roll(at.double(), (-shift, -shift), (1, 2)), ws)
    centres = (at.reshape(-1, ws * ws, 2).numpy() + 0.5) * pixels
    d = np.linalg.norm(centres[:, :, None] - centres[:, None], axis=-1)
    w = w.astype(np.float64).reshape(len(x), -1, *w.shape[1:])  # (B, windows, H, N, N)
    ref = (w * d[None, :, None]).sum(-1).mean(axis=(1, 3)).mean(0)
    got = np.asarray(ad.mean_distance(out[layer.weights], jnp.asarray(ad.distances(layer), jnp.float32),
                                      layer.num_prefix)).mean(0)
    # Weights of two float32 forwards, then windows x N x N products summed.
    assert_close(got, ref, d.max() * (TOL + likely(d.size)), layer.weights)
    if shift:  # the mask: only pairs within one region of the rolled map attend
      assert_close(np.where(layer.allowed[None, :, None], 0, w), 0, 1e-30, "masked weights")
  assert shifts == [0, 2, 0, 2]


def test_swin_heads_through_their_projection_give_the_attention_output(folders):
  """Per-head outputs (window after window) through `head_projection`, placed on
  the map by `attention()`'s token centres, give the block's attention output: an
  unshifted block and a shifted one, where the roll must be undone."""
  c = checkpoints.load(folders["hf"][0])
  m = c.model
  x = _images()
  for layer in m.attention()[:2]:
    prefix = layer.weights.removesuffix("/weights")
    _, out = compiled(m, c.params, x, capture=[f"{prefix}/heads", f"{prefix}/out"])
    kernel = np.asarray(m.head_projection(c.params, layer.block), np.float64)
    stage, block = prefix.split("/")[:2]
    bias = np.asarray(c.params[f"{stage}_{block}"]["attn"]["out"]["bias"], np.float64)
    y = np.einsum("bthd,hdc->btc", np.asarray(out[f"{prefix}/heads"], np.float64), kernel) + bias
    rows, cols = (layer.positions.reshape(-1, 2) // 2).astype(int).T  # 2 px tokens in stage 0
    placed = np.zeros(out[f"{prefix}/out"].shape)
    placed[:, rows, cols] = y
    ref = np.asarray(out[f"{prefix}/out"])
    assert_close(placed, ref, TOL * float(np.abs(ref).max()), prefix)


def test_a_map_smaller_than_the_window_is_refused(folders):
  """At 16 px the second stage's map (4x4) is one window, unshifted (as both
  upstreams: the published models' last stage); at 8 px it is 2x2, refused."""
  c = checkpoints.load(folders["timm"][0], resolution=16)
  out, _ = compiled(c.model, c.params, np.zeros((1, 16, 16, 3), np.float32))
  assert np.isfinite(out).all()
  last = c.model.attention()[-1]  # stage 1, block 1: shifted but for its size
  assert last.positions.shape == (1, 16, 2) and last.allowed is None
  with pytest.raises(ValueError, match=r"2x2 map is smaller than the 4x4 window"):
    c.model.apply({"params": c.params}, np.zeros((1, 8, 8, 3), np.float32))

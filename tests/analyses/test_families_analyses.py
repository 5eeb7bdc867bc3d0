"""Every analysis on today's families (timm-layout ViTs with registers or a
distillation token, ConvNeXt v2) where its definition applies, and a clear
refusal where it does not."""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

from conftest import NO_FIGURES, ROOT
from support import forked
from support import timm_ref
from support import upstream_files as uf
import vitcnn_jax as vj
from vitcnn_jax import checkpoints

N = 16


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("families")
  x = np.zeros((1, 32, 32, 3), np.float32)
  vit = dict(patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0)
  timm_ref.timm_vit_file(d / "reg.safetensors", x, num_classes=0, init_values=1e-5, reg_tokens=2,
                         no_embed_class=True, **vit)
  timm_ref.timm_vit_file(d / "deit.safetensors", x, num_classes=5, distilled=True, **vit)
  timm_ref.timm_convnext_file(d / "cnx.safetensors", np.zeros((1, 64, 64, 3), np.float32),
                              depths=(1, 1, 1, 1), dims=(8, 16, 24, 32), num_classes=5,
                              use_grn=True, ls_init_value=None)
  return {"reg": {"checkpoint": str(d / "reg.safetensors"), "num_heads": 3},
          "deit": {"checkpoint": str(d / "deit.safetensors"), "num_heads": 3},
          "cnx": {"checkpoint": str(d / "cnx.safetensors"), "resolution": 64}}


@pytest.fixture(scope="module")
def images():
  rng = np.random.default_rng(0)
  return rng.integers(0, 256, (N, 32, 32, 3)).astype(np.uint8), np.arange(N) % 2


def test_prefix_tokens_are_named(files):
  reg, _ = checkpoints.load_model(files["reg"]["checkpoint"], num_heads=3)
  deit, _ = checkpoints.load_model(files["deit"]["checkpoint"], num_heads=3)
  assert reg.prefix_tokens == ("cls", "reg", "reg") and deit.prefix_tokens == ("cls", "dist")


def test_cka_pc_share_skip_ratio_receptive_field_and_probes_run_on_all(files, images):
  grey, labels = images
  small = dict(batch_size=8, num_examples=N, **NO_FIGURES)
  r = vj.cka(files, grey, layers="blocks", repeats=1, **small)
  assert {k for k in r.arrays if k.startswith("cka_")} >= {"cka_cnx_deit", "cka_reg_reg"}
  assert all(np.isfinite(r[k]).all() for k in r.arrays if k.startswith("cka_"))
  np.testing.assert_allclose(np.diag(r["cka_cnx_cnx"]), 1, atol=1e-5)
  r = vj.pc_share(files, grey, layers="blocks", **small)
  assert r.summary["models"].keys() == files.keys()
  r = vj.skip_ratio(files, grey, **small)
  for k in files:  # a token model's ratios per token (prefix tokens first), a CNN's per block
    assert np.isfinite(r[f"{k}_ratio"]).all() and (r[f"{k}_ratio"] > 0).all()
  assert r["cnx_ratio"].shape == (4,) and r["reg_ratio"].shape == (2, 2, 4 * 4 + 3)
  assert r.summary["models"]["reg"]["prefix_tokens"] == ["cls", "reg", "reg"]
  r = vj.receptive_field(files, grey, num_examples=4, batch_size=4, **NO_FIGURES)
  assert r["cnx_maps"].shape[1:] == (64, 64) and r["reg_maps"].shape[1:] == (32, 32)
  r = vj.linear_probe(files, grey, labels=labels, test=(grey, labels), layers="blocks",
                      batch_size=8, shots=2, seeds=1, **NO_FIGURES)
  assert set(r.summary["models"]) == set(files)


def test_token_analyses_say_which_tokens_they_use(files, images):
  grey, _ = images
  r = vj.attention_distance({"vit": files["reg"]}, grey, batch_size=8, num_examples=N, **NO_FIGURES)
  assert r["mean_distance"].shape == (2, 3)  # blocks, heads
  assert r.summary["prefix_tokens"] == ["cls", "reg", "reg"]
  r = vj.localization({"deit": files["deit"]}, grey, batch_size=8, num_examples=N, **NO_FIGURES)
  assert r.summary["prefix_tokens"] == ["cls", "dist"]
  labels = np.arange(N) % 2
  r = vj.linear_probe({"reg": {**files["reg"], "features": ("each",)}}, grey, labels=labels,
                      test=(grey, labels), layers="block01/out", batch_size=8, shots=2, seeds=1,
                      **NO_FIGURES)
  per_token = [v for k, v in r.arrays.items() if k.startswith("accuracy/")]
  assert [a.shape[1] for a in per_token] == [3 + 16]  # a probe per token, prefix tokens first
  assert r.summary["prefix_tokens"] == {"reg": ["cls", "reg", "reg"]}
  np.testing.assert_allclose(r.summary["models"]["reg"]["each"]["accuracy"][0],
                             per_token[0][:, 3:].mean())  # the json's mean: spatial tokens only


@pytest.mark.parametrize("analysis,models", [
    ("attention_distance", {"vit": "cnx"}),
    ("localization", {"cnx": "cnx"}),
    ("head_subsets", {"vit": "cnx", "resnet": "deit"}),
])
def test_analyses_that_do_not_apply_refuse(files, images, analysis, models):
  with pytest.raises(ValueError, match=r"needs a model with (attention|tokens).*ConvNeXt has none"):
    getattr(vj, analysis)({k: files[v] for k, v in models.items()}, images[0], batch_size=8,
                          num_examples=N)


def test_loading_every_family_imports_no_torch(files, tmp_path):
  """Published formats are read without torch (safetensors' NumPy interface): a
  new process (forked from one that has imported main.py's modules, not torch)
  loads and runs one file of each family and format, then checks that neither
  torch, timm nor transformers (installed here, for the tests) was imported."""
  paths = [files["reg"]["checkpoint"], files["deit"]["checkpoint"], files["cnx"]["checkpoint"],
           uf.save(tmp_path / "vit.npz", uf.vt_vit(0)), uf.save(tmp_path / "bv.npz", uf.bv_vit(0)),
           uf.save(tmp_path / "bit.npz", uf.bt_bit(0)), uf.save(tmp_path / "mixer.npz", uf.mixer(0))]
  code = textwrap.dedent("""
      import sys
      import jax
      import numpy as np
      from vitcnn_jax import checkpoints
      for path in sys.argv[1:]:
        model, params = checkpoints.load_model(path, **({"num_heads": 3} if "safetensors" in path
                                                        and "cnx" not in path else {}))
        size = model.image_size if isinstance(model.image_size, int) else 64
        out, _ = jax.jit(model.apply)({"params": params}, np.zeros((1, size, size, 3), np.float32))
        assert np.isfinite(out).all(), path
      loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "timm", "transformers"))
      print("IMPORTED", loaded)
  """)
  done = forked.start(["-c", code, *paths], dict(os.environ), ROOT).wait(300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "IMPORTED []" in done.stdout, done.stdout


def test_each_models_preprocessing_and_assumptions_are_printed_and_recorded(files, images, caplog):
  import json
  import logging
  with caplog.at_level(logging.WARNING, logger="vitcnn_jax"):
    r = vj.pc_share({**files, "gray": {**files["deit"], "policy": "resize"}}, images[0],
                    layers="blocks", batch_size=8, num_examples=N, **NO_FIGURES)
  with open(f"{r.workdir}/pc_share.json") as f:
    loaded = json.load(f)["models loaded"]
  assert loaded["cnx"]["policy"] == "bicubic_crop0.875_imagenet" and not loaded["cnx"]["assumed"]
  assert loaded["reg"]["policy"] == "bicubic_crop0.9_imagenet"
  assert loaded["reg"]["assumed"] == {"gelu": "exact", "ln_eps": 1e-6}
  assert "timm" in loaded["reg"]["policy from"] and "mean (0.485" in loaded["reg"]["preprocessing"]
  assert (loaded["gray"]["policy"], loaded["gray"]["policy from"]) == ("resize", "the config")
  lines = [m for m in caplog.messages if "preprocessing" in m]
  assert len(lines) == 3 and all("\n" not in m for m in lines)  # one line per bare file
  assert any(m.startswith("models['cnx']: preprocessing bicubic_crop0.875_imagenet") for m in lines)  # its dict


@pytest.mark.parametrize("name,family,policy", [
    ("reg", "vit", "bicubic_crop0.9_imagenet"), ("cnx", "convnext", "bicubic_crop0.875_imagenet"),
    ("google", "vit", "resize")])
def test_inspect_prints_each_familys_architecture_and_preprocessing(files, tmp_path, capsys, name,
                                                                    family, policy):
  import ml_collections
  from configs import inspect as inspect_config
  from vitcnn_jax import describe
  path = (uf.save(tmp_path / "g.npz", uf.vt_vit(0)) if name == "google"
          else files[name]["checkpoint"])
  config = inspect_config.get_config(path)
  if name == "reg":
    config.overrides.num_heads = 3
  s = describe.run(ml_collections.ConfigDict(config), str(tmp_path))
  out = capsys.readouterr().out
  assert s["family"] == family and s["policy"] == policy
  assert out.startswith(f"{family} (") and f"preprocessing        {policy}: " in out
  assert "mean (" in out and "parameters" in out


def test_attention_distance_of_several_models_equals_each_alone(files, images):
  """DINO against CLIP, say: each model's distances as if run alone; the first
  in name order gives the top-level results and figure, a comparison figure shows all."""
  import os
  grey, _ = images
  both = vj.attention_distance({"reg": files["reg"], "deit": files["deit"]}, grey, batch_size=8,
                               num_examples=N)
  for name in ("reg", "deit"):
    alone = vj.attention_distance({name: files[name]}, grey, batch_size=8, num_examples=N,
                                  **NO_FIGURES)
    np.testing.assert_allclose(both[f"mean_distance_{name}"], alone["mean_distance"], rtol=1e-6)
    assert both.summary["models"][name]["prefix_tokens"] == alone.summary["prefix_tokens"]
  np.testing.assert_array_equal(both["mean_distance"], both["mean_distance_deit"])
  assert both.summary["prefix_tokens"] == ["cls", "dist"]
  assert {"attention_distance.png", "attention_distance_reg.png",
          "attention_distance_compare.png"} <= set(os.listdir(both.workdir))


def test_head_subsets_and_reference_cka_on_todays_families(files, images):
  """Head subsets of a timm ViT against a ConvNeXt's lower layers; reference CKA
  of a timm ViT with registers against a distilled DeiT as the reference."""
  grey, labels = images
  r = vj.head_subsets({"vit": {**files["reg"], "capture": "all"},
                       "resnet": {**files["cnx"], "capture": "stage0/**"}}, grey, batch_size=8,
                      num_examples=N, **NO_FIGURES)
  assert np.isfinite(r["cka"]).all() and r["cka"].shape[0] == 3  # 3 windows of 1 of 3 heads
  r = vj.reference_cka({"deit": files["deit"], "reg": files["reg"]}, grey, labels=labels,
                       reference="deit", layers="blocks", batch_size=8, num_examples=N, repeats=1,
                       **NO_FIGURES)
  assert any(k.startswith("cka_") for k in r.arrays)
  assert all(np.isfinite(v).all() for k, v in r.arrays.items() if k.startswith("cka_"))


def test_a_convnext_in_memory_is_preprocessed_as_its_file(files, images):
  """Handed over as (model, params), a ConvNeXt keeps timm's ImageNet
  normalisation, as loaded by path: the same numbers either way."""
  import json
  model, params = checkpoints.load_model(files["cnx"]["checkpoint"], resolution=64)
  small = dict(layers="blocks", batch_size=8, num_examples=N, **NO_FIGURES)
  by_path = vj.pc_share({"cnx": files["cnx"]}, images[0], **small)
  in_memory = vj.pc_share({"cnx": (model, params)}, images[0], **small)
  with open(f"{in_memory.workdir}/pc_share.json") as f:
    assert json.load(f)["models loaded"]["cnx"]["policy"] == "bicubic_crop0.875_imagenet"
  np.testing.assert_array_equal(in_memory["share_cnx"], by_path["share_cnx"])  # one program, same inputs

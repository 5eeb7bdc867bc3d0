"""ViTs in Hugging Face transformers' layouts: tiny random models saved by
transformers' own `save_pretrained` (config.json beside model.safetensors), loaded
by us from the folder with nothing assumed, matching transformers' forward at
every layer's output and at the pooled or classifier output."""

from __future__ import annotations

import logging
import os
import shutil
import textwrap

import numpy as np
import pytest

from conftest import ROOT, compiled, load_stating_everything
from support import forked
from support import hf_ref
from support.numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints
from vitcnn_jax.inputs import preprocess

T = hf_ref.transformers
TOL = network(VIT_ROUNDINGS)
SMALL = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, image_size=32, patch_size=8)
TEXT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            vocab_size=64, max_position_embeddings=8)

# name -> (model class, config, the output ours gives as its last point, what the file shows)
MODELS = {
    "vit_classifier": (T.ViTForImageClassification, T.ViTConfig(num_labels=5, intermediate_size=96, **SMALL),
                       "logits", dict(pool="token", num_classes=5)),
    "vit_pooler": (T.ViTModel, T.ViTConfig(intermediate_size=96, layer_norm_eps=1e-6, **SMALL),
                   "pooler_output", dict(representation_size=48, ln_eps=1e-6)),
    "dinov2": (T.Dinov2Model, T.Dinov2Config(mlp_ratio=2, **SMALL), "pooler_output",
               dict(layer_scale=True)),
    "dinov2_swiglu_classifier": (
        T.Dinov2ForImageClassification, T.Dinov2Config(num_labels=4, use_swiglu_ffn=True, **SMALL),
        "logits", dict(mlp="swiglu", pool="token_gap")),
    "dinov2_registers": (T.Dinov2WithRegistersModel,
                         T.Dinov2WithRegistersConfig(num_register_tokens=2, mlp_ratio=2, **SMALL),
                         "pooler_output", dict(num_registers=2)),
    "clip": (T.CLIPModel, T.CLIPConfig(vision_config=dict(intermediate_size=96, **SMALL),
                                       text_config=TEXT, projection_dim=8),
             "image_embeds", dict(gelu="quick", pre_norm=True, ln_eps=1e-5, num_classes=8,
                                  head_bias=False)),
    "siglip": (T.SiglipModel, T.SiglipConfig(vision_config=dict(intermediate_size=96, **SMALL),
                                             text_config=TEXT),
               "vision_pooler", dict(gelu="tanh", pool="map", class_token=False)),
    "siglip2": (T.Siglip2Model, T.Siglip2Config(
        vision_config=dict(intermediate_size=96, num_patches=16,
                           **{k: v for k, v in SMALL.items() if k != "image_size"}), text_config=TEXT),
                "vision_pooler", dict(gelu="tanh", pool="map", class_token=False, image_size=32)),
    "dinov3": (T.DINOv3ViTModel, T.DINOv3ViTConfig(intermediate_size=96, num_register_tokens=2,
                                                   **{**SMALL, "num_attention_heads": 2}),
               "pooler_output", dict(rope="dinov3", num_registers=2, posemb="none", layer_scale=True)),
    "dinov3_gated": (T.DINOv3ViTModel, T.DINOv3ViTConfig(intermediate_size=64, use_gated_mlp=True,
                                                         hidden_act="silu", rope_theta=50.0,
                                                         **{**SMALL, "num_attention_heads": 2}),
                     "pooler_output", dict(rope="dinov3", mlp="swiglu", rope_theta=50.0)),
    # Vision towers saved alone: transformers 5 writes their keys without `vision_model.`.
    "clip_vision": (T.CLIPVisionModel, T.CLIPVisionConfig(intermediate_size=96, **SMALL), "pooler_output",
                    dict(gelu="quick", pre_norm=True, ln_eps=1e-5, pool="token", num_classes=None)),
    "siglip_vision": (T.SiglipVisionModel, T.SiglipVisionConfig(intermediate_size=96, **SMALL),
                      "pooler_output", dict(gelu="tanh", pool="map", class_token=False)),
    "siglip2_vision": (T.Siglip2VisionModel, T.Siglip2VisionConfig(
        intermediate_size=96, num_patches=16, **{k: v for k, v in SMALL.items() if k != "image_size"}),
                       "pooler_output", dict(gelu="tanh", pool="map", class_token=False, image_size=32)),
}
TOWERS = {"clip_vision": "clip_vision_model", "siglip_vision": "siglip_vision_model",
          "siglip2_vision": "siglip2_vision_model"}


def _images(size: int = 32, n: int = 2) -> np.ndarray:
  return np.random.default_rng(3).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def _reference(name: str, model, x: np.ndarray, **kwargs) -> tuple[list[np.ndarray], np.ndarray]:
  """transformers' layer outputs and final output of `model` on `x`."""
  if name == "clip":
    out = hf_ref.run(model.vision_model, x, **kwargs)
    pix = hf_ref.torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
    with hf_ref.torch.no_grad():
      final = model.get_image_features(pixel_values=pix, **kwargs)
    final = getattr(final, "pooler_output", final)
  elif name == "siglip":
    out = hf_ref.run(model.vision_model, x, **kwargs)
    final = out.pooler_output
  elif name.startswith("siglip2"):
    out = _naflex(model.vision_model if name == "siglip2" else model, x)
    final = out.pooler_output
  else:
    out = hf_ref.run(model, x, **kwargs)
    final = getattr(out, MODELS[name][2])
  return [h.numpy() for h in out.hidden_states[1:]], np.asarray(final)


def _naflex(tower, x: np.ndarray):
  """transformers' SigLIP 2 NaFlex tower on square images as its processor hands
  them: patches flattened by its own function, one grid, every patch valid."""
  from transformers.models.siglip2 import image_processing_siglip2 as processing
  torch, p = hf_ref.torch, tower.config.patch_size
  g = x.shape[1] // p
  patches = torch.stack([processing.convert_image_to_patches(
      torch.from_numpy(image.transpose(2, 0, 1).copy()), p) for image in x])
  with torch.no_grad():
    return tower(pixel_values=patches, pixel_attention_mask=torch.ones(len(x), g * g, dtype=torch.long),
                 spatial_shapes=torch.tensor([[g, g]] * len(x)), output_hidden_states=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """Each model saved by transformers, and the model itself."""
  root = tmp_path_factory.mktemp("hf_vit")
  models = {name: hf_ref.randomized(cls(config), seed)
            for seed, (name, (cls, config, _, _)) in enumerate(MODELS.items())}
  return {name: (hf_ref.save(model, root / name), model) for name, model in models.items()}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_folder_matches_transformers(folders, name, caplog):
  folder, model = folders[name]
  x = _images()
  blocks, final = _reference(name, model, x)
  c = load_stating_everything(folder, caplog, MODELS[name][3])
  heads = MODELS[name][1].to_dict().get("num_attention_heads") or 3
  assert c.model.num_heads == heads and "config.json" in c.evidence["num_heads"]
  out, points = compiled(c.model, c.params, x, capture="block*/out")
  for i, ref in enumerate(blocks):
    assert_close(points[f"block{i:02d}/out"], ref, TOL * float(np.abs(ref).max()), f"{name} block {i}")
  assert_close(out, final, TOL * float(np.abs(final).max()), f"{name} output")


@pytest.mark.parametrize("name", sorted(TOWERS))
def test_a_vision_tower_saved_alone_is_read_without_the_vision_model_prefix(folders, name):
  """The premise of the lone towers in MODELS (matched at every layer above): the
  file transformers wrote has no `vision_model.` key, and its config.json is the
  tower's own; each field is read from the bare names."""
  import json
  import safetensors.numpy
  folder, _ = folders[name]
  keys = safetensors.numpy.load_file(os.path.join(folder, "model.safetensors"))
  assert keys and not any(k.startswith("vision_model.") for k in keys), sorted(keys)[:4]
  with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["model_type"] == TOWERS[name]
  c = checkpoints.load(folder)
  assert c.fmt == f"hf_{name.removesuffix('_vision')}" and not c.assumed
  assert c.evidence["width"].startswith("embeddings.patch_embedding.weight ")


@pytest.mark.parametrize("name", ["dinov2", "dinov2_registers"])
def test_the_position_embedding_is_resized_as_transformers_does(folders, name, tmp_path):
  """At the image processor's crop size (24 here, 32 in config.json) the grid is
  resized as transformers does on each forward: torch's bicubic, antialiased
  for DINOv2 with registers (the two differ)."""
  folder, model = folders[name]
  shutil.copytree(folder, tmp_path / name)
  processor = dict(image_processor_type="BitImageProcessor", do_resize=True,
                   size={"shortest_edge": 28}, resample=3, do_center_crop=True,
                   crop_size={"height": 24, "width": 24}, do_normalize=True,
                   image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
  hf_ref.save(model, tmp_path / name, processor)
  c = checkpoints.load(str(tmp_path / name))
  assert c.model.image_size == 24 and "preprocessor_config.json" in c.evidence["image_size"]
  assert c.policy == f"hf_bicubic_crop{24 / 28!r}_imagenet"
  x = _images(24)
  _, final = _reference(name, model, x)
  out, _ = compiled(c.model, c.params, x)
  assert_close(out, final, TOL * float(np.abs(final).max()), name)


@pytest.mark.parametrize("patches", [9, 36])
def test_naflex_runs_its_processors_square_grid_resized_as_transformers_does(folders, patches,
                                                                              tmp_path):
  """SigLIP 2 NaFlex with its own image processor: a square image's side from
  max_num_patches (3x3 or 6x6 patches of 8 from a 4x4 embedding: shrunk and grown,
  bilinear and antialiased, as transformers resizes it on each forward)."""
  folder, model = folders["siglip2"]
  shutil.copytree(folder, tmp_path / "m")
  T.Siglip2ImageProcessor(patch_size=8, max_num_patches=patches).save_pretrained(str(tmp_path / "m"))
  c = checkpoints.load(str(tmp_path / "m"))
  side = 8 * int(np.sqrt(patches))
  assert c.model.image_size == side and "max_num_patches" in c.evidence["image_size"]
  assert c.policy == "hf_bilinear_squash_half" and "aspect kept; here square" in c.policy_from
  x = _images(side)
  _, final = _reference("siglip2", model, x)
  out, _ = compiled(c.model, c.params, x)
  assert_close(out, final, TOL * float(np.abs(final).max()), f"{patches} patches")


def test_without_config_json_the_defaults_are_assumed_and_said(folders, tmp_path, caplog):
  folder, _ = folders["dinov2"]
  shutil.copy(os.path.join(folder, "model.safetensors"), tmp_path / "weights.safetensors")
  with caplog.at_level(logging.WARNING, "vitcnn_jax"):
    c = checkpoints.load(str(tmp_path / "weights.safetensors"), num_heads=3)
  assert sorted(c.assumed) == ["gelu", "ln_eps"] and c.fmt == "hf_dinov2"
  assert c.policy == "hf_bicubic_crop0.875_imagenet" and "Dinov2 models" in c.policy_from
  assert "assumed gelu='exact'" in caplog.text and "Dinov2Config's default" in caplog.text


def test_config_json_defaults_are_transformers_own():
  """Keys a config.json leaves out take the config class's defaults: ours are those."""
  from vitcnn_jax.models.vit import transformers_layouts
  classes = {"hf_vit": T.ViTConfig, "hf_dinov2": T.Dinov2Config, "hf_clip": T.CLIPVisionConfig,
             "hf_siglip": T.SiglipVisionConfig, "hf_siglip2": T.Siglip2VisionConfig,
             "hf_dinov3": T.DINOv3ViTConfig}
  for fmt, cls in classes.items():
    config = cls()
    for key, value in transformers_layouts.LAYOUTS[fmt].defaults.items():
      assert getattr(config, key) == value, (fmt, key)


PROCESSORS = {  # transformers' slow (PIL) image processors, as the hub's models configure them
    "vit": (T.ViTImageProcessor, dict(size={"height": 24, "width": 24}), "hf_bilinear_squash_half"),
    "dinov2": (T.BitImageProcessor, dict(size={"shortest_edge": 28}, crop_size={"height": 24, "width": 24},
                                         image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]),
               f"hf_bicubic_crop{24 / 28!r}_imagenet"),
    "clip": (T.CLIPImageProcessor, dict(size={"shortest_edge": 24}, crop_size={"height": 24, "width": 24}),
             "hf_bicubic_crop1_clip"),
    "siglip": (T.SiglipImageProcessor, dict(size={"height": 24, "width": 24}), "hf_bicubic_squash_half"),
}


@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_image_processors_become_our_policies(name, tmp_path):
  """A preprocessor_config.json's settings as our policy, which then gives
  transformers' own pixel values (PIL's uint8 resampling: within one level)."""
  cls, kwargs, policy = PROCESSORS[name]
  processor = cls(**kwargs)
  processor.save_pretrained(str(tmp_path))
  with open(tmp_path / "preprocessor_config.json", encoding="utf-8") as f:
    import json
    settings = json.load(f)
  got, where = preprocess.from_hf_processor(settings)
  assert got == policy and "preprocessor_config.json" in where
  rng = np.random.default_rng(0)
  for shape in ((37, 51, 3), (60, 29, 3)):
    image = rng.integers(0, 256, shape).astype(np.uint8)
    ref = processor(images=image, return_tensors="np").pixel_values[0].transpose(1, 2, 0)
    ours = np.asarray(preprocess.normalize(preprocess.preprocess_image(image, 24, policy)[None], policy))[0]
    level = 1 / 255 / min(preprocess.stats(policy)[1])  # one uint8 level, normalised
    assert_close(ours, ref, level * 1.001, f"{name} {shape}")


def test_loading_a_transformers_folder_imports_none_of_torch_timm_transformers(folders):
  """A new process (forked before any of them was imported) loads and runs each
  folder: the layouts are read with safetensors' NumPy interface and json alone."""
  code = textwrap.dedent("""
      import sys
      import jax
      import numpy as np
      from vitcnn_jax import checkpoints
      for path in sys.argv[1:]:
        model, params = checkpoints.load_model(path)
        out, _ = jax.jit(model.apply)({"params": params}, np.zeros((1, 32, 32, 3), np.float32))
        assert np.isfinite(out).all(), path
      print("IMPORTED", sorted(m for m in sys.modules
                               if m.split(".")[0] in ("torch", "timm", "transformers")))
  """)
  done = forked.start(["-c", code, *(f for f, _ in folders.values())], dict(os.environ),
                      ROOT).wait(300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "IMPORTED []" in done.stdout, done.stdout


def test_inspect_says_what_came_from_the_weights_config_json_or_an_assumption(folders, tmp_path):
  import json
  from conftest import run_main
  folder, _ = folders["clip"]
  r = run_main(f"--config={ROOT}/configs/inspect.py", f"--config.checkpoint={folder}",
               f"--workdir={tmp_path / 'a'}")
  s = json.loads((tmp_path / "a" / "inspect.json").read_text())["sources"]
  assert {"num_heads", "gelu", "ln_eps", "image_size"} <= set(s["config.json"])
  assert {"width", "depth", "patch_size"} <= set(s["the weights (or the format)"])
  assert s["assumed"] == [] and "from assumed: nothing" in r.stdout
  shutil.copy(os.path.join(folders["dinov2"][0], "model.safetensors"), tmp_path / "w.safetensors")
  r = run_main(f"--config={ROOT}/configs/inspect.py", f"--config.checkpoint={tmp_path / 'w.safetensors'}",
               f"--workdir={tmp_path / 'b'}")
  assert "from assumed: num_heads, gelu, ln_eps" in r.stdout and "from config.json: nothing" in r.stdout


OLD_STYLE = {  # settings as older preprocessor_config.json files write them (ints), and newer ones
    "clip_int": (T.CLIPImageProcessor, dict(size=24, crop_size=24), "hf_bicubic_crop1_clip", 24),
    "vit_int": (T.ViTImageProcessor, dict(size=24, resample=2), "hf_bilinear_squash_half", 24),
    "convnext_384": (T.ConvNextImageProcessor, dict(size={"shortest_edge": 384}, resample=3),
                     "hf_bicubic_squash_half", 384),
    "convnext_224": (T.ConvNextImageProcessor, dict(size={"shortest_edge": 32}, crop_pct=0.875),
                     "hf_bicubic_crop0.875_half", 32),
    "convnext_feature_extractor": (  # facebook/convnext-*, microsoft/resnet-*: an int size, old key
        T.ConvNextImageProcessor, dict(size=32, crop_pct=0.875, feature_extractor_type="ConvNextFeatureExtractor",
                                       image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]),
        "hf_bicubic_crop0.875_imagenet", 32),
}


@pytest.mark.parametrize("name", sorted(OLD_STYLE))
def test_int_sizes_and_convnext_processors_are_read_as_transformers_reads_them(name):
  cls, kwargs, policy, size = OLD_STYLE[name]
  processor = cls(**kwargs)
  settings = {**processor.to_dict(), **kwargs}
  settings.pop("image_processor_type" if "feature_extractor_type" in kwargs else "", None)
  settings.setdefault("feature_extractor_type" if "feature_extractor_type" in kwargs else
                      "image_processor_type", cls.__name__)
  got, _ = preprocess.from_hf_processor(settings)
  assert got == policy and preprocess.hf_input_size(settings)[0] == size
  image = np.random.default_rng(1).integers(0, 256, (size + 13, size * 2 - 5, 3)).astype(np.uint8)
  ref = processor(images=image, return_tensors="np").pixel_values[0].transpose(1, 2, 0)
  ours = np.asarray(preprocess.normalize(preprocess.preprocess_image(image, size, policy)[None], policy))[0]
  assert_close(ours, ref, 1.001 / 255 / min(preprocess.stats(policy)[1]), name)


def test_integer_index_buffers_of_older_hub_files_are_left_out(folders, tmp_path):
  """Hub files saved by older transformers carry CLIP's `position_ids` (int64): not
  weights, so they are left out, as BatchNorm's step counters are."""
  import safetensors.numpy
  folder, _ = folders["clip"]
  shutil.copytree(folder, tmp_path / "clip")
  path = tmp_path / "clip" / "model.safetensors"
  flat = safetensors.numpy.load_file(str(path))
  flat["vision_model.embeddings.position_ids"] = np.arange(17, dtype=np.int64)[None]
  safetensors.numpy.save_file(flat, str(path))
  c = checkpoints.load(str(tmp_path / "clip"))
  assert c.fmt == "hf_clip" and not c.assumed


@pytest.mark.parametrize("name, fc1", [("dinov2_swiglu_classifier", "mlp.weights_in"), ("dinov2", "mlp.fc1")])
def test_an_mlp_whose_widths_fit_neither_kind_is_refused(folders, name, fc1, tmp_path):
  """A packed SwiGLU's weights_in has twice as many outputs as weights_out has
  inputs, a plain MLP's fc1 as many: a first layer cut short fits neither, and is
  named rather than read as the other kind."""
  import safetensors.numpy
  shutil.copytree(folders[name][0], tmp_path / "m")
  path = tmp_path / "m" / "model.safetensors"
  flat = safetensors.numpy.load_file(str(path))
  key = next(k for k in flat if k.endswith(f"layer.0.{fc1}.weight"))
  flat[key], flat[key[:-len("weight")] + "bias"] = flat[key][:-4], flat[key[:-len("weight")] + "bias"][:-4]
  safetensors.numpy.save_file(flat, str(path))
  with pytest.raises(checkpoints.CheckpointError, match=rf"{key[:-len('.weight')]} has \d+ outputs"):
    checkpoints.load(str(tmp_path / "m"))


def test_a_config_json_of_another_model_is_refused(folders, tmp_path):
  import json
  shutil.copytree(folders["dinov2"][0], tmp_path / "m")
  config = json.loads((tmp_path / "m" / "config.json").read_text())
  (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
  with pytest.raises(checkpoints.CheckpointError, match=r"config.json hidden_size=64, but the weights "
                                                        r"show 48: the config.json belongs to another"):
    checkpoints.load(str(tmp_path / "m"))
  (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
  with pytest.raises(checkpoints.CheckpointError, match=r"/m: config.json hidden_act='relu' is not an "
                                                        r"activation our ViT has"):
    checkpoints.load(str(tmp_path / "m"))


def test_an_unknown_model_type_is_refused_naming_the_file_and_what_we_read(folders, tmp_path):
  """A model_type we do not read would have its settings read under keys that may
  mean other things there (ViT's weights, another model's head count): refused."""
  import json
  shutil.copytree(folders["vit_pooler"][0], tmp_path / "m")
  config = tmp_path / "m" / "config.json"
  config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "vitcnn_nosuch_model"}))
  with pytest.raises(checkpoints.CheckpointError) as e:
    checkpoints.load(str(tmp_path / "m"))
  message = str(e.value)
  assert message.startswith(f"{config}: model_type='vitcnn_nosuch_model' is not a ViT of "
                            "transformers we read"), message
  assert "clip_vision_model, dinov2, " in message and "set model_type to 'vit' in that" in message


BAD_STATS = {  # preprocessor_config.json values transformers fails on (or divides by)
    "string": ("image_mean", "0.5,0.5,0.5"), "two_channels": ("image_mean", [0.5, 0.5]),
    "nan": ("image_mean", [0.5, float("nan"), 0.5]), "boolean": ("image_std", True),
    "zero_std": ("image_std", [0.5, 0.0, 0.5]), "negative_std": ("image_std", -0.5),
}


@pytest.mark.parametrize("case", sorted(BAD_STATS))
def test_a_malformed_image_mean_or_std_is_refused_naming_the_file_and_key(folders, tmp_path, case):
  import json
  key, value = BAD_STATS[case]
  processor = dict(image_processor_type="ViTImageProcessor", size={"height": 32, "width": 32},
                   image_mean=[0.5] * 3, image_std=[0.5] * 3)
  shutil.copytree(folders["vit_pooler"][0], tmp_path / "m")
  (tmp_path / "m" / "preprocessor_config.json").write_text(json.dumps({**processor, key: value}))
  with pytest.raises(checkpoints.CheckpointError) as e:
    checkpoints.load(str(tmp_path / "m"))
  assert str(e.value).startswith(f"{tmp_path / 'm' / 'preprocessor_config.json'}: {key}={value!r}, "
                                 "but it must be a finite number or a list of 3 finite numbers"), e.value
  assert ("each above 0" in str(e.value)) == (key == "image_std")


def test_one_number_for_image_mean_and_std_holds_for_every_channel():
  """transformers' normalize reads a number as every channel's value: our policy
  then gives its pixel values."""
  processor = T.ViTImageProcessor(size={"height": 24, "width": 24}, image_mean=0.5, image_std=0.5)
  policy, _ = preprocess.from_hf_processor({**processor.to_dict(), "image_mean": 0.5, "image_std": 0.5})
  assert policy == "hf_bilinear_squash_half"
  image = np.random.default_rng(2).integers(0, 256, (37, 51, 3)).astype(np.uint8)
  ref = processor(images=image, return_tensors="np").pixel_values[0].transpose(1, 2, 0)
  ours = np.asarray(preprocess.normalize(preprocess.preprocess_image(image, 24, policy)[None], policy))[0]
  assert_close(ours, ref, 1.001 / 255 / 0.5, "one number per statistic")  # one uint8 level

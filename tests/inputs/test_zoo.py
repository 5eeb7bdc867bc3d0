"""Zoo names: every public location well formed, with a valid preprocessing and
what the file cannot say; Hugging Face hub files found in huggingface_hub's
cache offline (a local cache directory standing in for the hub)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from conftest import require
from support import timm_ref
from support.numerics import VIT_ROUNDINGS, assert_close, network
from vitcnn_jax import checkpoints
from vitcnn_jax import fileio
from vitcnn_jax.inputs import packaged
from vitcnn_jax.inputs import preprocess
from vitcnn_jax.inputs import zoo
from vitcnn_jax.run import loading

hub = require("huggingface_hub")
TOL = network(VIT_ROUNDINGS)

ASKED = ("SigLIP-B/16", "SigLIP-So400m/14", "SigLIP2-B/16", "FlexiViT-B", "DINOv2-S/14",
         "DINOv2-B/14", "DINOv2-S/14 reg", "DINOv2-B/14 reg", "DeiT3-B/16", "CLIP-B/16",
         "MAE-B/16", "ConvNeXt-B")


def test_every_entry_names_a_public_file_and_its_preprocessing():
  assert set(ASKED) <= set(zoo.ZOO)
  for name, e in zoo.ZOO.items():
    assert e.location.startswith(("gs://", zoo.HF_HUB, packaged.SCHEME)), name
    assert " " not in e.location, name
    if e.location.startswith(zoo.HF_HUB):  # ORG/REPO: a repository, its settings beside
      assert e.location.count("/") == 1, name
    if e.location.startswith(packaged.SCHEME):  # a pinned package's file, as it runs it
      assert e.location[len(packaged.SCHEME):].split(":")[0] in packaged.MODELS and e.policy, name
    preprocess.check_policy(e.policy or "resize")
    assert e.what, name
  assert zoo.ZOO["CLIP-B/16"].overrides["gelu"] == "quick"  # what OpenAI's file cannot say
  assert zoo.ZOO["CLIP-B/16"].policy == "bicubic_crop1_clip"


def _cache(root, repo: str) -> str:
  """huggingface_hub's cache layout for one file of `repo`: its path."""
  base = os.path.join(root, "models--" + repo.replace("/", "--"))
  snap = os.path.join(base, "snapshots", "0" * 40)
  os.makedirs(snap)
  os.makedirs(os.path.join(base, "refs"))
  with open(os.path.join(base, "refs", "main"), "w") as f:
    f.write("0" * 40)
  return os.path.join(snap, "model.safetensors")


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
  monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
  return tmp_path / "hub"


def test_a_zoo_name_loads_from_the_hub_cache_with_its_entry(offline_hub, caplog):
  """DINOv2-B/14's entry sets 12 heads, exact GELU, eps 1e-6 and timm's DINOv2
  preprocessing: a tiny file with 12 heads of 4 in the cache must then compute
  what timm computes."""
  repo = zoo.ZOO["DINOv2-B/14"].location[len(zoo.HF_HUB):]
  path = _cache(offline_hub, repo)
  x = np.random.default_rng(0).uniform(-1, 1, (2, 28, 28, 3)).astype(np.float32)
  ref = timm_ref.timm_vit_file(path, x, features=True, patch_size=14, embed_dim=48, depth=2,
                               num_heads=12, mlp_ratio=2.0, num_classes=0, init_values=1e-5)
  c = checkpoints.load("DINOv2-B/14")
  assert c.path == os.path.dirname(path) and c.model.num_heads == 12 and not c.assumed
  assert (c.policy, c.policy_from) == ("bicubic_crop1_imagenet", "its zoo entry")
  out, _ = c.model.apply({"params": c.params}, x)
  assert_close(out, ref, TOL * float(np.abs(ref).max()), "DINOv2-B/14 from the hub cache")
  bare = checkpoints.load(path)  # the same file by path: the format's defaults, announced
  assert bare.policy == "bicubic_crop0.9_imagenet" and bare.assumed["num_heads"] == 1
  assert "assumed num_heads=1 " in caplog.text  # 48 wide: timm's table has no such model
  assert "num_heads" not in c.assumed


def test_a_hub_file_not_in_the_cache_says_how_to_fetch_it(offline_hub):
  offline_hub.mkdir()
  with pytest.raises(FileNotFoundError, match=r"hf-hub:timm/convnext_base.fb_in22k_ft_in1k: not "
                                              r"in huggingface_hub's cache.*`hf download "
                                              r"timm/.*https://huggingface.co/timm/"):
    checkpoints.load("ConvNeXt-B")
  assert "not in huggingface_hub's cache" in loading.unreachable("ConvNeXt-B")
  with pytest.raises(FileNotFoundError, match=r"`hf download org/missing "
                                              r"model.safetensors config.json "
                                              r"preprocessor_config.json`.*into one folder"):
    checkpoints.load("hf-hub:org/missing")


def _entry_not_found(name: str) -> Exception:
  """The hub's answer for a file the repository lacks (built without an HTTP response)."""
  from huggingface_hub import errors
  e = errors.EntryNotFoundError.__new__(errors.EntryNotFoundError)  # 0.x; 1.x's remote one is a subclass
  Exception.__init__(e, f"404 Entry Not Found: {name}")
  return e


def test_settings_the_repository_lacks_are_quiet_and_those_not_fetched_are_warned(
    offline_hub, monkeypatch, caplog):
  weights = _cache(offline_hub, "org/vit")
  open(weights, "wb").close()
  with caplog.at_level(logging.WARNING, "vitcnn_jax"):
    assert fileio.hub_folder("hf-hub:org/vit") == os.path.dirname(weights)
  # Offline, never cached: either may exist; each warned, with the command that fetches them.
  assert caplog.text.count("could not be fetched (LocalEntryNotFoundError)") == 2
  assert "`hf download org/vit config.json preprocessor_config.json`" in caplog.text
  caplog.clear()
  for name in fileio.HF_SETTINGS:  # what huggingface_hub records when the hub answered 404
    marker = offline_hub / "models--org--vit" / ".no_exist" / ("0" * 40) / name
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
  with caplog.at_level(logging.WARNING, "vitcnn_jax"):
    fileio.hub_folder("hf-hub:org/vit")
  assert "could not be fetched" not in caplog.text
  # Online: the hub says the repository lacks them (quiet), or lacks the weights (refused).
  files = {"model.safetensors": weights}
  def download(repo, name, **_):
    if name in files:
      return files[name]
    raise _entry_not_found(name)
  monkeypatch.setattr(hub, "hf_hub_download", download)
  with caplog.at_level(logging.WARNING, "vitcnn_jax"):
    fileio.hub_folder("hf-hub:org/other")
  assert "could not be fetched" not in caplog.text
  files.clear()
  with pytest.raises(FileNotFoundError, match=r"hf-hub:org/bin: the repository has no "
                                              r"model.safetensors \(pickled weights such as "
                                              r"pytorch_model.bin are never read\)"):
    fileio.hub_folder("hf-hub:org/bin")
  with pytest.raises(FileNotFoundError, match=r"hf-hub:org/bin/modle.npz: the repository has no "
                                              r"file 'modle.npz'; check its name"):
    fileio.hub_file("hf-hub:org/bin/modle.npz")


def test_without_huggingface_hub_the_message_names_the_download(monkeypatch):
  import sys
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)
  with pytest.raises(ImportError, match=r"pip install huggingface_hub.*download https://"
                                        r"huggingface.co/timm/vit_base_patch16_224.mae/resolve/"
                                        r"main/model.safetensors"):
    checkpoints.load("MAE-B/16")


@pytest.mark.parametrize("config_file,variant,names", [
    ("cka_vit_resnet", "dinov2_b14_convnext_b", ("DINOv2-B/14", "ConvNeXt-B")),
    ("cka_vit_resnet", "dinov3_b16_convnext_b", ("DINOv3-B/16", "DINOv3 ConvNeXt-B")),
    ("cka_vit_resnet", "vit_swin_resnet", ("ViT-B/16 ImageNet", "Swin-B", "BiT-R50x1")),
    ("cka_vit_resnet", "deit3_b16_convnext_b", ("DeiT3-B/16", "ConvNeXt-B")),
    ("cka_vit_resnet", "siglip_b16_convnext_b", ("SigLIP-B/16", "ConvNeXt-B")),
    ("attention_distance", "dino_vs_clip", ("DINO-B/16", "CLIP-B/16")),
    ("attention_distance", "vit_vs_swin", ("ViT-B/16 ImageNet", "Swin-B"))])
def test_todays_config_variants_name_zoo_models(config_file, variant, names):
  import importlib
  from vitcnn_jax import analyses
  from vitcnn_jax.run import control
  config = importlib.import_module(f"configs.{config_file}").get_config(variant)
  assert sorted(m.checkpoint for m in config.models.values()) == sorted(names)
  assert all(not m.policy for m in config.models.values())  # the zoo entry's, unless set
  control.check_config(config, analyses.get(config.analysis))


def test_inspect_a_zoo_name_from_a_cache_named_by_the_environment(tmp_path):
  """The user's route: HF_HUB_CACHE (or HF_HOME) and HF_HUB_OFFLINE in the
  environment, a zoo name on the command line; a process of its own, forked before
  huggingface_hub (which reads them at import) is imported."""
  import json
  from support import forked
  from conftest import ROOT, device_env
  repo = zoo.ZOO["DINOv2-S/14 reg"].location[len(zoo.HF_HUB):]
  path = _cache(tmp_path / "hub", repo)
  x = np.zeros((1, 28, 28, 3), np.float32)
  timm_ref.timm_vit_file(path, x, features=True, patch_size=14, embed_dim=48, depth=2,
                         num_heads=6, mlp_ratio=2.0, num_classes=0, init_values=1e-5,
                         reg_tokens=4, no_embed_class=True)
  env = {**device_env(1), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
  r = forked.run([f"--config={ROOT}/configs/inspect.py", "--config.checkpoint=DINOv2-S/14 reg",
                  f"--workdir={tmp_path / 'wd'}"], env, ROOT, 300)
  assert r.returncode == 0, r.stderr[-3000:]
  s = json.loads((tmp_path / "wd" / "inspect.json").read_text())
  assert s["file"] == os.path.dirname(path) and s["architecture"]["num_registers"] == 4
  assert s["architecture"]["num_heads"] == 6 and s["policy"] == "bicubic_crop1_imagenet"
  assert "preprocessing        bicubic_crop1_imagenet" in r.stdout and "its zoo entry" in r.stdout


@pytest.mark.parametrize("checkpoint,label,want", [
    ("ViT-B/16", "ViT-B/16", ("ViT-B/16", "config")),  # as the config wrote it
    ("ViT-L/16", "ViT-B/16", ("ViT-L/16", "the checkpoint's zoo name")),
    ("gs://vit_models/imagenet21k/ViT-L_16.npz", "ViT-B/16", ("ViT-L/16", "the checkpoint's zoo name")),
    ("/data/ViT-L_16.npz", "ViT-B/16", ("ViT-L/16", "the checkpoint's zoo name")),  # a local copy
    ("/data/ViT-B_32.npz", "ViT-B/16", ("ViT-B_32", "the checkpoint's file name")),  # two zoo files
    ("/data/mine.npz", "ViT-B/16", ("mine", "the checkpoint's file name")),
    ("/data/two.npz:img", "ViT-B/16", ("two:img", "the checkpoint's file name")),
    ("hf-hub:org/vit_b16.in1k", "ViT-B/16", ("vit_b16.in1k", "the checkpoint's file name")),
    ("/data/m.safetensors", "ViT-B/16", ("m", "the checkpoint's file name")),
    ("/data/mine.npz", "My ViT", ("My ViT", "config")),  # both overridden
])
def test_the_label_follows_an_overridden_checkpoint(checkpoint, label, want):
  from configs import cka_vit_resnet
  spec = cka_vit_resnet.get_config().models.vit
  spec.checkpoint, spec.label = checkpoint, label
  assert loading.label_of(spec, "vit") == want


def test_a_demo_model_given_another_file_is_labelled_by_it(tmp_path, tiny_vit_bit):
  """Through demos.resolve (which trains nothing: both files are given) and
  load_model: the json's "models loaded" records the label and where it came
  from; the trained file itself keeps the config's label."""
  import shutil
  from configs import cka_vit_resnet
  from vitcnn_jax import demos
  config = cka_vit_resnet.get_config("demo")
  config.models.vit.checkpoint = str(shutil.copy(tiny_vit_bit[0], tmp_path / "ViT-L_16.npz"))
  config.models.resnet.checkpoint = tiny_vit_bit[1]
  config = demos.resolve(config)
  vit = loading.load_model(config, "vit")
  bit = loading.load_model(config, "resnet")
  assert (vit.label, vit.setup["label from"]) == ("ViT-L/16", "the checkpoint's zoo name")
  assert (bit.label, bit.setup["label from"]) == ("bit", "the checkpoint's file name")
  config.models.vit.label_of = (config.models.vit.checkpoint, "ViT (demo)")  # as resolve
  assert loading.load_model(config, "vit").label == "ViT (demo)"  # leaves the trained file


def test_the_dinov3_pair_runs_offline_on_tiny_stand_ins_in_the_hub_cache(offline_hub, tmp_path):
  """configs/cka_vit_resnet.py:dinov3_b16_convnext_b, its zoo names found in the hub
  cache: tiny models written there by timm's own save_for_hf (DINOv3's Eva layout
  with its config.json; a ConvNeXt), loaded with nothing assumed, the CKA job run."""
  from configs import cka_vit_resnet
  from vitcnn_jax import jobs
  timm = timm_ref.timm
  for name, model in (("DINOv3-B/16", timm.create_model(
      "vit_base_patch16_dinov3", pretrained=False, embed_dim=48, num_heads=3, depth=2, img_size=32,
      patch_size=8)), ("DINOv3 ConvNeXt-B", timm.create_model(
          "convnext_base", pretrained=False, depths=(1, 1, 1, 1), dims=(8, 16, 24, 32),
          num_classes=0))):
    snapshot = os.path.dirname(_cache(offline_hub, zoo.ZOO[name].location[len(zoo.HF_HUB):]))
    timm.models.save_for_hf(model.eval(), snapshot, safe_serialization=True)
  c = checkpoints.load("DINOv3-B/16")
  assert not c.assumed and c.model.rope == "dinov3" and c.model.num_registers == 4
  config = cka_vit_resnet.get_config("dinov3_b16_convnext_b,examples=16,batch=8,repeats=1")
  for spec in config.models.values():
    spec.overrides.resolution = 32
  config.data = zoo.data_spec("synthetic", num_examples=16)
  jobs.run(config, str(tmp_path / "wd"))
  z = np.load(tmp_path / "wd" / "cka.npz")
  assert np.isfinite(z["cka_resnet_vit"]).all() and z["cka_vit_vit"].shape[0] > 2


def test_the_swin_config_runs_offline_on_tiny_stand_ins(offline_hub, tmp_path):
  """configs/cka_vit_resnet.py:vit_swin_resnet with Swin-B found in the hub cache (a
  tiny timm Swin written there by save_for_hf) and tiny Google npz files standing in
  for the gs:// ViT and BiT: every pair of the three in one job; then
  configs/attention_distance.py:vit_vs_swin on the same files."""
  from support import upstream_files as uf
  from configs import attention_distance, cka_vit_resnet
  from vitcnn_jax import jobs
  snapshot = os.path.dirname(_cache(offline_hub, zoo.ZOO["Swin-B"].location[len(zoo.HF_HUB):]))
  swin = timm_ref.timm.create_model("swin_base_patch4_window7_224", pretrained=False, img_size=32,
                                    patch_size=2, embed_dim=8, depths=(2, 2), num_heads=(1, 2),
                                    window_size=4)
  timm_ref.timm.models.save_for_hf(swin.eval(), snapshot, safe_serialization=True)
  config = cka_vit_resnet.get_config("vit_swin_resnet,examples=16,batch=8,repeats=1")
  config.models.vit.checkpoint = uf.save(tmp_path / "vit.npz", uf.vt_vit(0))
  config.models.resnet.checkpoint = uf.save(tmp_path / "bit.npz", uf.bt_bit(0))
  for spec in config.models.values():
    spec.overrides.resolution = 32
  config.data = zoo.data_spec("synthetic", num_examples=16)
  jobs.run(config, str(tmp_path / "wd"))
  z = np.load(tmp_path / "wd" / "cka.npz")
  assert {"cka_resnet_swin", "cka_resnet_vit", "cka_swin_vit"} <= set(z.files)
  assert np.isfinite(z["cka_resnet_swin"]).all() and z["cka_swin_swin"].shape[0] > 4
  s = json.loads((tmp_path / "wd" / "cka.json").read_text())
  assert list(s["lower_half_best_match"]) == ["resnet_in_vit"]  # the Swin is neither CNN nor ViT
  # The same Swin's attention distance beside the ViT's (configs/attention_distance.py:vit_vs_swin).
  config = attention_distance.get_config("vit_vs_swin,examples=16,batch=8")
  config.models.vit.checkpoint = uf.save(tmp_path / "vit.npz", uf.vt_vit(0))
  for spec in config.models.values():
    spec.overrides.resolution = 32
  config.data = zoo.data_spec("synthetic", num_examples=16)
  jobs.run(config, str(tmp_path / "attn"))
  s = json.loads((tmp_path / "attn" / "attention_distance.json").read_text())
  assert s["models"]["windows"]["heads"] == [1, 1, 2, 2] and s["models"]["windows"]["windowed"]
  assert not s["windowed"] and s["grid"] == [4, 4]  # the ViT first: the paper's figure
  assert (tmp_path / "attn" / "attention_distance_compare.png").exists()

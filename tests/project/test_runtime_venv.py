"""The documented paths work in the runtime venv of `make demo` (requirements.txt only).

The test venv pulls in more through torch and timm, so a missing runtime
dependency would pass unnoticed there: this builds the Makefile's runtime venv
from scratch and runs each optional path in it. The venv is kept in the cache,
keyed by requirements.txt and the Python version, so it is built once per
machine and again whenever the requirements change.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from packaging.requirements import Requirement

from conftest import ROOT, users_env
from support import upstream_files as uf
from vitcnn_jax import fileio

CHECK = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    import numpy as np
    from vitcnn_jax import fileio
    from vitcnn_jax.inputs import datasets
    from vitcnn_jax.inputs import folders

    # tfds array_record: prepare a dataset with tfds itself, then read it back.
    from support.tiny_tfds import tiny_tfds_dataset_builder as tiny
    tiny.Builder(data_dir=sys.argv[1], file_format="array_record").download_and_prepare()
    src = datasets.TfdsSource("tiny_tfds", "test", sys.argv[1])
    assert len(src) == tiny.NUM_EXAMPLES and src.images([0])[0].shape == (16, 16, 3)
    # gs:// through etils and gcsfs (constructed only: no network here).
    import gcsfs
    assert type(fileio._epath("gs://bucket/file.npz")).__name__.endswith("GPath")
    gcsfs.GCSFileSystem(token="anon")
    # Image folders through PIL, and ImageNet's bundled validation labels.
    import os
    from PIL import Image
    os.makedirs(sys.argv[1] + "/images")
    Image.fromarray(np.zeros((5, 7, 3), np.uint8)).save(sys.argv[1] + "/images/img.png")
    assert folders.FolderSource(sys.argv[1] + "/images").images([0])[0].shape == (5, 7, 3)
    assert len(open(folders.imagenet_validation_labels()).read().split()) == 50_000
    print("RUNTIME OK")
""")


@pytest.fixture(scope="module")
def runtime_venv():
  with open(os.path.join(ROOT, "requirements.txt"), "rb") as f:
    key = hashlib.sha256(f.read() + sys.version.encode()).hexdigest()[:16]
  venv = os.path.join(os.path.expanduser(fileio.CACHE_DIR), f"runtime-venv-{key}")
  if not os.path.exists(os.path.join(venv, ".runtime")):  # make's stamp: a complete install
    shutil.rmtree(venv, ignore_errors=True)
    r = subprocess.run(["make", "install", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return os.path.join(venv, "bin", "python")


def _run(python, *args, timeout=300):
  env = users_env(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  return subprocess.run([str(python), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout)


def test_optional_paths_import_and_run(runtime_venv, tmp_path):
  r = _run(runtime_venv, "-c", CHECK, str(tmp_path))
  assert r.returncode == 0 and "RUNTIME OK" in r.stdout, r.stderr[-3000:]


def test_main_job_on_a_missing_tfds_dataset_says_how_to_prepare_it(runtime_venv, tmp_path):
  vit = uf.save(tmp_path / "vit.npz", uf.vt_vit(0))
  bit = uf.save(tmp_path / "bit.npz", uf.bt_bit(0, depth=(1, 1)))
  r = _run(runtime_venv, "main.py", f"--config={ROOT}/configs/cka_vit_resnet.py",
           f"--workdir={tmp_path / 'wd'}", f"--config.models.vit.checkpoint={vit}",
           f"--config.models.resnet.checkpoint={bit}", f"--config.data.data_dir={tmp_path / 'tfds'}")
  assert r.returncode != 0
  assert "No module named" not in r.stderr, r.stderr[-3000:]
  assert "not prepared" in r.stderr and "tfds build imagenet2012" in r.stderr, r.stderr[-3000:]
  assert not (tmp_path / "tfds" / "downloads").exists()


# The README's notebook example, as a user would run it after `pip install .`:
# another directory, only the installed package and its dependencies.
NOTEBOOK = textwrap.dedent("""
    import numpy as np, sys, vitcnn_jax as vj
    images = np.random.default_rng(0).integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
    r = vj.cka({"ViT": sys.argv[1], "BiT": {"checkpoint": sys.argv[2], "resolution": 32}}, images,
               batch_size=32)
    fig = r.plot()[0]
    print("NOTEBOOK OK", vj.__file__, r["cka_bit_vit"].shape, fig.axes[0].get_title().split(chr(10))[0])
""")


def test_pip_install_then_the_notebook_example_elsewhere(runtime_venv, tmp_path):
  site = tmp_path / "site"
  r = subprocess.run([runtime_venv, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                      str(site), ROOT], capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  meta = next(site.glob("vitcnn_jax-*.dist-info")) / "METADATA"
  declared = [l.split(":", 1)[1].strip() for l in meta.read_text().splitlines()
              if l.startswith("Requires-Dist:")]
  with open(os.path.join(ROOT, "requirements.txt")) as f:
    wanted = [l.split("#")[0].strip() for l in f if l.split("#")[0].strip()]
  norm = lambda req: (Requirement(req).name.lower().replace("_", "-"), Requirement(req).specifier)
  assert sorted(map(norm, declared), key=str) == sorted(map(norm, wanted), key=str), (declared, wanted)
  assert not (site / "configs").exists() and not (site / "tests").exists()

  work = tmp_path / "elsewhere"
  work.mkdir()
  vit = uf.save(work / "vit.npz", uf.vt_vit(0, width=48, depth=2, heads=3, mlp=96, patch=8))
  bit = uf.save(work / "bit.npz", uf.bt_bit(0, depth=(1, 1)))
  env = users_env(JAX_PLATFORMS="cpu", PYTHONPATH=str(site), MPLBACKEND="Agg")
  r = subprocess.run([runtime_venv, "-c", NOTEBOOK, vit, bit], cwd=work, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert f"NOTEBOOK OK {site}/vitcnn_jax/__init__.py (17, 12) CKA within BiT" in r.stdout, r.stdout

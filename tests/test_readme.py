"""Every Python block of the README runs, in order, in one namespace: an import or
a call that goes stale fails here. Tiny stand-ins replace what needs a download
or minutes of training: a 224-px ViT file under the name the README loads, and
random-init demo models in the demo cache."""

from __future__ import annotations

import os
import re

import jax
import numpy as np
import pytest

import upstream_files as uf
from conftest import ROOT
from vitcnn_jax import checkpoints, data, train, zoo

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks() -> list[str]:
  with open(os.path.join(ROOT, "README.md")) as f:
    return BLOCK.findall(f.read())


def _demo_cache(home: str) -> None:
  """Random-init demo models where `demos.checkpoint` looks for the trained ones."""
  for variant in ("vit_demo", "bit_demo"):
    config = zoo.demo_training(variant)
    model = train.build_model(config, 10)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), np.zeros((1, 32, 32, 3), np.float32))["params"]
    path = train.cache_path(config, os.path.join(home, ".cache", "vitcnn_jax"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    checkpoints.save(path, model, params)


def test_every_python_block_of_the_readme_runs(tmp_path, monkeypatch):
  if not os.path.isdir(data.FASHION_MNIST_DIR) and not os.environ.get("CI"):
    pytest.skip("Debian's dataset-fashion-mnist is not installed (make test installs it)")
  blocks = _blocks()
  assert len(blocks) >= 5, "the README's Python blocks were not found"
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  _demo_cache(str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  uf.save(tmp_path / "ViT-B_16-224.npz", uf.vt_vit(0, patch=16, grid=14))
  namespace: dict = {}
  for i, code in enumerate(blocks):
    try:
      exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)  # pylint: disable=exec-used
    except Exception as e:  # pylint: disable=broad-except
      raise AssertionError(f"README.md python block {i + 1} fails:\n{code}") from e
  assert namespace["p"].names["vit"] and namespace["logits"].shape == (2, 7)
  assert len(namespace["figures"]) == 3 and namespace["r"].xy.shape == (1, 1)

"""Steps kept across processes (`run/exported`): a later process with the same
program traces no model and gets the same bits; anything the program depends on
gives another file; a damaged file is named and made again."""

from __future__ import annotations

import logging
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from conftest import ROOT, run_main
from vitcnn_jax.run import exported
from vitcnn_jax.similarity import lapack


def _cka_run(tiny_vit_bit, workdir, cache):
  vit, bit = tiny_vit_bit
  return run_main(f"--config={ROOT}/configs/cka_vit_resnet.py:examples=16,batch=8,repeats=1",
                  f"--workdir={workdir}", f"--config.models.vit.checkpoint={vit}",
                  f"--config.models.resnet.checkpoint={bit}", "--config.models.resnet.overrides.resolution=32",
                  "--config.data.source=synthetic", "--config.data.num_examples=16",
                  "--config.models.vit.capture=('blocks',)", "--config.models.resnet.capture=('blocks',)",
                  "--config.plot.format=none", f"--config.compilation_cache={cache}", devices=1)


def test_a_later_process_calls_the_kept_step_without_tracing_the_models(tiny_vit_bit, tmp_path, monkeypatch):
  monkeypatch.setenv("JAX_LOG_COMPILES", "1")
  cache = tmp_path / "cache"
  first = _cka_run(tiny_vit_bit, tmp_path / "first", cache)
  kept = os.listdir(cache / exported.FOLDER)
  assert len(kept) == 1 and kept[0].endswith(".jax_exported"), kept
  traced = re.compile(r"Finished tracing (\+ transforming )?local for")  # the step, models and all
  assert traced.search(first.stderr) and "jit(local)" in first.stderr
  later = _cka_run(tiny_vit_bit, tmp_path / "later", cache)
  assert not traced.search(later.stderr) and "jit(local)" not in later.stderr, later.stderr[-3000:]
  assert "Finished XLA compilation of jit(kept_step)" in later.stderr  # (read from XLA's cache)
  assert os.listdir(cache / exported.FOLDER) == kept
  a, b = np.load(tmp_path / "first" / "cka.npz"), np.load(tmp_path / "later" / "cka.npz")
  for k in a.files:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_what_the_program_depends_on_names_another_file(tmp_path, monkeypatch):
  settings = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
              "jax_persistent_cache_min_compile_time_secs")
  before = [getattr(jax.config, s) for s in settings]
  key, signature = ("CKA", ("linear_cka",)), ((8, 4), "<f4")
  try:
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    path = exported.path_for(key, signature)
    assert path is not None and path.startswith(str(tmp_path / exported.FOLDER))
    assert exported.path_for(key, signature) == path  # the same program, the same file
    assert exported.path_for(("CKA", ("rbf_cka",)), signature) != path  # another key
    assert exported.path_for(key, ((16, 4), "<f4")) != path  # other inputs
    asked = []  # a kept program runs untraced: asking for it sets the CPU's LAPACK as a trace would
    with monkeypatch.context() as m:  # the CPU's LAPACK with threads of its own: one eigh at a time
      m.setattr(lapack, "single_threaded", lambda: asked.append(1) or False)
      assert exported.path_for(key, signature) != path
    assert asked == [1]
    monkeypatch.setattr(exported, "source_digest", lambda: "edited")
    assert exported.path_for(key, signature) != path  # the package's code changed
    assert exported.path_for((object(),), signature) is None  # an address: could hide a difference
    assert exported.path_for((np.arange(2000),), signature) is None  # numpy elides long arrays
    jax.config.update("jax_compilation_cache_dir", "gs://bucket/xla")
    assert exported.path_for(key, signature) is None  # kept in local folders only
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e30)
    assert exported.path_for(key, signature) is None  # `parallel.uncached`: grouped CPU steps
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_enable_compilation_cache", False)
    assert exported.path_for(key, signature) is None
  finally:
    for s, v in zip(settings, before):
      jax.config.update(s, v)


def test_a_damaged_kept_step_is_named_and_made_again(tmp_path, caplog):
  fn = jax.jit(lambda x: jnp.sum(x * x))
  x = jnp.arange(6.0)
  path = str(tmp_path / exported.FOLDER / "step.jax_exported")
  assert float(exported.compile_step(fn, (x,), path)(x)) == 55.0
  good = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(good[:len(good) // 2])  # a truncated copy
  with caplog.at_level(logging.WARNING, "vitcnn_jax"):
    assert float(exported.compile_step(fn, (x,), path)(x)) == 55.0
  assert f"The kept step {path} could not be read" in caplog.text
  assert open(path, "rb").read() == good  # written again


def test_a_damaged_kept_step_another_process_removed_first_is_made_again(tmp_path, monkeypatch):
  fn = jax.jit(lambda x: jnp.sum(x * x))
  x = jnp.arange(6.0)
  path = str(tmp_path / exported.FOLDER / "step.jax_exported")
  exported.compile_step(fn, (x,), path)

  def damaged_and_gone(data):  # read as damaged, and removed by another process meanwhile
    os.remove(path)
    raise ValueError("damaged")
  monkeypatch.setattr(jax.export, "deserialize", damaged_and_gone)
  assert float(exported.compile_step(fn, (x,), path)(x)) == 55.0

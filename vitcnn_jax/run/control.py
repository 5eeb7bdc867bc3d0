"""The fields every run has, and the checks that need neither models nor data.

No jax here: configs import it. `check_config` runs before anything is loaded,
so a mistake in the config costs nothing.
"""

from __future__ import annotations

import os
from typing import Any

from vitcnn_jax import fileio
from vitcnn_jax import similarity
from vitcnn_jax.plotting import style
from vitcnn_jax.run import declaration as declaration_lib

# The driver's fields, the same for every analysis, and their defaults.
CONTROL = dict(
    save_every_seconds=60,  # resumable state written at most this often
    stop_after=0,  # >0: stop (resumably) after this many steps, for time-boxed jobs
    # Devices sharing one minibatch (the estimator's n stays batch_size); 0: the fewest
    # whose memory holds the step (always 1 where the device reports no memory: CPU).
    devices_per_minibatch=0,
    device_memory_gib=0.0,  # per device; 0: what the device reports
    # Gram and HSIC dots: "auto" (highest on CPU and TPU, bf16_6x on GPU), "highest",
    # "bf16_3x", "bf16_6x", "bf16_9x" or "tf32_3x" (see vitcnn_jax/similarity/grams.py).
    gram_precision="auto",
    # Figures: a PDF or SVG beside each PNG (format "pdf"/"svg"), or none (format
    # "none": results only; the same command, or a Result's .plot(), draws them later
    # from the saved results), and the CKA colour scale.
    plot=dict(format="png", vmin=0.0, vmax=1.0),
    cache_dir="",  # demo models trained on first use; "": ~/.cache/vitcnn_jax
    # JAX's persistent compilation cache, so that a second run of the same shapes
    # compiles nothing: "" (default) the environment's VITCNN_JAX_COMPILATION_CACHE, else
    # JAX's own JAX_COMPILATION_CACHE_DIR, else CACHE_DIR/xla; "none": off; or a folder.
    compilation_cache="",
)
# Fields that do not change a run's result (left out of its identity).
VOLATILE = ("stop_after", "save_every_seconds", "device_memory_gib", "plot", "cache_dir",
            "compilation_cache")
COMPILATION_CACHE_ENV = "VITCNN_JAX_COMPILATION_CACHE"
OFF = ("none", "off", "0")


def cache_dir(config: Any) -> str:
  return config.get("cache_dir") or fileio.CACHE_DIR


def compilation_cache(config: Any, jax_dir: str | None) -> str | None:
  """The persistent compilation cache's folder for a run of `config` (None: off),
  given the one JAX has already (`jax_compilation_cache_dir`, None if unset)."""
  field = config.get("compilation_cache") or ""
  env = os.environ.get(COMPILATION_CACHE_ENV, "")
  chosen = field or env or jax_dir or os.path.join(cache_dir(config), "xla")
  if chosen.lower() in OFF:
    return None
  chosen = os.path.expanduser(chosen)
  if os.path.exists(chosen) and not os.path.isdir(chosen):
    where = f"config.compilation_cache={field!r}" if field else f"{COMPILATION_CACHE_ENV}={env!r}"
    raise ValueError(f"{where}: {chosen} is a file; give a folder for JAX's compilation cache, "
                     f"or 'none' to turn it off.")
  return chosen


def check_config(config: Any, declared: declaration_lib.Declaration) -> None:
  """Value ranges, figure options, minibatch sizes and the model names."""
  for field in ("num_examples", "batch_size"):  # (an analysis choosing its own examples has none)
    if config.get(field, 1) < 1:
      raise ValueError(f"config.{field}={config.get(field)} must be >= 1.")
  for field in ("seed", "stop_after", "save_every_seconds"):
    if config.get(field, 0) < 0:
      raise ValueError(f"config.{field}={config.get(field)} must be >= 0.")
  plot_options(config)
  if declared.hsic_minibatches:
    check_batching(config.num_examples, config.batch_size)
  declared.models.check(list(config.get("models") or {}), declared.hint)


def check_batching(num_examples: int, batch_size: int) -> None:
  if batch_size < similarity.MIN_BATCH:
    raise ValueError(f"config.batch_size={batch_size}: the unbiased HSIC needs minibatches of "
                     f"at least {similarity.MIN_BATCH}.")
  rest = num_examples % batch_size
  if 0 < rest < similarity.MIN_BATCH:
    raise ValueError(
        f"config.num_examples={num_examples} leaves a last minibatch of {rest} (< {similarity.MIN_BATCH}) "
        f"with batch_size={batch_size}; choose num_examples so that the remainder is 0 or "
        f">= {similarity.MIN_BATCH}.")


def plot_options(config: Any) -> style.Figures | None:
  """How the figures are written, from `config.plot` (format, vmin, vmax), checked;
  None for format "none" (results only)."""
  given = dict(config.get("plot") or {})
  unknown = sorted(set(given) - {"format", "vmin", "vmax"})
  if unknown:
    raise ValueError(f"config.plot has no field {unknown[0]!r}; it has format, vmin and vmax.")
  fmt = given.pop("format", "png")
  formats = (*fileio.FIGURE_FORMATS, "none")  # none: results only
  if fmt not in formats:
    raise ValueError(f"config.plot.format={fmt!r} is not one of {formats}.")
  try:  # the colour scale is checked by the options themselves, named as config fields here
    figures = style.Figures("png" if fmt == "none" else fmt, **given)
  except ValueError as e:
    raise ValueError(f"config.plot.{e}") from None
  return None if fmt == "none" else figures

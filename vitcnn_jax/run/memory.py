"""Fitting a step into device memory before the first step runs.

XLA's memory analysis of the compiled step (arguments, outputs and temporaries
of one device's program) is compared with the device's memory, and a minibatch
too large for one device is spread over the smallest group of devices that
holds it (`parallel.GROUP`): the estimator's minibatch stays the configured one.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Callable

import jax

GIB = 2 ** 30
HEADROOM = 0.9  # of the device's memory: allocator fragmentation, runtime buffers


def device_limit(gib: float = 0.0) -> int | None:
  """Bytes a step may use on each device: HEADROOM of its memory, `gib` GiB if
  given (config.device_memory_gib, the benchmarks' plans), else what the device
  reports (GPU, TPU); None where it reports nothing (CPU). One limit, so that a
  plan printed for a 16 GiB device is the plan that device would choose."""
  if gib:
    return int(gib * GIB * HEADROOM)
  stats = jax.local_devices()[0].memory_stats() or {}
  return int(stats["bytes_limit"] * HEADROOM) if "bytes_limit" in stats else None


def step_bytes(compiled) -> int:
  """Peak bytes of one device's program: its arguments, outputs and temporaries."""
  m = compiled.memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
             + m.temp_size_in_bytes + m.generated_code_size_in_bytes)


def release_freed() -> None:
  """Hands back to the OS the heap pages that free() keeps (glibc's malloc_trim;
  elsewhere, nothing). XLA's compiler frees what it used in small pieces that
  glibc holds on to (0.5 GiB for workload W's step with every measure), and the
  step's large buffers, mapped afresh, would sit on top of them in the process's peak."""
  try:
    trim = ctypes.CDLL(None).malloc_trim
  except (AttributeError, OSError, TypeError):  # not glibc (macOS, musl; Windows has no CDLL(None))
    return
  trim(0)


@dataclasses.dataclass
class Plan:
  minibatch: int
  devices_per_minibatch: int
  peak_bytes: int
  limit_bytes: int | None

  @property
  def rows(self) -> int:
    return self.minibatch // self.devices_per_minibatch

  def describe(self) -> str:
    limit = f" of {self.limit_bytes / GIB:.1f}" if self.limit_bytes else ""
    return (f"minibatch {self.minibatch:,} over {self.devices_per_minibatch} device"
            f"{'s' if self.devices_per_minibatch > 1 else ''} ({self.rows:,} rows each): "
            f"{self.peak_bytes / GIB:.2f}{limit} GiB per device")


def groups(minibatch: int, devices: int) -> list[int]:
  """Group sizes that divide both the devices and the minibatch, smallest first."""
  return [g for g in range(1, devices + 1) if devices % g == 0 and minibatch % g == 0]


def choose(minibatch: int, devices: int, peak: Callable[[int, int], int], limit: int | None,
           fixed: int = 0) -> Plan:
  """The smallest group (or `fixed`) whose step fits in `limit` bytes; with no
  limit (CPU), `fixed` or 1, unchecked.

  `peak(minibatch, group)` compiles the step and returns its peak bytes. Where
  nothing fits, the error gives the largest minibatch that fits on the largest
  group (halving from the configured one).
  """
  options = groups(minibatch, devices)
  if fixed:
    if fixed not in options:
      raise ValueError(f"config.devices_per_minibatch={fixed} must divide both the {devices} "
                       f"devices and config.batch_size={minibatch}.")
    options = [fixed]
  if limit is None:
    return Plan(minibatch, options[0], 0, None)
  plan = None
  for g in options:
    plan = Plan(minibatch, g, peak(minibatch, g), limit)
    if limit is None or plan.peak_bytes <= limit:
      return plan
  top, smaller = options[-1], minibatch // 2
  while smaller >= 4 and smaller % top == 0 and peak(smaller, top) > limit:
    smaller //= 2
  fits = (f"the largest minibatch that fits over {top} device{'s' if top > 1 else ''} is about "
          f"{smaller:,} (halving from {minibatch:,}): set config.batch_size={smaller}"
          if smaller >= 4 and smaller % top == 0 else
          "no minibatch of at least 4 fits")
  raise MemoryError(
      f"The step does not fit in device memory: {plan.describe()}. {fits}"
      f"{'' if fixed else ', or use more devices'}"
      f"{', or leave config.devices_per_minibatch=0 to choose it' if fixed else ''}. "
      "(config.device_memory_gib overrides the memory the device reports.)")

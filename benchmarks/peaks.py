"""Peak memory as every benchmark reports it: the process's (each part runs in its
own process, so it is the part's) and the accelerator's, by JAX's or torch's
allocator."""

from __future__ import annotations

import resource


def process_gib() -> float:
  """This process's peak resident memory so far (ru_maxrss), GiB."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def device_peak() -> int | None:
  """JAX's peak bytes in use on its first device, None where it reports none (a CPU)."""
  import jax
  stats = jax.devices()[0].memory_stats()
  return stats.get("peak_bytes_in_use") if stats else None


def device_peak_gib(device: str, torch_side: bool = False) -> float | None:
  """The accelerator's peak memory in this process, GiB (None on `device` "cpu"):
  torch's or JAX's."""
  if device == "cpu":
    return None
  if torch_side:
    import torch
    return torch.cuda.max_memory_allocated() / 2**30
  peak = device_peak()
  return None if peak is None else peak / 2**30

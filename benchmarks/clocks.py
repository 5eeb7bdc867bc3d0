"""The machine's speed and JAX's compile time, measured one way for every
benchmark: the fp32 matmul rate each FLOP bound divides by, the FLOPs counted
from a jaxpr, JAX's compile events, and its persistent compilation cache."""

from __future__ import annotations

import time

import numpy as np


def matmul_rate(n: int, tries: int = 5, precision=None) -> float:
  """float32 matmul FLOP/s of the default device at `precision` (None: HIGHEST;
  a dot algorithm counts its product once, however many passes it makes): the
  best of `tries`, on random values (zeros can run faster)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  precision = jax.lax.Precision.HIGHEST if precision is None else precision
  mm = jax.jit(lambda a: jnp.matmul(a, a, precision=precision))
  mm(a).block_until_ready()
  best = 0.0
  for _ in range(tries):
    t = time.perf_counter()
    mm(a).block_until_ready()
    best = max(best, 2 * n**3 / (time.perf_counter() - t))
  return best


def best_seconds(call, runs: int) -> float:
  """The least wall time of `runs` calls of `call` (which waits for its result),
  after one untimed call (a compile, a first touch of the memory)."""
  call()
  best = float("inf")
  for _ in range(runs):
    t = time.perf_counter()
    call()
    best = min(best, time.perf_counter() - t)
  return best


def matmul_flops(jaxpr) -> float:
  """FLOPs of the dots and convolutions in `jaxpr` and the jaxprs inside it (a
  scan's body once per turn): the backend-independent count (a GPU's compiled
  cost analysis leaves out the cuBLAS and cuDNN calls, and its lowered one is
  not reported)."""
  total = 0.0
  for eqn in jaxpr.eqns:
    out = eqn.outvars[0].aval.shape
    if eqn.primitive.name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * np.prod(out) * np.prod([lhs[d] for d in contract])
    elif eqn.primitive.name == "conv_general_dilated":
      rhs, spec = eqn.invars[1].aval.shape, eqn.params["dimension_numbers"].rhs_spec
      total += 2 * np.prod(out) * np.prod([rhs[d] for d in spec[1:]])  # in-features x window
    turns = eqn.params["length"] if eqn.primitive.name == "scan" else 1  # a scan's body runs `length` times
    for sub in eqn.params.values():
      for j in sub if isinstance(sub, (list, tuple)) else [sub]:
        if hasattr(j, "jaxpr"):  # ClosedJaxpr
          total += turns * matmul_flops(j.jaxpr)
        elif hasattr(j, "eqns"):
          total += turns * matmul_flops(j)
  return float(total)


class CompileClock:
  """Seconds JAX spends tracing, lowering and compiling from its creation on, from
  its monitoring events: in all, and by phase (tracing, lowering to MLIR, XLA's
  backend_compile)."""

  def __init__(self):
    import jax
    self.seconds = 0.0
    self.phases: dict[str, float] = {}
    jax.monitoring.register_event_duration_secs_listener(self._add)

  def _add(self, event: str, seconds: float, **_) -> None:
    if event.startswith("/jax/core/compile/"):
      self.seconds += seconds
      key = event.rsplit("/", 1)[1].removesuffix("_duration")
      self.phases[key] = self.phases.get(key, 0.0) + seconds


def enable_cache(folder: str) -> None:
  """JAX's persistent compilation cache in `folder`, every program written to it
  (the defaults skip programs compiled in under a second)."""
  import jax
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

"""One data-parallel mesh over every device of every host.

The same code runs on one CPU, 8 fake CPU devices, a GPU or a TPU pod: each
process feeds the rows for its own devices, and arrays are assembled into
global arrays whose rows are sharded over every device. The mesh has two axes:
`data` over minibatches, and `group` over the devices that share one minibatch
(size 1 unless a minibatch is too large for one device).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

AXIS = "data"  # minibatches
GROUP = "group"  # the devices holding the rows of one minibatch
AXES = (AXIS, GROUP)


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, cpu_collectives: str | None = None) -> None:
  """Joins a multi-process job; call before any other JAX work.

  On TPU pods and SLURM clusters every argument can stay None (JAX detects
  them); CPU hosts pass the coordinator address, the process count and id,
  and cpu_collectives="gloo".
  """
  if cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                             process_id=process_id)


def shutdown() -> None:
  """Leaves a multi-process job once every process is done with it (a barrier):
  a process that exited at once would close the sockets another's last collective
  still reads (gloo: "Connection reset by peer")."""
  jax.distributed.shutdown()


def mesh(devices_per_minibatch: int = 1) -> jax.sharding.Mesh:
  """Every device, in groups of `devices_per_minibatch` consecutive rows' devices."""
  d, g = jax.device_count(), devices_per_minibatch
  if g < 1 or d % g:
    raise ValueError(f"devices_per_minibatch={g} must divide the {d} devices.")
  return jax.make_mesh((d // g, g), AXES, axis_types=(AxisType.Auto,) * 2)


def batch_sharding(m: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(m, P(AXES))


def replicated(m: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(m, P())


def global_batch(m: jax.sharding.Mesh, local: np.ndarray) -> jax.Array:
  """This process's rows -> one global array sharded over all devices' batch axis."""
  return jax.make_array_from_process_local_data(batch_sharding(m), np.asarray(local))


def replicate(m: jax.sharding.Mesh, tree):
  return jax.device_put(tree, replicated(m))


@contextlib.contextmanager
def uncached(m: jax.sharding.Mesh) -> Iterator[None]:
  """Programs compiled inside are not written to JAX's persistent compilation
  cache when `m` groups devices on CPU: there, a program with collectives inside
  a loop (the group's rings) came back from that cache broken (NaN or a
  segfault). Not written, it is never read back; other programs still are."""
  if m.shape[GROUP] == 1 or jax.default_backend() != "cpu":
    yield
    return
  key = "jax_persistent_cache_min_compile_time_secs"
  old = getattr(jax.config, key)
  jax.config.update(key, 1e30)
  try:
    yield
  finally:
    jax.config.update(key, old)

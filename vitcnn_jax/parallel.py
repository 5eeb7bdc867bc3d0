"""One data-parallel mesh over every device of every host.

The same code runs on one CPU, 8 fake CPU devices, a GPU or a TPU pod: each
process feeds the rows for its own devices, and arrays are assembled into
global arrays sharded along the `data` axis.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

AXIS = "data"


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


def mesh() -> jax.sharding.Mesh:
  return jax.make_mesh((jax.device_count(),), (AXIS,), axis_types=(AxisType.Auto,))


def batch_sharding(m: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(m, P(AXIS))


def replicated(m: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(m, P())


def global_batch(m: jax.sharding.Mesh, local: np.ndarray) -> jax.Array:
  """This process's rows -> one global array sharded over all devices' batch axis."""
  return jax.make_array_from_process_local_data(batch_sharding(m), np.asarray(local))


def replicate(m: jax.sharding.Mesh, tree):
  return jax.device_put(tree, replicated(m))

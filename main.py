r"""Runs the analysis named by the config.

  python main.py --config=configs/<analysis>.py[:arg] --workdir=DIR

Multi-host: start one process per host with --distributed (TPU pods and SLURM
need nothing else; CPU hosts add --coordinator, --num_processes, --process_id
and --cpu_collectives=gloo).
"""

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from vitcnn_jax import analyses
from vitcnn_jax import driver
from vitcnn_jax import parallel

_CONFIG = config_flags.DEFINE_config_file("config", None, "Analysis config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for results and figures.")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Join a multi-process JAX job.")
_COORDINATOR = flags.DEFINE_string("coordinator", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_CPU_COLLECTIVES = flags.DEFINE_string("cpu_collectives", None, "e.g. gloo, for CPU hosts.")
flags.mark_flags_as_required(["config", "workdir"])


def legacy_flag(argv: list[str]) -> str | None:
  """The message for a flag of a model field from before `config.models`, if any."""
  for arg in argv:
    for old, new in driver.LEGACY_FIELDS.items():
      if arg.startswith(f"--config.{old}."):
        return (f"{arg.split('=')[0]}: models are now the mapping config.models (name -> spec); "
                f"use --config.models.{new}.{arg.split('=')[0][len(f'--config.{old}.'):]} "
                "(each config file lists the names it gives its models).")
  return None


def main(argv):
  del argv
  if _DISTRIBUTED.value:
    parallel.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                        _CPU_COLLECTIVES.value)
  analyses.run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  if message := legacy_flag(sys.argv[1:]):
    sys.exit(f"main.py: {message}")
  app.run(main)

r"""Runs the analysis named by the config.

  python main.py --config=configs/<analysis>.py[:arg] --workdir=DIR [--verbose]

Multi-host: start one process per host with --distributed (TPU pods and SLURM
need nothing else; CPU hosts add --coordinator, --num_processes, --process_id
and --cpu_collectives=gloo).

A mistake in the config, the data, a checkpoint or the workdir prints one
message and exits with status 2; --verbose adds the traceback.
"""

import logging
import os
import sys
import traceback

from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Analysis config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for results and figures.")
flags.DEFINE_bool("verbose", False, "Show the traceback of an error.")  # read from argv, before parsing
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Join a multi-process JAX job.")
_COORDINATOR = flags.DEFINE_string("coordinator", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_CPU_COLLECTIVES = flags.DEFINE_string("cpu_collectives", None, "e.g. gloo, for CPU hosts.")
flags.mark_flags_as_required(["config", "workdir"])
app.define_help_flags()

# What a user's mistake raises (the library names the field, file or shape and what
# to do); anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, KeyError, OSError, ImportError, MemoryError, FloatingPointError,
               flags.Error)


def message(e: BaseException) -> str:
  """One readable line (or a few) for an error: ml_collections' field errors arrive
  as the repr of a repr, e.g. '\\'num_exmaples\\'\\nDid you mean ...'."""
  text = str(e.args[0]) if isinstance(e, (KeyError, AttributeError)) and e.args else str(e)
  if text.startswith("'") and "\\n" in text:  # AttributeError(repr(KeyError(...)))
    text = text[1:-1].replace("\\n", "\n").replace("\\'", "'")
  if text.startswith("'") and "\nDid you mean" in text:
    field, hint = text.split("\n", 1)
    return f"the config has no field {field}. {hint}"
  return text


def quiet_start() -> None:
  """No 'Unable to initialize backend tpu/cuda' on machines without them, no notice
  while matplotlib builds its font cache on a first run, no tensorflow-datasets
  warnings about its cache folder, no huggingface_hub retry notices offline (our
  own warnings log as "vitcnn_jax", and a hub file out of reach is our error)."""
  for name in ("jax._src.xla_bridge", "matplotlib.font_manager", "absl", "huggingface_hub"):
    logging.getLogger(name).setLevel(logging.ERROR)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse(argv: list[str]) -> None:
  """Parses `argv` into the flags; config_flags reads the `--config.X` overrides
  from sys.argv, so it is `argv` while they are parsed (tests call main() in-process)."""
  saved, sys.argv = sys.argv, list(argv)
  try:
    flags.FLAGS.unparse_flags()
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:  # a former call's overrides
      delattr(flags.FLAGS, name)
    flags.FLAGS(argv)
  finally:
    sys.argv = saved


def main(argv: list[str]) -> int:
  quiet_start()
  verbose = "--verbose" in argv
  try:
    parse(argv)
    from vitcnn_jax import jobs
    from vitcnn_jax.run import parallel
    if _DISTRIBUTED.value:
      parallel.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                          _CPU_COLLECTIVES.value)
    jobs.run(_CONFIG.value, _WORKDIR.value)
    if _DISTRIBUTED.value:
      parallel.shutdown()
  except (*USER_ERRORS, AttributeError) as e:
    if isinstance(e, AttributeError) and not isinstance(e.__context__, KeyError):
      raise  # not a missing config field: a bug
    if verbose:
      traceback.print_exc()
    print(f"main.py: error: {message(e)}\n(--verbose shows the traceback)", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))

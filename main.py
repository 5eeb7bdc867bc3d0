r"""Runs the analysis named by the config.

  python main.py --config=configs/<analysis>.py[:arg] --workdir=DIR
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from vitcnn_jax import analyses

_CONFIG = config_flags.DEFINE_config_file("config", None, "Analysis config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for results and figures.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  analyses.run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)

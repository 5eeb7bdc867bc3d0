"""Results files, written atomically so an interrupted run never leaves half a file."""

from __future__ import annotations

import json
import os
from typing import Any

from vitcnn_jax import fileio


def write_json(path: str, obj: Any) -> None:
  data = json.dumps(obj, indent=1, sort_keys=False).encode()
  fileio.atomic_write(path, lambda f: f.write(data))


def workdir_path(workdir: str, name: str) -> str:
  return os.path.join(workdir, name)

"""Local and gs:// files behind one interface, with errors that name the path."""

from __future__ import annotations

import importlib
import os
import socket
import tempfile
from typing import IO, Callable

from etils import epath


def is_remote(path: str) -> bool:
  return "://" in str(path)


_HOSTS = {"gs": "storage.googleapis.com"}


def _check_network(path: str) -> None:
  """Fails at once when the storage host cannot even be resolved: gcsfs would
  retry for about a minute, logging a traceback per attempt."""
  host = _HOSTS.get(str(path).split("://")[0])
  if host is None:
    return
  try:  # the backend first: installing it is the more useful advice
    importlib.import_module("gcsfs")
  except ImportError:
    try:
      importlib.import_module("tensorflow")
    except ImportError as e:
      raise ImportError(f"Reading {path} needs `pip install gcsfs` (or tensorflow) for gs:// "
                        "paths; or copy the file locally and pass the local path.") from e
  try:
    socket.getaddrinfo(host, 443)
  except OSError as e:
    raise FileNotFoundError(f"{path}: cannot reach {host} ({e}); no network? Copy the file "
                            "locally (e.g. `gsutil cp`) and pass the local path.") from e


def _epath(path: str) -> epath.Path:
  try:
    return epath.Path(path)
  except ImportError as e:  # pragma: no cover - depends on optional packages
    raise ImportError(
        f"Reading {path} needs a filesystem backend for its scheme: "
        "`pip install gcsfs` (or tensorflow) for gs:// paths.") from e


def read_bytes(path: str) -> bytes:
  """Whole-file read; npz needs seeks, so remote files are buffered."""
  path = os.fspath(path)
  if not is_remote(path):
    if not os.path.exists(path):
      raise FileNotFoundError(f"No such file: {path}")
    with open(path, "rb") as f:
      return f.read()
  _check_network(path)
  try:
    return _epath(path).read_bytes()
  except ImportError as e:
    raise ImportError(
        f"Reading {path} needs `pip install gcsfs` (or tensorflow) for "
        f"{path.split('://')[0]}:// paths; or copy the file locally "
        "(e.g. `gsutil cp`) and pass the local path.") from e
  except FileNotFoundError as e:
    raise FileNotFoundError(f"No such file: {path}") from e


def exists(path: str) -> bool:
  path = os.fspath(path)
  if not is_remote(path):
    return os.path.exists(path)
  _check_network(path)
  try:
    return _epath(path).exists()
  except ImportError as e:
    raise ImportError(f"Checking {path} needs `pip install gcsfs` (or tensorflow).") from e


def atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> None:
  """Writes through a temporary file so readers never see a partial file."""
  path = os.fspath(path)
  if is_remote(path):
    p = _epath(path)
    tmp = p.parent / f".{p.name}.tmp"
    with tmp.open("wb") as f:
      write(f)
    tmp.rename(p)
    return
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
  umask = os.umask(0)
  os.umask(umask)
  try:
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make results private to this user
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise

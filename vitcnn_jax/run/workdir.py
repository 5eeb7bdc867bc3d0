"""The workdir of a run: checked before any work, held by one run at a time.

Two runs writing one workdir would each report success while one result is
lost, so a run holds WORKDIR/.lock (pid, host, start) from its first check to
its last write. A lock left by a run that died on this host is taken over; one
held by a live run, or by a run on another host, is refused.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import time
from typing import Iterator

LOCK = ".lock"
log = logging.getLogger("vitcnn_jax")


class Busy(RuntimeError):
  """The workdir is held by another run."""


def check(workdir: str) -> str:
  """The workdir as an absolute path, created if missing; refused if it cannot hold results."""
  if not workdir or not str(workdir).strip():
    raise ValueError("--workdir is empty; pass the directory for results, e.g. --workdir=/tmp/cka.")
  if "://" in str(workdir):
    return str(workdir)  # remote: written through fileio, no local checks or lock
  path = os.path.abspath(os.path.expanduser(workdir))
  if os.path.exists(path) and not os.path.isdir(path):
    raise NotADirectoryError(f"--workdir={workdir} is a file, not a directory; pass another path.")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise PermissionError(f"--workdir={workdir}: cannot create it ({e.strerror}); pass a "
                          "directory you can write.") from e
  if not os.access(path, os.W_OK | os.X_OK):
    raise PermissionError(f"--workdir={workdir} is not writable by this user; pass a directory "
                          "you can write.")
  return path


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except OSError as e:
    return e.errno == errno.EPERM  # exists, owned by someone else
  return True


@contextlib.contextmanager
def lock(path: str) -> Iterator[None]:
  """Holds `path`/.lock for the duration; refuses a workdir another run holds."""
  if "://" in path:
    yield
    return
  lock_path = os.path.join(path, LOCK)
  me = f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%d %H:%M:%S')}"
  for _ in range(2):
    try:
      fd = os.open(lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
      break
    except FileExistsError:
      try:
        with open(lock_path) as f:
          pid, host, *since = f.read().split()
      except (OSError, ValueError):
        pid, host, since = "0", "?", []  # unreadable or half-written: treat as held
      if host == socket.gethostname() and pid.isdigit() and int(pid) > 0 and not _alive(int(pid)):
        log.warning("%s: taking over the lock of run %s, which is no longer running.", path, pid)
        os.remove(lock_path)
        continue
      raise Busy(
          f"--workdir={path} is in use by another run (pid {pid} on {host}"
          f"{', since ' + ' '.join(since) if since else ''}). Wait for it to finish or pass "
          f"another --workdir; if no such run exists, delete {lock_path}.") from None
  else:
    raise Busy(f"{lock_path}: could not take the lock; delete it if no run uses {path}.")
  with os.fdopen(fd, "w") as f:
    f.write(me)
  try:
    yield
  finally:
    try:
      with open(lock_path) as f:
        mine = f.read() == me
      if mine:
        os.remove(lock_path)
    except OSError:
      pass

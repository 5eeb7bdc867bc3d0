"""Local and gs:// files behind one interface, with errors that name the path."""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import tempfile
from typing import IO, Callable

from etils import epath

log = logging.getLogger("vitcnn_jax")


def is_remote(path: str) -> bool:
  return "://" in str(path)


_HOSTS = {"gs": "storage.googleapis.com"}
# Where trained demo models, registry packages' files and compiled programs are kept.
CACHE_DIR = "~/.cache/vitcnn_jax"
FIGURE_FORMATS = ("png", "pdf", "svg")  # the figure files `plotting` writes


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


HF_HUB = "hf-hub:"  # hf-hub:ORG/REPO[/FILE], a Hugging Face hub model repository (or one file)
HF_SETTINGS = ("config.json", "preprocessor_config.json")  # fetched beside a repository's weights


def _hub(location: str, repo: str, file: str) -> Callable[[str], str]:
  """A function that gives the local path of a file of `repo` in huggingface_hub's
  cache, downloading it when online. huggingface_hub is optional, as gcsfs is for
  gs:// paths."""
  url = f"https://huggingface.co/{repo}/resolve/main/{file}"
  try:
    import huggingface_hub
  except ImportError as e:
    raise ImportError(f"{location}: reading the Hugging Face hub needs `pip install "
                      f"huggingface_hub`; or download {url} and pass its local path.") from e
  try:
    socket.getaddrinfo("huggingface.co", 443)
    online = True
  except OSError:  # no network: the cache alone, without a minute of retries
    online = False
  return lambda name: huggingface_hub.hf_hub_download(repo, name, local_files_only=not online)


def _not_fetched(location: str, repo: str, files: tuple[str, ...], e: Exception) -> Exception:
  """The error for a hub file that could not be had: absent from the repository
  (then no network will help), or not cached and not downloadable now."""
  url = f"https://huggingface.co/{repo}/resolve/main/{files[0]}"
  if _absent(e) and files[0] == "model.safetensors":
    return FileNotFoundError(
        f"{location}: the repository has no model.safetensors (pickled weights such as "
        "pytorch_model.bin are never read); convert them to safetensors with the framework that "
        "wrote them and pass the file's local path.")
  if _absent(e):
    return FileNotFoundError(f"{location}: the repository has no file {files[0]!r}; check its name "
                             f"at https://huggingface.co/{repo}/tree/main.")
  local = (f"download {url} and pass its local path" if len(files) == 1 else
           f"download {url} and {', '.join(files[1:])} (where the repository has them) into one "
           "folder and pass the folder")
  return FileNotFoundError(
      f"{location}: not in huggingface_hub's cache and not downloadable now "
      f"({type(e).__name__}). Fetch it where there is a network (`hf download {repo} "
      f"{' '.join(files)}`, or `huggingface-cli download` with older huggingface_hub; then copy "
      f"the cache, HF_HOME), or {local}.")


def _absent(e: Exception) -> bool:
  """Whether the hub said the repository has no such file (not: it could not be asked)."""
  from huggingface_hub import utils  # optional; _hub checked it
  return isinstance(e, utils.EntryNotFoundError) and not isinstance(e, utils.LocalEntryNotFoundError)


def _known_absent(repo: str, name: str) -> bool:
  """Whether huggingface_hub's cache recorded, when last online, that `repo` has no `name`."""
  import huggingface_hub  # optional; _hub checked it
  return huggingface_hub.try_to_load_from_cache(repo, name) is huggingface_hub._CACHED_NO_EXIST


def hub_file(location: str) -> str:
  """The local path of hf-hub:ORG/REPO/FILE in huggingface_hub's cache."""
  parts = location[len(HF_HUB):].split("/")
  repo, file = "/".join(parts[:2]), "/".join(parts[2:])
  get = _hub(location, repo, file)
  try:
    return get(file)
  except Exception as e:  # offline and not cached, no such repo
    raise _not_fetched(location, repo, (file,), e) from e


def hub_folder(location: str, weights: str = "model.safetensors") -> str:
  """The local snapshot folder of hf-hub:ORG/REPO in huggingface_hub's cache: its
  `weights` (or the shards of `weights`.index.json) and, where the repository has
  them, its settings (`HF_SETTINGS`)."""
  repo = location[len(HF_HUB):]
  get = _hub(location, repo, weights)
  try:
    path = get(weights)
  except Exception as e:  # offline and not cached, no such repo
    try:
      index = get(weights + ".index.json")
    except Exception:  # neither the file nor its shards' index
      raise _not_fetched(location, repo, (weights, *HF_SETTINGS), e) from e
    with open(index, encoding="utf-8") as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    for shard in shards:
      try:
        path = get(shard)
      except Exception as err:
        raise _not_fetched(location, repo, (shard,), err) from err
  for name in HF_SETTINGS:
    try:
      get(name)
    except Exception as e:  # absent, or offline and not cached
      if not (_absent(e) or _known_absent(repo, name)):
        log.warning("%s: its %s could not be fetched (%s), so what it states (architecture, "
                    "preprocessing) is taken from the weights or assumed, each assumption "
                    "printed. Fetch it where there is a network: `hf download %s %s`.",
                    location, name, type(e).__name__, repo, " ".join(HF_SETTINGS))
  return os.path.dirname(path)

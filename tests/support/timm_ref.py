"""timm (PyTorch) models loading the same npz files with timm's own loaders."""

from __future__ import annotations

import functools

import numpy as np

from conftest import require

torch = require("torch")
from support import torchvision_cpu  # noqa: E402  (needs torch)

torchvision_cpu.declare_detection_ops()
timm = require("timm")
from timm.models import convnext as timm_convnext  # noqa: E402
from timm.models import mlp_mixer as timm_mixer  # noqa: E402
from timm.models import resnet as timm_resnet  # noqa: E402
from timm.models import resnetv2 as timm_resnetv2  # noqa: E402
from timm.models import vision_transformer as timm_vit  # noqa: E402

torch.set_num_threads(2)

# timm constructor settings that reproduce each upstream pooling (spec: upstream.md §5).
_VIT_POOL_KWARGS = {
    "token": {},  # vision_transformer files: cls concatenated, then posemb added
    "gap": dict(class_token=False, global_pool="avg", fc_norm=False),
    "tok": dict(no_embed_class=True),  # big_vision: posemb added, then cls
    "map": dict(class_token=False, global_pool="map"),
}


def _run(model, images: np.ndarray, features: bool = False) -> np.ndarray:
  model.eval()
  x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
  with torch.no_grad():
    if features:
      return model.forward_head(model.forward_features(x), pre_logits=True).numpy()
    return model(x).numpy()


def vit(path: str, images: np.ndarray, *, pool: str, width: int, depth: int, heads: int,
        mlp: int, patch: int, num_classes: int, load_bfloat16: bool = False,
        features: bool = False) -> np.ndarray:
  model = timm_vit.VisionTransformer(
      img_size=images.shape[1], patch_size=patch, embed_dim=width, depth=depth,
      num_heads=heads, mlp_ratio=mlp / width, num_classes=num_classes,
      act_layer="gelu_tanh", **_VIT_POOL_KWARGS[pool])
  timm_vit._load_weights(model, path, load_bfloat16=load_bfloat16)
  return _run(model, images, features)


def bit(path: str, images: np.ndarray, *, width: float, depth, num_classes: int) -> np.ndarray:
  model = timm_resnetv2.ResNetV2(
      layers=list(depth), width_factor=width, num_classes=num_classes, stem_type="fixed",
      conv_layer=functools.partial(timm.layers.StdConv2d, eps=1e-8))
  timm_resnetv2._load_weights(model, path)
  return _run(model, images)


# npz -> timm MlpMixer state-dict keys (timm has no npz loader for Mixer).
def _mixer_state_dict(w: dict[str, np.ndarray]) -> dict:
  sd = {"stem.proj.weight": w["stem/kernel"].transpose(3, 2, 0, 1), "stem.proj.bias": w["stem/bias"]}
  blocks = sorted({int(k.split("/")[0].split("_")[1]) for k in w if k.startswith("MixerBlock_")})
  for i in blocks:
    b = f"MixerBlock_{i}"
    for src, dst in (("LayerNorm_0", "norm1"), ("LayerNorm_1", "norm2")):
      sd[f"blocks.{i}.{dst}.weight"] = w[f"{b}/{src}/scale"]
      sd[f"blocks.{i}.{dst}.bias"] = w[f"{b}/{src}/bias"]
    for src, dst in (("token_mixing", "mlp_tokens"), ("channel_mixing", "mlp_channels")):
      for r in (0, 1):
        sd[f"blocks.{i}.{dst}.fc{r + 1}.weight"] = w[f"{b}/{src}/Dense_{r}/kernel"].T
        sd[f"blocks.{i}.{dst}.fc{r + 1}.bias"] = w[f"{b}/{src}/Dense_{r}/bias"]
  sd["norm.weight"], sd["norm.bias"] = w["pre_head_layer_norm/scale"], w["pre_head_layer_norm/bias"]
  sd["head.weight"], sd["head.bias"] = w["head/kernel"].T, w["head/bias"]
  return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}


def mixer(path: str, images: np.ndarray, *, width: int, blocks: int, tokens_mlp: int,
          channels_mlp: int, patch: int, num_classes: int) -> np.ndarray:
  w = dict(np.load(path))
  model = timm_mixer.MlpMixer(
      num_classes=num_classes, img_size=images.shape[1], patch_size=patch,
      num_blocks=blocks, embed_dim=width,
      mlp_ratio=(tokens_mlp / width, channels_mlp / width),
      act_layer=functools.partial(torch.nn.GELU, approximate="tanh"))
  model.load_state_dict(_mixer_state_dict(w), strict=True)
  return _run(model, images)


def randomize(model, seed: int = 0) -> None:
  """Every parameter drawn at a scale where each one moves the output: timm's
  initialisation leaves biases at 0, layer scales at 1e-5 and tokens near 0,
  which a parity test could not tell from absent."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      z = torch.randn(p.shape, generator=g)
      if p.ndim >= 2 and not name.endswith(("token", "pos_embed", "latent")):
        p.copy_(z / np.sqrt(p[0].numel()))  # fan-in scaled
      elif name.endswith(("norm1.weight", "norm2.weight", "norm.weight", "norm_pre.weight",
                          "fc_norm.weight")):
        p.copy_(1 + 0.2 * z)
      else:  # biases, layer scales, tokens, position embeddings
        p.copy_(0.3 * z)


def _published(model, path, images: np.ndarray, features: bool, seed: int) -> np.ndarray:
  """`model` with random weights saved as its state dict in safetensors (the
  format timm publishes); returns its own forward on `images`."""
  import safetensors.torch

  randomize(model, seed)
  safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                              str(path))
  return _run(model, images, features)


def timm_vit_file(path, images: np.ndarray, *, features: bool = False, seed: int = 0,
                  **kwargs) -> np.ndarray:
  """A timm VisionTransformer (or DeiT's distilled one) as timm publishes it."""
  distilled = kwargs.pop("distilled", False)
  cls = timm.models.deit.VisionTransformerDistilled if distilled else timm_vit.VisionTransformer
  return _published(cls(img_size=images.shape[1], **kwargs), path, images, features, seed)


def timm_convnext_file(path, images: np.ndarray, *, features: bool = False, seed: int = 0,
                       **kwargs) -> np.ndarray:
  """A timm ConvNeXt (v1 or, with use_grn=True, ls_init_value=None, v2) as published."""
  return _published(timm_convnext.ConvNeXt(**kwargs), path, images, features, seed)


def timm_resnet_file(path, images: np.ndarray, *, basic: bool = False, v1: bool = False,
                     seed: int = 0, **kwargs) -> np.ndarray:
  """A timm ResNet as published (its state dict, BatchNorm statistics included),
  random weights and statistics. timm puts a bottleneck's stride in its 3x3 conv
  (v1.5); `v1` moves each downsampling unit's stride to its first 1x1 conv, as
  the original Caffe and TF models have it."""
  model = timm_resnet.ResNet(timm_resnet.BasicBlock if basic else timm_resnet.Bottleneck, **kwargs)
  g = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, b in model.named_buffers():
      if name.endswith("running_mean"):
        b.copy_(0.3 * torch.randn(b.shape, generator=g))
      elif name.endswith("running_var"):
        b.copy_(0.5 + torch.rand(b.shape, generator=g))
  if v1:
    for stage in (model.layer2, model.layer3, model.layer4):
      stage[0].conv1.stride, stage[0].conv2.stride = (2, 2), (1, 1)
  return _published(model, path, images, False, seed)

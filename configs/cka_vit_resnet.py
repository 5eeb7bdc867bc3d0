r"""Minibatch CKA within and across a ViT and a ResNet (paper Figs 1, 2 and B.1).

  python main.py --config=configs/cka_vit_resnet.py --workdir=/tmp/cka \
      --config.data.data_dir=/path/to/tensorflow_datasets

Variants (`:arg`, comma-separated): a pair name `b16_r50` (default), `b32_r50`,
`l16_r152`, `h14_r152` (each also as `PAIR_measures`); today's models:
`dinov2_b14_convnext_b` (DINOv2-B/14 at 224 px against ConvNeXt-B, self-supervised
ViT against supervised modern CNN), `deit3_b16_convnext_b` (both supervised, as
Vishniakov et al. 2024 compare them), `siglip_b16_convnext_b`, `dinov3_b16_convnext_b`
(DINOv3's ViT-B/16 against the ConvNeXt-B distilled from its ViT-7B: one objective, one
dataset, two architectures; both at 224 px), `vit_swin_resnet` (Swin-B between ViT-B/16
and BiT-R50x1: all three pairs); offline: `demo`,
`demo3`, `demo_mixer` or `demo_measures`; the real pretrained pair (`make real`):
`real` or `real_measures`; then `examples=`, `batch=`,
`repeats=`, `seed=`, e.g. `configs/cka_vit_resnet.py:l16_r152,examples=2560,repeats=10`.

`demo` runs offline: it trains a tiny ViT and a tiny BiT ResNet-v2 on
Fashion-MNIST (once; cached in `config.cache_dir`), reloads them through load_model
and runs the same CKA job on the held-out test images. `demo3` adds a third
model, the ViT trained with GAP instead of CLS; `demo_mixer` an MLP-Mixer
(App. H: CKA within the Mixer and against the ViT and the ResNet);
`demo_measures` every similarity measure (`config.measures`, all of
`vitcnn_jax.similarity.measures.NAMES`: CKA and kernels, neighbourhoods, RSA, the CCA family,
regression, alignment, GULP, descriptive statistics) side by side, each against its null
(`config.null`: one layer's examples permuted), in `measures_A_B.png`.

Models are the mapping `config.models` (name -> model spec), here `vit` and
`resnet`; it takes any number of checkpoints under any names (add one with
`--config.models.NAME...` only in a config file: flags set existing fields).
Every pair of models, in name order, gets its block of the one CKA matrix
(arrays `cka_A_B`) and a heatmap `cka_A_B.png`.

The JFT-300M models of the paper were never released; the defaults are the
public ImageNet-21k checkpoints of the same architectures (both at 224 px).
"""

import ml_collections

from configs import common

PAIRS = {  # names in zoo.ZOO, also the labels
    "b16_r50": ("ViT-B/16", "BiT-R50x1"),
    "b32_r50": ("ViT-B/32", "BiT-R50x1"),
    "l16_r152": ("ViT-L/16", "BiT-R152x2"),
    "h14_r152": ("ViT-H/14", "BiT-R152x2"),
    "dinov2_b14_convnext_b": ("DINOv2-B/14", "ConvNeXt-B"),
    "deit3_b16_convnext_b": ("DeiT3-B/16", "ConvNeXt-B"),
    "siglip_b16_convnext_b": ("SigLIP-B/16", "ConvNeXt-B"),
    "dinov3_b16_convnext_b": ("DINOv3-B/16", "DINOv3 ConvNeXt-B"),
}
# ViTs of a pair run at their file's resolution, but DINOv2's (518 px) and DINOv3's (256)
# at 224 like the others: an embedding resampled as timm does, or rotary ones recomputed.
# Three models: Swin, the hierarchical ViT, between the paper's ViT and ResNet (each
# pretrained on ImageNet-21k; the ViT and Swin then fine-tuned on ImageNet-1k).
TRIPLES = {"vit_swin_resnet": (("vit", "ViT-B/16 ImageNet"), ("swin", "Swin-B"),
                               ("resnet", "BiT-R50x1"))}
AT_224 = {"dinov2_b14_convnext_b": {"resolution": 224}, "dinov3_b16_convnext_b": {"resolution": 224}}
DEMOS = {"demo": ("vit", "resnet"), "demo3": ("vit", "resnet", "vit_gap"),
         "demo_mixer": ("vit", "resnet", "mixer"), "demo_measures": ("vit", "resnet")}
MEASURES = ["linear_cka", "rbf_cka", "distance_correlation", "mutual_knn", "cknna", "knn_jaccard",
            "rank_similarity", "second_order_cosine", "rsa", "rsm_difference", "mean_cca", "cca_r2",
            "svcca", "pwcca", "regression", "shape_metric", "procrustes", "gulp",
            "eigenspace_overlap", "magnitude_difference", "concentricity_difference",
            "uniformity_difference"]  # vitcnn_jax.similarity.measures.NAMES (configs import no jax)
# Report sections: demo and paper variants, order.
REPORT = {"cka": ("demo", "b16_r50", 1), "measures": ("demo_measures", "b16_r50_measures", 1.5)}
REAL = {"cka": "real", "measures": "real_measures"}  # report sections on the real pair


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = common.analysis("cka")
  arg = common.protocol_arg(arg, config, "b16_r50")
  pair = arg.variant.removesuffix("_measures")
  if arg.variant in DEMOS:
    common.demo_models(config, DEMOS[arg.variant])
  elif pair == "real":
    common.real_models(config)
  elif pair in TRIPLES:
    config.models = {name: common.model(zoo_name, "paper", zoo_name, resolution=224)
                     for name, zoo_name in TRIPLES[pair]}
    config.data = common.imagenet_validation()
  elif pair in PAIRS:
    vit, bit = PAIRS[pair]
    config.models = dict(
        vit=common.model(vit, "paper", vit, **AT_224.get(pair, {})),
        resnet=common.model(bit, "paper", bit, resolution=224))
    config.data = common.imagenet_validation()
  else:
    raise ValueError(f"Unknown variant {arg.variant!r}; expected one of "
                     f"{sorted(PAIRS) + sorted(TRIPLES) + sorted(DEMOS) + ['real']} "
                     "(a pair with `_measures`: every measure).")
  if arg.variant.endswith("_measures"):  # every measure side by side, against its null, intervals
    config.measures, config.null, config.bootstrap = tuple(MEASURES), True, 50
  common.protocol(config, arg)
  return config

"""Where each ViT of transformers keeps each piece of the model, and the defaults
of its config class, for `transformers.py`.

Layouts (each also under its classification wrapper's prefix, `vit.` or `dinov2.`):
  hf_vit     ViTModel (google/vit-*): embeddings.{cls_token, position_embeddings,
             patch_embeddings.projection}, encoder.layer.N.{layernorm_before,
             attention.attention.{query,key,value}, attention.output.dense,
             layernorm_after, intermediate.dense, output.dense}, layernorm,
             pooler.dense (tanh: our pre_logits) or classifier.
  hf_dinov2  Dinov2Model and Dinov2WithRegistersModel: as hf_vit with norm1/norm2,
             mlp.fc1/fc2 or SwiGLU mlp.weights_in/weights_out, layer_scale{1,2}.lambda1,
             embeddings.register_tokens; their classifier reads the class token and
             the patch tokens' mean (our pool "token_gap"). Torch ONNX exports name
             weights by module path: transformers 5's are attention.{q,k,v,o}_proj and
             SwiGLU mlp.{gate,up,down}_proj, older ones' as save_pretrained writes.
  hf_clip    the vision tower of CLIPModel / CLIPVisionModel[WithProjection]:
             [vision_model.]{embeddings.{class_embedding, patch_embedding,
             position_embedding}, pre_layrnorm, encoder.layers.N.{layer_norm1,
             self_attn.{q,k,v,out}_proj, layer_norm2, mlp.fc1/fc2}, post_layernorm},
             visual_projection (our bias-free head). transformers 5 saves a tower
             alone (CLIPVisionModel, SiglipVisionModel, ...) without `vision_model.`.
  hf_siglip  the vision tower of SiglipModel / SiglipVisionModel (SigLIP, and SigLIP 2
             at a fixed resolution): as hf_clip without class token, pre-norm or
             projection, with the attention-pooling head [vision_model.]head.*.
  hf_siglip2 the vision tower of Siglip2Model / Siglip2VisionModel (SigLIP 2 NaFlex):
             as hf_siglip with a Linear patch embedding over patches flattened (row,
             column, channel), our conv's kernel reshaped. NaFlex runs any grid and
             aspect ratio; here one square grid (an analysis needs one), its position
             embedding resized as transformers does (bilinear, antialiased).
  hf_dinov3  DINOv3ViTModel (facebook/dinov3-vit*): embeddings.{cls_token,
             register_tokens, patch_embeddings}, layer.N.{norm1, attention.{q,k,v,o}_proj
             (k without bias), layer_scale1.lambda1, norm2, mlp.{up,down}_proj or the
             gated mlp.{gate,up,down}_proj, layer_scale2.lambda1}, norm; no position
             embedding: DINOv3's rotary embedding of the patch tokens (our rope="dinov3").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from vitcnn_jax.inputs import preprocess
from vitcnn_jax.models.vit.model import ATTN


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where one transformers model keeps each piece, and its config class's defaults."""
  upstream: str  # its config class, for evidence
  wrappers: tuple[str, ...]  # prefixes of the models that hold it ("" first)
  patch: str
  pos: str | None  # the position embedding: (1, T, D) parameter or (T, D) `.weight`
  layer: str  # "{}": the layer index
  names: dict[str, str]  # ours (in a block) -> theirs (after the layer prefix)
  final: str
  defaults: dict[str, Any]  # config.json keys we read -> the config class's default
  cls: str | None = None
  pre_norm: str | None = None
  resample: Callable[[int, int], np.ndarray] = preprocess.torch_bicubic_weights
  dropped: tuple[str, ...] = ()  # other towers' prefixes: left out, said so
  policy: str = "hf_bicubic_crop0.875_imagenet"  # the published models' image processor (DINOv2's)
  rope: str = ""  # its rotary embedding (our ViT's `rope`)
  modules: dict[str, str] | None = None  # `names` as transformers 5's modules (ONNX exports) hold them


_TOWER = dict(wrappers=("", "vision_model."), patch="embeddings.patch_embedding",
              pos="embeddings.position_embedding.weight", layer="encoder.layers.{}.",
              names={"LayerNorm_0": "layer_norm1", f"{ATTN}/query": "self_attn.q_proj",
                     f"{ATTN}/key": "self_attn.k_proj", f"{ATTN}/value": "self_attn.v_proj",
                     f"{ATTN}/out": "self_attn.out_proj", "LayerNorm_1": "layer_norm2",
                     "MlpBlock_0/Dense_0": "mlp.fc1", "MlpBlock_0/Dense_1": "mlp.fc2"},
              final="post_layernorm")
_ENCODER = {"LayerNorm_0": "layernorm_before", f"{ATTN}/query": "attention.attention.query",
            f"{ATTN}/key": "attention.attention.key", f"{ATTN}/value": "attention.attention.value",
            f"{ATTN}/out": "attention.output.dense", "LayerNorm_1": "layernorm_after",
            "MlpBlock_0/Dense_0": "intermediate.dense", "MlpBlock_0/Dense_1": "output.dense"}
_DINOV2 = {**_ENCODER, "LayerNorm_0": "norm1", "LayerNorm_1": "norm2",
           "MlpBlock_0/Dense_0": "mlp.fc1", "MlpBlock_0/Dense_1": "mlp.fc2"}
LAYOUTS = {
    "hf_vit": Layout(
        "ViTConfig", ("", "vit."), "embeddings.patch_embeddings.projection",
        "embeddings.position_embeddings", "encoder.layer.{}.", _ENCODER, "layernorm",
        dict(num_attention_heads=12, hidden_act="gelu", layer_norm_eps=1e-12, image_size=224,
             pooler_act="tanh"), cls="embeddings.cls_token", policy="hf_bilinear_squash_half"),
    "hf_dinov2": Layout(
        "Dinov2Config", ("", "dinov2.", "dinov2_with_registers."),
        "embeddings.patch_embeddings.projection", "embeddings.position_embeddings",
        "encoder.layer.{}.", _DINOV2,
        "layernorm", dict(num_attention_heads=12, hidden_act="gelu", layer_norm_eps=1e-6,
                          image_size=224), cls="embeddings.cls_token",
        modules={**_DINOV2, **{f"{ATTN}/{q}": f"attention.{p}_proj"
                               for q, p in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))}}),
    "hf_clip": Layout(
        "CLIPVisionConfig", **_TOWER, cls="embeddings.class_embedding", pre_norm="pre_layrnorm",
        defaults=dict(num_attention_heads=12, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                      image_size=224),
        dropped=("text_model.", "text_projection.", "logit_scale"), policy="hf_bicubic_crop1_clip"),
    "hf_siglip": Layout(
        "SiglipVisionConfig", **_TOWER,
        defaults=dict(num_attention_heads=12, hidden_act="gelu_pytorch_tanh",
                      layer_norm_eps=1e-6, image_size=224),
        dropped=("text_model.", "logit_scale", "logit_bias"), policy="hf_bicubic_squash_half"),
    "hf_siglip2": Layout(
        "Siglip2VisionConfig", **_TOWER,
        defaults=dict(num_attention_heads=12, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6),
        dropped=("text_model.", "logit_scale", "logit_bias"), policy="hf_bilinear_squash_half",
        resample=preprocess.pil_bilinear_weights),
}
LAYOUTS["hf_dinov3"] = Layout(
    "DINOv3ViTConfig", ("",), "embeddings.patch_embeddings", None, "layer.{}.",
    {"LayerNorm_0": "norm1", f"{ATTN}/query": "attention.q_proj", f"{ATTN}/key": "attention.k_proj",
     f"{ATTN}/value": "attention.v_proj", f"{ATTN}/out": "attention.o_proj", "LayerNorm_1": "norm2",
     "MlpBlock_0/Dense_0": "mlp.up_proj", "MlpBlock_0/Dense_1": "mlp.down_proj"},
    "norm", dict(num_attention_heads=6, hidden_act="gelu", layer_norm_eps=1e-5, image_size=224,
                 rope_theta=100.0),
    cls="embeddings.cls_token", policy="hf_bilinear_squash_imagenet", rope="dinov3")
# config.json's model_type -> (layout, the section holding the vision settings)
MODEL_TYPES = {"vit": ("hf_vit", None), "dinov2": ("hf_dinov2", None),
               "dinov2_with_registers": ("hf_dinov2", None), "clip": ("hf_clip", "vision_config"),
               "clip_vision_model": ("hf_clip", None), "siglip": ("hf_siglip", "vision_config"),
               "siglip_vision_model": ("hf_siglip", None), "siglip2": ("hf_siglip2", "vision_config"),
               "siglip2_vision_model": ("hf_siglip2", None), "dinov3_vit": ("hf_dinov3", None)}

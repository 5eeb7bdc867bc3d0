"""The ResNet v1 family: the model and its readers of timm's (torchvision's)
state dicts, transformers' folders and ONNX graphs."""

from vitcnn_jax.models.family import Family
from vitcnn_jax.models.resnet import onnx, timm, transformers
from vitcnn_jax.models.resnet.model import ResNet

FAMILY = Family("resnet", ResNet, (timm.READER, transformers.READER, onnx.READER))

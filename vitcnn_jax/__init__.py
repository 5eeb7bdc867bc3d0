"""vitcnn_jax: how do vision transformers and CNNs represent what they see?"""

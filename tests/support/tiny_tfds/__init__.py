"""A tiny image dataset prepared as array_record by tfds itself, without TensorFlow."""

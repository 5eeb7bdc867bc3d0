"""The similarity math: minibatch HSIC and CKA, every other measure, layer pairs
and their matching, linear probes.

No jax at import here: `MIN_BATCH` is read by the config checks too.
"""

MIN_BATCH = 4  # the unbiased HSIC's n (n - 3) and (n - 1)(n - 2) must be positive

"""The run loop: how an analysis declares itself and its config is checked, then
models and data loaded, compiled steps over the devices, resumable state and
result files. No jax at import here: configs import `declaration` and `control`."""

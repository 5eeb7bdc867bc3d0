"""What goes into a run besides the models: image sources, preprocessing,
checkpoints and data by name (the zoo), files inside registry packages."""

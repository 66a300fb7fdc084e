"""ktrain-plugin-wandb: a run's config and metrics in Weights & Biases, with Axolotl's ``wandb_*`` keys.

``keys`` declares the keys, ``entry`` decides from them whether the run is tracked, ``tracker`` (the
runtime object, imported only then) opens the W&B run on rank 0 and logs to it.
"""

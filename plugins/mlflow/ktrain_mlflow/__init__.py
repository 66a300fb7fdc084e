"""ktrain-plugin-mlflow: a run's config and metrics in MLflow, with Axolotl's ``mlflow_*`` keys.

``keys`` declares the keys, ``entry`` decides from them whether the run is tracked, ``tracker`` (the
runtime object, imported only then) opens the MLflow run on rank 0 and logs to it.
"""

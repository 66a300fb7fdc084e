"""ktrain-plugin-tensorboard: logged metrics as TensorBoard event files, and ``ktrain plot RUN_DIR``.

Written against ktrain's documented plugin API only. ``keys`` holds ``use_tensorboard``; ``entry`` declares
it and registers the sink and the command; ``sink`` writes the event files; ``plot`` draws metrics.jsonl.
"""

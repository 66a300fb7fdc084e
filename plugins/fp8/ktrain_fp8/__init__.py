"""ktrain-plugin-fp8: float8 matrix multiplies in training (torchao)."""

"""ktrain-plugin-liger: Liger's Triton kernels patched into Hugging Face models."""

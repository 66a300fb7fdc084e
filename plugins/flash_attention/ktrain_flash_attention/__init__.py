"""ktrain-plugin-flash-attention: FlashAttention-4 behind PyTorch SDPA."""

"""ktrain-plugin-qat: quantization-aware training with torchao's fake-quantized linear layers."""

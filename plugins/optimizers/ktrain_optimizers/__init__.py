"""ktrain-plugin-optimizers: Axolotl's low-memory optimizer names over bitsandbytes and torchao."""

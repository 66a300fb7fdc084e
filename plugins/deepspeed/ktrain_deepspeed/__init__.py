"""ktrain-plugin-deepspeed: DeepSpeed ZeRO 1, 2 and 3 for ktrain, enabled by ``deepspeed:``."""

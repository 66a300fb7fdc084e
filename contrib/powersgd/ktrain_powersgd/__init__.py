"""ktrain-plugin-powersgd: PowerSGD gradient compression in the kernel's own DDP, without taking ``sharding``."""

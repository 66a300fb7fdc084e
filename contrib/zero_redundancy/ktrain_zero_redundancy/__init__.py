"""ktrain-plugin-zero-redundancy: torch's ZeroRedundancyOptimizer as a ktrain sharding plugin.

Written against ktrain's documented plugin API only (docs/hooks.md, docs/writing-plugins.md), as a
third party would. ``keys`` holds the config keys; ``entry`` declares and checks them; ``runtime`` is
what a run with ``zero_redundancy: true`` activates; ``engine`` drives DDP plus the sharded optimizer;
``checkpoint`` reads and writes its format.
"""

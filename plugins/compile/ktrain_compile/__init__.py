"""ktrain-plugin-compile: torch.compile of each transformer block."""

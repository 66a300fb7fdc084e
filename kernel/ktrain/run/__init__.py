"""What happens on each rank: process group, model, loop, checkpoints, metrics. Imports torch."""

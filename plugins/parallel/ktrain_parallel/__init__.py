"""ktrain-plugin-parallel: tensor, context and Ulysses sequence parallelism on the run's device mesh."""

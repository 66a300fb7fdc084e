"""ktrain-plugin-preference: preference tuning (DPO, IPO) as the run's training objective."""

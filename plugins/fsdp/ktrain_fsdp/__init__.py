"""ktrain-plugin-fsdp: FSDP2, FSDP1 and HSDP for ktrain, with the FSDP1-to-FSDP2 migration and DCP checkpoints."""

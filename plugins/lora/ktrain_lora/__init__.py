"""ktrain-plugin-lora: LoRA, QLoRA and DoRA adapters through peft and bitsandbytes."""

"""ktrain-plugin-vision: vision-language fine-tuning on chat rows that hold images."""

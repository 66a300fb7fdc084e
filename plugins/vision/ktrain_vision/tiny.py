"""A tiny LLaVA folder made in code (no download): what tests and ``tools/axolotl_examples.py`` train and check on.

The tokenizer is the testing kit's character-level one with ``<image>`` added; the processor is LLaVA's with a
CLIP image processor of 28-pixel crops (16 image tokens an image); the model is LLaVA with a two-layer CLIP
vision tower and a two-layer Llama, trained from random weights (``random_init_weights: true``).
"""

from __future__ import annotations

from pathlib import Path

from ktrain.testing.assets import CHARS, SPECIALS, TINY_LLAMA

IMAGE_TOKEN = "<image>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_vision_model_dir(folder: Path) -> Path:
    """Write the tiny LLaVA's config.json and processor (tokenizer, image processor, chat template) into ``folder``."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import CLIPImageProcessorPil, LlavaConfig, LlavaProcessor, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    specials = [*SPECIALS, IMAGE_TOKEN]
    vocab = {token: i for i, token in enumerate(specials + CHARS)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|pad|>", unk_token="<|unk|>"
    )
    images = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        patch_size=7,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    )
    processor.save_pretrained(folder)
    text = {k: v for k, v in TINY_LLAMA.items() if k not in ("architectures", "torch_dtype", "bos_token_id")}
    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 7,
        "projection_dim": 32,
    }
    config = LlavaConfig(
        text_config={**text, "vocab_size": len(vocab), "max_position_embeddings": 256},
        vision_config=vision,
        image_token_id=vocab[IMAGE_TOKEN],
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    config.save_pretrained(folder)
    return folder

"""A tiny model folder and a small chat dataset, made in code: what a plugin's tests train on.

Nothing is downloaded and no file ships with ktrain: the tokenizer is built with the ``tokenizers``
library (one token per printable ASCII character, ChatML special tokens and chat template, like the
quickstart's), the model is a two-layer Llama config trained from random weights
(``random_init_weights: true``) or with seeded random weights saved in the folder, and the rows are
arithmetic questions with their answers (sums; or the quickstart's sums and differences, row for row).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SPECIALS = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": len(SPECIALS) + len(CHARS),
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")


def _special(content: str) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def write_tokenizer(folder: Path) -> None:
    """Write a character-level tokenizer with a ChatML chat template into ``folder`` (HF files)."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {token: i for i, token in enumerate(SPECIALS + CHARS)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(SPECIALS)
    (folder / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    names = {"eos_token": "<|im_end|>", "pad_token": "<|pad|>", "unk_token": "<|unk|>"}
    _dump(folder / "special_tokens_map.json", {k: _special(v) for k, v in names.items()})
    _dump(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            **names,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": TINY_LLAMA["max_position_embeddings"],
            "padding_side": "right",
            "chat_template": CHAT_TEMPLATE,
            "added_tokens_decoder": {str(i): {**_special(t), "special": True} for i, t in enumerate(SPECIALS)},
        },
    )


def write_model_dir(folder: Path, *, weights: bool = False, seed: int = 0, **overrides: Any) -> Path:
    """A local HF model folder: the tokenizer and the tiny Llama's config.json (``overrides`` change it).

    Without ``weights`` a config trains it with ``random_init_weights: true``; with ``weights`` the folder
    also holds random weights drawn with torch seed ``seed`` (safetensors), which ``base_model`` loads.
    """
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder)
    _dump(folder / "config.json", {**TINY_LLAMA, **overrides})
    if weights:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def arithmetic_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` chat rows such as ``What is 37+48?`` -> ``85``, the same for the same seed."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        messages = [{"role": "user", "content": f"What is {a}+{b}?"}, {"role": "assistant", "content": str(a + b)}]
        rows.append({"messages": messages})
    return rows


def quickstart_rows(count: int) -> list[dict[str, Any]]:
    """The first ``count`` training rows of the quickstart's task, those of configs/quickstart/data/train.jsonl.

    The task: ``a+b`` and ``a-b`` for two-digit ``a`` and ``b`` (a difference only where it is not negative),
    shuffled with seed 1234; the first 200 problems are its held-out test rows, the next 8000 its training rows.
    """
    problems = [(a, "+", b) for a in range(10, 100) for b in range(10, 100)]
    problems += [(a, "-", b) for a in range(10, 100) for b in range(10, a + 1)]
    random.Random(1234).shuffle(problems)
    rows = []
    for a, op, b in problems[200 : 200 + min(count, 8000)]:
        answer = a + b if op == "+" else a - b
        messages = [{"role": "user", "content": f"What is {a}{op}{b}?"}, {"role": "assistant", "content": str(answer)}]
        rows.append({"messages": messages})
    return rows


def write_chat_dataset(path: Path, count: int = 200, seed: int = 0) -> Path:
    """A jsonl file of ``count`` arithmetic chat rows, for ``datasets: [{path: ..., type: chat_template}]``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in arithmetic_rows(count, seed)), encoding="utf-8")
    return path

"""Regenerate the quickstart assets: tiny Llama config, char-level tokenizer, arithmetic chat data.

Writes, byte-identically on every run (fixed seed, no timestamps or version strings):

* ``configs/quickstart/model/``: ``config.json`` (LlamaForCausalLM, random init, no weights),
  ``tokenizer.json``, ``tokenizer_config.json`` (ChatML ``chat_template``), ``special_tokens_map.json``.
* ``configs/quickstart/data/``: ``train.jsonl`` (8000 rows) and ``test.jsonl`` (200 held-out rows, no question
  shared with train), rows like
  ``{"messages": [{"role": "user", "content": "What is 37+48?"}, {"role": "assistant", "content": "85"}]}``.
  The task: a+b and a-b for two-digit a, b (10..99), subtraction only where a >= b.

The tokenizer is character level: one token per printable ASCII character (space included) plus ``\\n``;
no normalizer, so whitespace is kept verbatim. Ids: 0 ``<|pad|>``, 1 ``<|im_start|>``, 2 ``<|im_end|>`` (EOS),
3 ``<|unk|>``, then ``\\n``, then chr(32)..chr(126). Usage: ``python tools/quickstart/make_assets.py``.
"""

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models

ROOT = Path(__file__).resolve().parents[2] / "configs" / "quickstart"
SEED = 1234
N_TEST = 200
N_TRAIN = 8000
SPECIALS = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": len(SPECIALS) + len(CHARS),
    "hidden_size": 96,
    "intermediate_size": 384,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 24,
    "max_position_embeddings": 64,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "initializer_range": 0.02,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "use_cache": True,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


def dump(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def special(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def write_tokenizer(out: Path) -> None:
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    dump(out / "tokenizer.json", json.loads(tok.to_str()))
    names = {"eos_token": "<|im_end|>", "pad_token": "<|pad|>", "unk_token": "<|unk|>"}
    dump(out / "special_tokens_map.json", {k: special(v) for k, v in names.items()})
    dump(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            **names,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": MODEL["max_position_embeddings"],
            "padding_side": "right",
            "chat_template": CHAT_TEMPLATE,
            "added_tokens_decoder": {str(i): {**special(t), "special": True} for i, t in enumerate(SPECIALS)},
        },
    )


def row(a: int, op: str, b: int) -> str:
    answer = a + b if op == "+" else a - b
    msgs = [{"role": "user", "content": f"What is {a}{op}{b}?"}, {"role": "assistant", "content": str(answer)}]
    return json.dumps({"messages": msgs}) + "\n"


def write_data(out: Path) -> None:
    # Two-digit operands; subtraction only with a non-negative result.
    problems = [(a, "+", b) for a in range(10, 100) for b in range(10, 100)]
    problems += [(a, "-", b) for a in range(10, 100) for b in range(10, a + 1)]
    random.Random(SEED).shuffle(problems)
    out.mkdir(parents=True, exist_ok=True)
    (out / "test.jsonl").write_text("".join(row(*p) for p in problems[:N_TEST]), encoding="utf-8")
    (out / "train.jsonl").write_text("".join(row(*p) for p in problems[N_TEST : N_TEST + N_TRAIN]), encoding="utf-8")


def main() -> None:
    dump(ROOT / "model" / "config.json", MODEL)
    write_tokenizer(ROOT / "model")
    write_data(ROOT / "data")
    print(f"wrote assets under {ROOT}")


if __name__ == "__main__":
    main()

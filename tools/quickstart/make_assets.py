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

from ktrain.testing.assets import TINY_LLAMA, write_tokenizer

ROOT = Path(__file__).resolve().parents[2] / "configs" / "quickstart"
SEED = 1234
N_TEST = 200
N_TRAIN = 8000
MODEL = {  # the testing kit's tiny Llama, a little wider and one layer deeper: enough to learn the task
    **TINY_LLAMA,
    "hidden_size": 96,
    "intermediate_size": 384,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 24,
    "attention_bias": False,
    "mlp_bias": False,
    "use_cache": True,
}


def dump(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


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
    write_tokenizer(ROOT / "model")  # the kit's tokenizer: the same files as ktrain.testing.write_model_dir
    write_data(ROOT / "data")
    print(f"wrote assets under {ROOT}")


if __name__ == "__main__":
    main()

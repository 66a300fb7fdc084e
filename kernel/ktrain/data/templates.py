"""Chat templates by name, for ``chat_template:`` (top level, or per ``datasets:`` item).

``tokenizer_default`` is the tokenizer's own template; ``jinja`` takes ``chat_template_jinja``. The
named ones are the usual formats of each model family, written so that rendering the first turns of a
conversation gives a prefix of rendering all of it: the masking of ``formats.chat_template`` relies on it.
The templates in ``chat_templates/`` are Axolotl's of the same name (Axolotl 0.18.0, Apache-2.0); some
render an earlier reply differently once later turns follow (Qwen3's drops its thinking block), and the
masking finds such a turn by its content. Left out: Command A's, which end every conversation with a
generation prompt. tests/unit/test_data_formats.py trains the assistant replies through each.
Imports nothing heavy: the kernel's entry module checks names against this table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FOLDER = Path(__file__).with_name("chat_templates")

_CHATML_TURNS = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

NAMED: dict[str, str] = {
    "chatml": _CHATML_TURNS,
    "qwen": (
        "{% if not messages or messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
        "{% endif %}" + _CHATML_TURNS
    ),
    "llama3": (
        "{% if bos_token %}{{ bos_token }}{% endif %}"
        "{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
        " + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    ),
    "gemma": (
        "{% if bos_token %}{{ bos_token }}{% endif %}"
        "{% for message in messages %}"
        "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
    ),
    "phi_3": (
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    ),
}
AXOLOTL: tuple[str, ...] = tuple(sorted(path.stem for path in FOLDER.glob("*.jinja")))
CHOICES = ("tokenizer_default", "jinja", *NAMED, *AXOLOTL)


def template_name(entry: Any, config: Any) -> str:
    """The template an entry uses: its own ``chat_template``, else the top-level one, else the tokenizer's."""
    if entry is not None and entry.chat_template:
        return entry.chat_template
    if config.chat_template:
        return config.chat_template
    return "jinja" if config.chat_template_jinja else "tokenizer_default"


def resolve(name: str, config: Any, tokenizer: Any, key: str) -> str:
    """The Jinja text of template ``name``; an error names ``key`` when there is none."""
    if name == "tokenizer_default":
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"{key}: the tokenizer has no chat template of its own; name one "
                f"({', '.join(NAMED)}) or give chat_template_jinja"
            )
        return tokenizer.chat_template
    if name == "jinja":
        if not config.chat_template_jinja:
            raise ValueError(f"{key}: 'jinja' needs chat_template_jinja, the template's text")
        return config.chat_template_jinja
    if name in NAMED:
        return NAMED[name]
    return (FOLDER / f"{name}.jinja").read_text(encoding="utf-8")


def end_of_turn_ids(config: Any, tokenizer: Any) -> set[int]:
    """The ids of the tokens that end a chat turn: those of ``eot_tokens``, else the tokenizer's EOS.

    A token of ``eot_tokens`` that is not one token of the tokenizer raises ``ValueError`` naming the key.
    """
    if not config.eot_tokens:
        return {tokenizer.eos_token_id}
    found = set()
    for token in config.eot_tokens:
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(
                f"eot_tokens: {token!r} is {len(ids)} tokens of this tokenizer, not one; "
                "add it to the vocabulary with tokens: [...] or name the template's own end-of-turn token"
            )
        found.add(ids[0])
    return found

"""Row formats: one function per ``type:`` of a ``datasets:`` entry, each ``(row, tokenizer, entry, config)``.

Each returns ``{"input_ids": [...], "labels": [...]}`` with -100 on tokens that carry no loss, or None
to skip a row. Prompt tokens carry no loss unless ``train_on_inputs`` is true.
"""

from __future__ import annotations

from typing import Any

IGNORE = -100

ALPACA_PROMPT = (
    "Below is an instruction that describes a task{with_input}. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n{input_block}### Response:\n"
)
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant"}


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _chat_ids(tokenizer: Any, messages: list[dict], generation_prompt: bool, template: str | None) -> list[int]:
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=generation_prompt, chat_template=template
    )
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def _messages(row: dict, entry: Any, default_field: str, role_names: dict[str, str]) -> list[dict] | None:
    turns = row.get(entry.field_messages or default_field)
    if turns is None and default_field == "messages":
        turns = row.get("conversations")
        role_names = SHAREGPT_ROLES
    if not isinstance(turns, list):
        return None
    mapping = entry.message_property_mappings or {}
    role_key, content_key = mapping.get("role", "role"), mapping.get("content", "content")
    if turns and role_key not in turns[0] and "from" in turns[0]:
        role_key, content_key, role_names = "from", "value", SHAREGPT_ROLES
    messages = []
    for turn in turns:
        role = turn.get(role_key)
        messages.append({"role": role_names.get(role, role), "content": turn.get(content_key, "")})
    return messages


def chat_template(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """OpenAI-style ``messages`` (or ShareGPT ``conversations`` with from/value), rendered by the chat template.

    Turns of ``roles_to_train`` (default: assistant) carry labels: the tokens a generation prompt
    would not already contain, i.e. the reply and its end-of-turn token.
    """
    messages = _messages(row, entry, "messages", {})
    if not messages:
        return None
    template = entry.chat_template or (config.chat_template if config.chat_template != "tokenizer_default" else None)
    trained = set(entry.roles_to_train or ["assistant"])
    input_ids = _chat_ids(tokenizer, messages, False, template)
    labels = list(input_ids) if config.train_on_inputs else [IGNORE] * len(input_ids)
    if not config.train_on_inputs:
        for i, message in enumerate(messages):
            if message["role"] not in trained:
                continue
            start = len(_chat_ids(tokenizer, messages[:i], True, template)) if i else 0
            end = len(_chat_ids(tokenizer, messages[: i + 1], False, template))
            labels[start:end] = input_ids[start:end]
    return {"input_ids": input_ids, "labels": labels}


def sharegpt(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """ShareGPT ``conversations`` (from: human/gpt, value); the older spelling of chat_template."""
    return chat_template(row, tokenizer, entry, config)


def alpaca(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """``instruction``, optional ``input``, ``output``: the Alpaca prompt, loss on the output and EOS."""
    if "instruction" not in row or "output" not in row:
        return None
    extra = row.get("input") or ""
    prompt = ALPACA_PROMPT.format(
        with_input=", paired with an input that provides further context" if extra else "",
        instruction=row["instruction"],
        input_block=f"### Input:\n{extra}\n\n" if extra else "",
    )
    prompt_ids = _ids(tokenizer, prompt)
    if tokenizer.bos_token_id is not None:
        prompt_ids = [tokenizer.bos_token_id, *prompt_ids]
    answer_ids = [*_ids(tokenizer, row["output"]), tokenizer.eos_token_id]
    prompt_labels = list(prompt_ids) if config.train_on_inputs else [IGNORE] * len(prompt_ids)
    return {"input_ids": prompt_ids + answer_ids, "labels": prompt_labels + answer_ids}


def completion(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """Raw text in ``entry.field`` (default ``text``), every token trained, EOS appended."""
    text = row.get(entry.field or "text")
    if not isinstance(text, str) or not text:
        return None
    ids = [*_ids(tokenizer, text), tokenizer.eos_token_id]
    return {"input_ids": ids, "labels": list(ids)}


def pretokenized(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """Rows that already hold ``input_ids`` (and optionally ``labels``): the entry has no ``type``."""
    ids = row.get("input_ids")
    if not isinstance(ids, list) or not ids:
        return None
    labels = row.get("labels", ids)
    return {"input_ids": list(ids), "labels": list(labels)}

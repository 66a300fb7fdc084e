"""Row formats: one function per ``type:`` of a ``datasets:`` entry, each ``(row, tokenizer, entry, config)``.

Each returns ``{"input_ids": [...], "labels": [...]}`` with -100 on tokens that carry no loss, or None
for an empty sample. A field the type needs and the row lacks raises ``KeyError(field)``; a field of the
wrong kind raises ``TypeError``: the caller names the dataset, the sample and the line. Prompt tokens
carry no loss unless ``train_on_inputs`` is true.
"""

from __future__ import annotations

import bisect
from typing import Any

from ktrain.data import templates

IGNORE = -100

ALPACA_PROMPT = (
    "Below is an instruction that describes a task{with_input}. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n{input_block}### Response:\n"
)
# Axolotl's other prompt layouts of alpaca's rows (``type: alpaca:<style>``): the system line, then the turn with
# an input, or the turn without one; the output follows the turn directly.
ALPACA_SYSTEM = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.",
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.",
)
ALPACA_STYLES = {
    "alpaca:chat": (
        "SYSTEM: {system}\n",
        "USER: {instruction}\n{input}\nASSISTANT:",
        "USER: {instruction}\nASSISTANT:",
    ),
    "alpaca:chatml": (
        "<|im_start|>system\n{system}<|im_end|>\n",
        "<|im_start|>user\n{instruction}\n{input}<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n",
    ),
    "alpaca:phi": (
        "<|system|>\n{system}<|end|>\n",
        "<|user|>\n{instruction}<|end|>{input}<|assistant|>",
        "<|user|>\n{instruction}<|end|>\n<|assistant|>\n",
    ),
}
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant"}


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without the tokenizer's own BOS/EOS."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def text_field(row: dict, name: str, required: bool = True) -> str:
    """Field ``name`` of ``row`` as text; a missing (or null) required field raises ``KeyError(name)``."""
    value = row.get(name)
    if value is None:
        if required:
            raise KeyError(name)
        return ""
    if not isinstance(value, str):
        raise TypeError(f"field '{name}' is a {type(value).__name__}, not text")
    return value


def _messages(row: dict, entry: Any) -> list[dict]:
    """The turns of a chat row as ``{"role", "content"}``: OpenAI ``messages`` or ShareGPT ``conversations``;
    with ``field_thinking`` or ``template_thinking_key``, a turn's reasoning too, under the name the template
    reads (``reasoning_content`` unless written)."""
    field = entry.field_messages or ("messages" if "messages" in row or "conversations" not in row else "conversations")
    turns = row.get(field)
    if turns is None:
        raise KeyError(field)
    if not isinstance(turns, list):
        raise TypeError(f"field '{field}' is a {type(turns).__name__}, not a list of turns")
    mapping = entry.message_property_mappings or {}
    role_key = mapping.get("role", entry.message_field_role or "role")
    content_key = mapping.get("content", entry.message_field_content or "content")
    names: dict[str, str] = {}
    if turns and isinstance(turns[0], dict) and role_key not in turns[0] and "from" in turns[0]:
        role_key, content_key, names = "from", "value", SHAREGPT_ROLES
    elif role_key == "from":
        names = SHAREGPT_ROLES
    if entry.roles:
        names = {**names, **{source: role for role, sources in entry.roles.items() for source in sources}}
    thinking = entry.field_thinking or entry.template_thinking_key  # either one passes the reasoning on
    thinking_field = entry.field_thinking or "reasoning_content"
    thinking_key = (entry.template_thinking_key or "reasoning_content") if thinking else None
    messages = []
    for n, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise TypeError(f"turn {n} of '{field}' is a {type(turn).__name__}, not an object")
        role = turn.get(role_key)
        if role is None:
            raise KeyError(f"{field}[{n}].{role_key}")
        content = text_field(turn, content_key, required=False)
        message = {"role": names.get(role, role), "content": content}
        if thinking_key and turn.get(thinking_field) is not None:
            message[thinking_key] = text_field(turn, thinking_field)
        messages.append(message)
    return messages


def _render(tokenizer: Any, messages: list[dict], generation_prompt: bool, template: str) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, chat_template=template
    )


def chat_template(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """OpenAI-style ``messages`` (or ShareGPT ``conversations`` with from/value), rendered by a chat template.

    The conversation is rendered once and tokenized once; character offsets say which tokens belong to
    which turn. Turns of ``roles_to_train`` (default: assistant) carry labels: for an assistant turn,
    what follows the generation prompt; for other roles, the turn's content onwards. ``train_on_eos``
    (default ``turn``) decides the end-of-turn token: ``turn`` trains it and nothing after it in the turn,
    ``none`` neither, ``last`` only in the last trained turn, ``all`` in every turn. A template that renders
    a turn differently once later turns follow (one dropping an earlier reply's thinking block) has that
    turn found by its content: the content and the end-of-turn token right after it. The end-of-turn tokens
    are those of ``eot_tokens`` (default: the tokenizer's EOS). ``drop_system_message`` leaves out a first
    system turn.
    """
    messages = _messages(row, entry)
    if entry.drop_system_message and messages and messages[0]["role"] == "system":
        messages = messages[1:]
    if not messages:
        return None
    name = templates.template_name(entry, config)
    template = templates.resolve(name, config, tokenizer, "chat_template")
    text = _render(tokenizer, messages, False, template)
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:
        raise TypeError("chat_template masking needs a fast tokenizer (one with offsets)") from None
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    if config.train_on_inputs:
        return {"input_ids": ids, "labels": list(ids)}
    trained_roles = set(entry.roles_to_train or ["assistant"])
    eos_mode = entry.train_on_eos or "turn"
    ends = templates.end_of_turn_ids(config, tokenizer)
    labels = [IGNORE] * len(ids)
    starts = [a for a, _ in offsets]  # non-decreasing: a turn's tokens are found by bisection
    turns = [i for i, m in enumerate(messages) if m["role"] in trained_roles]
    places: list[tuple[int, int] | None] | None = None  # the turns' contents in the text, found when needed
    for i in turns:
        bounds = _rendered_bounds(tokenizer, messages, i, text, template)
        if bounds is None:  # the template renders this turn differently once later turns follow
            places = places if places is not None else _content_places(messages, text)
            bounds = _found_bounds(places[i], text, ids, offsets, starts, ends)
            if bounds is None:
                raise ValueError(
                    f"chat template {name!r} renders turn {i} differently once later turns follow, "
                    "and the turn's content is not in the whole conversation's text"
                )
        start, end = bounds
        lo, hi = bisect.bisect_left(starts, start), bisect.bisect_left(starts, end)
        span = [t for t in range(lo, hi) if offsets[t][1] > offsets[t][0]]
        if not span:
            continue
        last_eos = max((t for t in span if ids[t] in ends), default=None)
        stop = span[-1] if last_eos is None else last_eos
        keep_eos = eos_mode == "turn" or eos_mode == "all" or (eos_mode == "last" and i == turns[-1])
        if last_eos is not None and not keep_eos:
            stop -= 1
        for t in span:
            if t <= stop:
                labels[t] = ids[t]
    if eos_mode == "all":
        labels = [t if t in ends else label for t, label in zip(ids, labels, strict=True)]
    return {"input_ids": ids, "labels": labels}


def _rendered_bounds(tokenizer: Any, messages: list[dict], i: int, text: str, template: str) -> tuple[int, int] | None:
    """Where turn ``i`` is trained in ``text``, by rendering the turns up to it: for an assistant turn, from
    the end of the generation prompt to the end of the turn; for another role, from its content on. None
    when those renderings are not prefixes of ``text`` (and the generation prompt of the turn's rendering)."""
    upto = _render(tokenizer, messages[: i + 1], False, template)
    if not text.startswith(upto):
        return None
    if messages[i]["role"] == "assistant":
        prompt = _render(tokenizer, messages[:i], True, template)
        return (len(prompt), len(upto)) if upto.startswith(prompt) else None
    turn_start = len(_render(tokenizer, messages[:i], False, template)) if i else 0
    found = text.find(messages[i]["content"].strip(), turn_start, len(upto))
    return (found if found >= 0 else turn_start), len(upto)


def _content_places(messages: list[dict], text: str) -> list[tuple[int, int] | None]:
    """Each turn's content located in ``text``, in order (each search starts where the previous turn's
    content ended), from its reasoning on where the turn has one rendered before it; None for a turn
    whose content is empty or not found."""
    places: list[tuple[int, int] | None] = []
    cursor = 0
    for message in messages:
        content = message["content"].strip()
        found = text.find(content, cursor) if content else -1
        if found < 0:
            places.append(None)
            continue
        reasoning = [v.strip() for k, v in message.items() if k not in ("role", "content") and isinstance(v, str)]
        before = [at for at in (text.find(r, cursor, found) for r in reasoning if r) if at >= 0]
        places.append((min([found, *before]), found + len(content)))
        cursor = found + len(content)
    return places


def _found_bounds(
    place: tuple[int, int] | None, text: str, ids: list[int], offsets: Any, starts: list[int], ends: set[int]
) -> tuple[int, int] | None:
    """A turn's trained characters from its content's place: the content, and the end-of-turn token that
    follows it (after whitespace only), if one does."""
    if place is None:
        return None
    start, stop = place
    t = bisect.bisect_left(starts, stop)
    while t < len(ids) and ids[t] not in ends and not text[offsets[t][0] : offsets[t][1]].strip():
        t += 1
    if t < len(ids) and ids[t] in ends and not text[stop : offsets[t][0]].strip():
        return start, offsets[t][1]
    return start, stop


def sharegpt(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """ShareGPT ``conversations`` (from: human/gpt, value); the older spelling of chat_template."""
    return chat_template(row, tokenizer, entry, config)


def alpaca(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """``instruction``, optional ``input``, ``output`` (renamed by ``field_instruction`` ...): loss on output + EOS."""
    instruction = text_field(row, entry.field_instruction or "instruction")
    output = text_field(row, entry.field_output or "output")
    extra = text_field(row, entry.field_input or "input", required=False)
    prompt = ALPACA_PROMPT.format(
        with_input=", paired with an input that provides further context" if extra else "",
        instruction=instruction,
        input_block=f"### Input:\n{extra}\n\n" if extra else "",
    )
    return _prompted(prompt, output, tokenizer, config)


def alpaca_style(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """Alpaca's rows in the prompt layout ``ALPACA_STYLES`` names for ``entry.type`` (Axolotl's
    ``alpaca:chat``, ``alpaca:chatml``, ``alpaca:phi``), with alpaca's system line: loss on output + EOS."""
    instruction = text_field(row, entry.field_instruction or "instruction")
    output = text_field(row, entry.field_output or "output")
    extra = text_field(row, entry.field_input or "input", required=False)
    system, turn, turn_no_input = ALPACA_STYLES[entry.type]
    prompt = system.format(system=ALPACA_SYSTEM[0] if extra else ALPACA_SYSTEM[1]) + (
        turn.format(instruction=instruction, input=extra) if extra else turn_no_input.format(instruction=instruction)
    )
    return _prompted(prompt, output, tokenizer, config)


def _prompted(prompt: str, output: str, tokenizer: Any, config: Any) -> dict:
    """BOS (where the tokenizer has one), ``prompt`` and ``output`` + EOS, with loss on the output + EOS only
    (on the prompt too under ``train_on_inputs``)."""
    prompt_ids = encode(tokenizer, prompt)
    if tokenizer.bos_token_id is not None:
        prompt_ids = [tokenizer.bos_token_id, *prompt_ids]
    answer_ids = [*encode(tokenizer, output), tokenizer.eos_token_id]
    prompt_labels = list(prompt_ids) if config.train_on_inputs else [IGNORE] * len(prompt_ids)
    return {"input_ids": prompt_ids + answer_ids, "labels": prompt_labels + answer_ids}


def completion(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """Raw text in ``entry.field`` (default ``text``), every token trained, EOS appended."""
    text = text_field(row, entry.field or entry.text_column or "text")
    if not text:
        return None
    ids = [*encode(tokenizer, text), tokenizer.eos_token_id]
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id, *ids]
    return {"input_ids": ids, "labels": list(ids)}


def input_output(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """``segments`` (or ``entry.field``): a list of ``{"text": ..., "label": true|false}``, tokenized in order.

    A segment with ``label: false`` carries no loss; ``label`` defaults to true. No BOS or EOS is added:
    write them in the text where the model needs them. ``train_on_inputs`` does not apply.
    """
    field = entry.field or "segments"
    segments = row.get(field)
    if segments is None:
        raise KeyError(field)
    if not isinstance(segments, list):
        raise TypeError(f"field '{field}' is a {type(segments).__name__}, not a list of segments")
    ids: list[int] = []
    labels: list[int] = []
    for n, segment in enumerate(segments):
        if not isinstance(segment, dict):
            raise TypeError(f"segment {n} of '{field}' is a {type(segment).__name__}, not an object")
        if "text" not in segment:
            raise KeyError(f"{field}[{n}].text")
        text = text_field(segment, "text")
        label = segment.get("label", True)
        if not isinstance(label, bool):
            raise TypeError(f"'{field}[{n}].label' is a {type(label).__name__}, not true or false")
        piece = encode(tokenizer, text)
        ids += piece
        labels += piece if label else [IGNORE] * len(piece)
    return {"input_ids": ids, "labels": labels} if ids else None


def pretokenized(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """Rows that already hold ``input_ids`` (and optionally ``labels``): the entry has no ``type``."""
    ids = row.get("input_ids")
    if ids is None:
        raise KeyError("input_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise TypeError("field 'input_ids' is not a list of integers")
    labels = row.get("labels", ids)
    if not isinstance(labels, list) or len(labels) != len(ids):
        raise ValueError(f"field 'labels' must be a list as long as input_ids ({len(ids)})")
    return {"input_ids": list(ids), "labels": list(labels)} if ids else None

"""Axolotl's preference dataset types of the ChatML and Llama 3 families: ``chatml.intel``, ``llama3.argilla``, ...

Each type names a row's fields and writes the prompt and the answers as text in the family's turn markup,
as Axolotl's DPO strategies do before handing them to TRL: the prompt is the optional ``system`` turn, the
user turn and the opened assistant turn; each answer is closed by the family's end of turn. The text is
then tokenized as TRL does plain text (``pairs.render_text``: the answers also get the EOS token).

The types and their fields: ``argilla`` (and Llama 3's ``default``): the prompt in ``prompt``, ``input``,
``question`` or ``instruction`` (the first present), the answers in ``chosen`` or ``chosen_response`` and
``rejected`` or ``rejected_response``; ``intel``: ``question``; ``icr``: ``input``; ``prompt_pairs``:
``prompt``; ``ultra``: ``prompt``, each answer the second turn of ``chosen`` and ``rejected``;
``argilla_chat``: the prompt the first turn of ``chosen``, the answers their second turns (no system).

Under ``rl: kto`` the same names (and Llama 3's ``argilla``) are Axolotl's KTO strategies: a row's prompt
and one ``completion``, with TRL's ``label``: ``argilla``: the prompt in ``instruction``; ``intel``:
``question``; ``prompt_pairs`` and ``ultra``: ``prompt``; ``argilla_chat``: the prompt and the answer the
first and second turns of ``completion`` (no system). ``icr`` and Llama 3's ``default`` have no KTO form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ktrain_preference.pairs import pair_sample, render_text
from ktrain_preference.unpaired import desirable, unpaired_sample

# family -> (a turn of a role, opened; the end of a turn)
FAMILIES = {
    "chatml": ("<|im_start|>{role}\n", "<|im_end|>\n"),
    "llama3": ("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>"),
}
STRATEGIES = ("argilla", "argilla_chat", "icr", "intel", "prompt_pairs", "ultra")
KTO_STRATEGIES = ("argilla", "argilla_chat", "intel", "prompt_pairs", "ultra")


def _first(row: dict, names: tuple[str, ...]) -> str:
    """The first of ``names`` the row holds (the last when it holds none, for the error's field)."""
    return next((name for name in names if name in row), names[-1])


def _second_turn(value: Any) -> str:
    if not isinstance(value, list) or len(value) < 2 or not isinstance(value[1], dict) or "content" not in value[1]:
        raise ValueError("an answer is not a list of turns whose second has a content")
    return value[1]["content"]


def _fields(strategy: str, row: dict) -> tuple[Any, str, str, str]:
    """(system or None, prompt, chosen, rejected) of ``row`` under ``strategy``."""
    if strategy == "argilla_chat":
        for name in ("chosen", "rejected"):
            if name not in row:
                raise KeyError(name)
        first = row["chosen"][0] if isinstance(row["chosen"], list) and row["chosen"] else None
        if not isinstance(first, dict) or "content" not in first:
            raise ValueError("chosen is not a list of turns whose first has a content")
        return None, first["content"], _second_turn(row["chosen"]), _second_turn(row["rejected"])
    prompt = {
        "argilla": _first(row, ("prompt", "input", "question", "instruction")),
        "intel": "question",
        "icr": "input",
        "prompt_pairs": "prompt",
        "ultra": "prompt",
    }[strategy]
    chosen, rejected = "chosen", "rejected"
    if strategy == "argilla":
        chosen, rejected = _first(row, ("chosen", "chosen_response")), _first(row, ("rejected", "rejected_response"))
    for name in (prompt, chosen, rejected):
        if row.get(name) is None:
            raise KeyError(name)
    if strategy == "ultra":
        return row.get("system"), row[prompt], _second_turn(row[chosen]), _second_turn(row[rejected])
    return row.get("system"), row[prompt], row[chosen], row[rejected]


def _kto_fields(strategy: str, row: dict) -> tuple[Any, str, str]:
    """(system or None, prompt, completion) of a KTO ``row`` under ``strategy``."""
    if strategy == "argilla_chat":
        turns = row.get("completion")
        if turns is None:
            raise KeyError("completion")
        if not isinstance(turns, list) or len(turns) < 2 or not all(isinstance(t, dict) for t in turns[:2]):
            raise ValueError("completion is not a list of turns whose first two have a content")
        if "content" not in turns[0] or "content" not in turns[1]:
            raise ValueError("completion is not a list of turns whose first two have a content")
        return None, turns[0]["content"], turns[1]["content"]
    prompt = {"argilla": "instruction", "intel": "question", "prompt_pairs": "prompt", "ultra": "prompt"}[strategy]
    for name in (prompt, "completion"):
        if row.get(name) is None:
            raise KeyError(name)
    return row.get("system"), row[prompt], row["completion"]


def _written(family: str, system: Any, prompt: Any, answers: tuple[Any, ...]) -> tuple[str, ...]:
    """The prompt's turns (the optional system turn, the user turn, the opened assistant turn) and each answer
    closed by the family's end of turn."""
    if not all(isinstance(v, str) for v in (prompt, *answers)):
        raise TypeError("the prompt and the answers must be text")
    opened, end = FAMILIES[family]
    head = f"{opened.format(role='system')}{system}{end}" if system else ""
    head += f"{opened.format(role='user')}{prompt}{end}{opened.format(role='assistant')}"
    close = end.rstrip("\n")
    return (head, *(answer + close for answer in answers))


def texts(family: str, strategy: str, row: dict) -> tuple[str, ...]:
    """The prompt, chosen and rejected text of ``row`` as Axolotl's ``family.strategy`` writes them."""
    system, prompt, chosen, rejected = _fields(strategy, row)
    return _written(family, system, prompt, (chosen, rejected))


def kto_texts(family: str, strategy: str, row: dict) -> tuple[str, ...]:
    """The prompt and completion text of a KTO ``row`` as Axolotl's KTO ``family.strategy`` writes them."""
    system, prompt, completion = _kto_fields(strategy, row)
    return _written(family, system, prompt, (completion,))


def axolotl_format(family: str, strategy: str) -> Callable[[dict, Any, Any, Any], dict]:
    """The tokenizer of the dataset type ``family.strategy``: a pair as one sample, as ``pairs.tokenize_pair``;
    under ``rl: kto`` a row's prompt and completion as one sample, as ``unpaired.tokenize_unpaired``."""

    def tokenize(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict:
        if config.rl == "kto":
            good = desirable(row)
            prompt, completion = kto_texts(family, strategy, row)
            ids, (with_answer,) = render_text(prompt, (completion,), tokenizer)
            return unpaired_sample(ids, with_answer, good, config.sequence_len)
        prompt, chosen, rejected = texts(family, strategy, row)
        ids, (with_chosen, with_rejected) = render_text(prompt, (chosen, rejected), tokenizer)
        return pair_sample(ids, with_chosen, with_rejected, config.sequence_len)

    tokenize.sequences = 2  # type: ignore[attr-defined]
    return tokenize


def type_names() -> dict[str, tuple[str, str]]:
    """Every pair type this module reads: its name, and its (family, strategy)."""
    names = {f"{family}.{strategy}": (family, strategy) for family in FAMILIES for strategy in STRATEGIES}
    del names["llama3.argilla"]  # Axolotl's Llama 3 family calls it default
    names["llama3.default"] = ("llama3", "argilla")
    return names


def kto_type_names() -> dict[str, tuple[str, str]]:
    """Every KTO type this module reads: its name, and its (family, strategy)."""
    return {f"{family}.{strategy}": (family, strategy) for family in FAMILIES for strategy in KTO_STRATEGIES}

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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ktrain_preference.pairs import pair_sample, render_text

# family -> (a turn of a role, opened; the end of a turn)
FAMILIES = {
    "chatml": ("<|im_start|>{role}\n", "<|im_end|>\n"),
    "llama3": ("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>"),
}
STRATEGIES = ("argilla", "argilla_chat", "icr", "intel", "prompt_pairs", "ultra")


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


def texts(family: str, strategy: str, row: dict) -> tuple[str, str, str]:
    """The prompt, chosen and rejected text of ``row`` as Axolotl's ``family.strategy`` writes them."""
    opened, end = FAMILIES[family]
    system, prompt, chosen, rejected = _fields(strategy, row)
    if not all(isinstance(v, str) for v in (prompt, chosen, rejected)):
        raise TypeError("the prompt and the answers must be text")
    head = f"{opened.format(role='system')}{system}{end}" if system else ""
    head += f"{opened.format(role='user')}{prompt}{end}{opened.format(role='assistant')}"
    close = end.rstrip("\n")
    return head, chosen + close, rejected + close


def axolotl_format(family: str, strategy: str) -> Callable[[dict, Any, Any, Any], dict]:
    """The tokenizer of the dataset type ``family.strategy``: a pair as one sample, as ``pairs.tokenize_pair``."""

    def tokenize(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict:
        prompt, chosen, rejected = texts(family, strategy, row)
        ids, (with_chosen, with_rejected) = render_text(prompt, (chosen, rejected), tokenizer)
        return pair_sample(ids, with_chosen, with_rejected, config.sequence_len)

    tokenize.sequences = 2  # type: ignore[attr-defined]
    return tokenize


def type_names() -> dict[str, tuple[str, str]]:
    """Every type this module reads: its name, and its (family, strategy)."""
    names = {f"{family}.{strategy}": (family, strategy) for family in FAMILIES for strategy in STRATEGIES}
    del names["llama3.argilla"]  # Axolotl's Llama 3 family calls it default
    names["llama3.default"] = ("llama3", "argilla")
    return names

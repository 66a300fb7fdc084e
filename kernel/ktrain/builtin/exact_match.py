"""``exact_match_eval``: held-out chat rows answered greedily before and after training, scored exactly.

The answer must equal the last assistant message of the row after stripping whitespace. Activated by
the kernel's entry module when the key is set; every rank generates (sharded forwards are collective),
rank 0 logs ``exact_match`` to metrics.jsonl and prints the score.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ktrain import hookimpl


def load_questions(path: str, limit: int) -> list[tuple[str, str]]:
    """(user message, expected answer) pairs from a chat jsonl file; ValueError names the bad line."""
    pairs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
            user = next(m["content"] for m in messages if m["role"] == "user")
            answer = [m["content"] for m in messages if m["role"] == "assistant"][-1]
        except (ValueError, KeyError, TypeError, IndexError, StopIteration):
            raise ValueError(
                f'line {number} is not a chat row with a user and an assistant message ({{"messages": [...]}})'
            ) from None
        pairs.append((user, answer.strip()))
        if len(pairs) == limit:
            break
    return pairs


class ExactMatch:
    """Scores the model before a fresh run's first step and at train end."""

    def __init__(self, config: Any):
        self.config = config
        self.questions: list[tuple[str, str]] = []

    @hookimpl
    def ktrain_validate_config(self, config: Any, report: Any) -> None:
        try:
            self.questions = load_questions(config.exact_match_eval, config.exact_match_samples)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            report.error("exact_match_eval", f"{config.exact_match_eval}: {e}")

    def score(self, run: Any, engine: Any, when: str) -> float:
        from ktrain.commands.generate import greedy_answers

        answers = greedy_answers(engine.model, run.tokenizer, [q for q, _ in self.questions], max_new_tokens=16)
        right = sum(a == expected for a, (_, expected) in zip(answers, self.questions, strict=True))
        accuracy = right / max(len(self.questions), 1)
        if run.is_main:
            print(f"exact-match accuracy {when}: {accuracy:.1%} ({right}/{len(self.questions)})", flush=True)
            run.log.write(run.step, {"exact_match": accuracy})
        return accuracy

    @hookimpl
    def ktrain_on_train_start(self, run: Any, engine: Any) -> None:
        if run.step == 0:  # a resumed run scored its start when it was fresh; a record now would sit mid-log
            self.score(run, engine, "before training")

    @hookimpl
    def ktrain_on_train_end(self, run: Any, engine: Any, metrics: dict[str, float]) -> None:
        metrics["exact_match"] = self.score(run, engine, "after training")

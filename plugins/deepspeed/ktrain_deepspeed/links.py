"""The DeepSpeed settings that mirror ktrain keys: ``"auto"`` is filled from ktrain, a written value must agree.

One table, ``LINKS``, says for every such setting where ktrain's value comes from. ``check`` (before any
rank starts) reports a written value that contradicts the config and an ``"auto"`` that ktrain cannot
fill; ``fill`` (on every rank) replaces each ``"auto"``, and fills the settings the JSON leaves out
where DeepSpeed's default would silently differ from the config (batch, accumulation, clipping,
precision, and the parameters of an optimizer or scheduler section). The bucket sizes follow the
model's hidden size as in Hugging Face's integration: ``reduce_bucket_size`` hidden², the ZeRO-3
prefetch bucket 0.9·hidden², the persistence threshold 10·hidden.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import attrs

AUTO = "auto"
HIDDEN_SIZE = "the model's hidden size"
UNKNOWN = object()
"""A ktrain value that depends on facts not known yet (the number of ranks, the model's hidden size)."""


@attrs.frozen
class Facts:
    """What ktrain knows when it checks or fills; None where not known yet."""

    dp_size: int | None = None
    hidden_size: int | None = None
    bf16: bool | None = None
    total_steps: int | None = None


@attrs.frozen
class Link:
    """A DeepSpeed setting at ``path`` (dotted) and how ktrain computes it.

    ``source`` names the ktrain keys it comes from, for messages; ``must_agree`` says a value written in
    the JSON is an error when it differs from ktrain's (False: ktrain only fills ``"auto"``).
    ``when_absent`` says what ktrain does when the JSON leaves it out: ``"fill"`` it, fill it only when
    its top-level section is there (``"in_section"``), or ``"leave"`` DeepSpeed's default.
    """

    path: str
    source: str
    value: Callable[[Any, Facts], Any]
    must_agree: bool = True
    when_absent: str = "fill"


def _clipping(config: Any, facts: Facts) -> float:
    return float(config.max_grad_norm)  # 0: no clipping, for both


def _train_batch(config: Any, facts: Facts) -> Any:
    if facts.dp_size is None:
        return UNKNOWN
    return config.micro_batch_size * config.gradient_accumulation_steps * facts.dp_size


def _bf16(config: Any, facts: Facts) -> Any:
    if facts.bf16 is not None:
        return facts.bf16
    return config.bf16 if isinstance(config.bf16, bool) else UNKNOWN


def _warmup(config: Any, facts: Facts) -> Any:
    if config.warmup_steps is not None:
        return config.warmup_steps
    if not config.warmup_ratio:
        return 0
    return UNKNOWN if facts.total_steps is None else math.ceil(config.warmup_ratio * facts.total_steps)


def _total(config: Any, facts: Facts) -> Any:
    return facts.total_steps if facts.total_steps is not None else (config.max_steps or UNKNOWN)


def _hidden(scale: float) -> Callable[[Any, Facts], Any]:
    def value(config: Any, facts: Facts) -> Any:
        return UNKNOWN if facts.hidden_size is None else int(scale * facts.hidden_size)

    return value


def _hidden_squared(scale: float) -> Callable[[Any, Facts], Any]:
    def value(config: Any, facts: Facts) -> Any:
        return UNKNOWN if facts.hidden_size is None else int(scale * facts.hidden_size * facts.hidden_size)

    return value


LINKS = (
    Link("train_micro_batch_size_per_gpu", "micro_batch_size", lambda c, f: c.micro_batch_size),
    Link("gradient_accumulation_steps", "gradient_accumulation_steps", lambda c, f: c.gradient_accumulation_steps),
    Link("gradient_clipping", "max_grad_norm (0: no clipping)", _clipping),
    Link("train_batch_size", "micro_batch_size x gradient_accumulation_steps x data-parallel ranks", _train_batch),
    Link("bf16.enabled", "bf16", _bf16),
    Link("fp16.enabled", "fp16", lambda c, f: c.fp16),
    Link("optimizer.params.lr", "learning_rate", lambda c, f: c.learning_rate, when_absent="in_section"),
    Link(
        "optimizer.params.betas",
        "[adam_beta1, adam_beta2]",
        lambda c, f: [c.adam_beta1, c.adam_beta2],
        when_absent="in_section",
    ),
    Link("optimizer.params.eps", "adam_epsilon", lambda c, f: c.adam_epsilon, when_absent="in_section"),
    Link("optimizer.params.weight_decay", "weight_decay", lambda c, f: c.weight_decay, when_absent="in_section"),
    Link("scheduler.params.warmup_max_lr", "learning_rate", lambda c, f: c.learning_rate, when_absent="in_section"),
    Link("scheduler.params.warmup_min_lr", "0", lambda c, f: 0.0, must_agree=False, when_absent="leave"),
    Link(
        "scheduler.params.warmup_num_steps",
        "warmup_steps (or warmup_ratio of the steps)",
        _warmup,
        when_absent="in_section",
    ),
    Link("scheduler.params.total_num_steps", "max_steps", _total, when_absent="in_section"),
    *(
        Link(f"zero_optimization.{name}", HIDDEN_SIZE, value, must_agree=False, when_absent="leave")
        for name, value in (
            ("reduce_bucket_size", _hidden_squared(1.0)),
            ("stage3_prefetch_bucket_size", _hidden_squared(0.9)),
            ("prefetch_bucket_size", _hidden_squared(0.9)),
            ("stage3_param_persistence_threshold", _hidden(10)),
            ("param_persistence_threshold", _hidden(10)),
        )
    ),
)
BY_PATH = {link.path: link for link in LINKS}


def get(settings: dict[str, Any], path: str) -> Any:
    """The value at a dotted ``path``, or None where a part is missing."""
    node: Any = settings
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set(settings: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path``, creating missing sections; a part that is not a section is left for DeepSpeed to reject."""
    *parents, last = path.split(".")
    node = settings
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return
    node[last] = value


def autos(settings: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of every ``"auto"`` value in ``settings``."""
    if isinstance(settings, dict):
        for name, value in settings.items():
            yield from autos(value, f"{prefix}{name}.")
    elif settings == AUTO:
        yield prefix[:-1]


def _same(written: Any, ours: Any) -> bool:
    if isinstance(ours, bool) or isinstance(written, bool):
        return written is ours
    if isinstance(ours, list):
        return isinstance(written, list) and len(written) == len(ours) and all(map(_same, written, ours))
    if isinstance(written, (int, float)) and isinstance(ours, (int, float)):
        return math.isclose(written, ours, rel_tol=1e-9, abs_tol=0.0)
    return written == ours


def _where(config: Any, source: str) -> str:
    keys = [name for name in re.findall(r"[a-z][a-z0-9_]+", source) if hasattr(config, name)]
    if any(config.is_set(name) for name in keys):
        return " in the config"
    return " by default" if keys else ""


def check(settings: dict[str, Any], config: Any, facts: Facts, origin: str) -> list[tuple[str, str]]:
    """Problems ``(json path, message)``: contradictions with ktrain keys, ``"auto"`` ktrain cannot fill."""
    problems = []
    for path in autos(settings):
        link = BY_PATH.get(path)
        if link is None:
            fillable = ", ".join(sorted(BY_PATH))
            problems.append(
                (path, f'is "auto" in {origin}, but ktrain fills "auto" only in: {fillable}; write a value')
            )
        elif link.path == "scheduler.params.total_num_steps" and link.value(config, facts) is UNKNOWN:
            problems.append(
                (path, f'is "auto" in {origin}; ktrain knows the number of steps before the run only from max_steps: '
                 "set max_steps, write a number, or drop the JSON scheduler to use lr_scheduler")
            )  # fmt: skip
    for link in LINKS:
        written = get(settings, link.path)
        if not link.must_agree or written is None or written == AUTO:
            continue
        ours = link.value(config, facts)
        if ours is UNKNOWN or _same(written, ours):
            continue
        problems.append(
            (link.path, f"is {json.dumps(written)} in {origin}, but {link.source} is {json.dumps(ours)}"
             f"{_where(config, link.source)}; "
             f'write "auto" in the JSON (ktrain fills it) or make the two agree')
        )  # fmt: skip
    return problems


def fill(settings: dict[str, Any], config: Any, facts: Facts, *, drop_unknown: bool = False) -> dict[str, Any]:
    """A copy of ``settings`` with every ``"auto"`` replaced by ktrain's value, and absent settings filled.

    An ``"auto"`` ktrain has no value for is a ValueError naming it, or with ``drop_unknown`` is left out.
    """
    out = copy.deepcopy(settings)
    for path in autos(settings):
        link = BY_PATH.get(path)
        value = UNKNOWN if link is None else link.value(config, facts)
        if value is not UNKNOWN:
            _set(out, path, value)
        elif drop_unknown:
            parent, _, last = path.rpartition(".")
            del (get(out, parent) if parent else out)[last]
        else:
            raise ValueError(f'deepspeed: {path} is "auto" and ktrain has no value for it here; write a number')
    for link in LINKS:
        absent = get(settings, link.path) is None
        section = link.path.split(".")[0] in settings
        if absent and (link.when_absent == "fill" or (link.when_absent == "in_section" and section)):
            value = link.value(config, facts)
            if value is not UNKNOWN:
                _set(out, link.path, value)
    return out

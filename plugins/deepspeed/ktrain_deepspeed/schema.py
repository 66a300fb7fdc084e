"""DeepSpeed's own check of a JSON object, run before any rank starts, with every problem named by its key.

DeepSpeed's parser (``DeepSpeedConfig``) rejects unknown keys inside its sections with pydantic's
message, but silently ignores an unknown top-level key (``"gradient_acumulation_steps"``). To name
those too, the object is parsed through a dict that records every top-level key DeepSpeed looks up:
a key it never looked at is one this DeepSpeed version does not read.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
from collections.abc import Iterator
from typing import Any

from ktrain_deepspeed import links, zero
from ktrain_deepspeed.accelerator import load_deepspeed


class _Recording(dict):
    """A dict that notes the keys looked up in it (shared with its copies: DeepSpeed copies it once)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.seen: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.seen.add(key)
        return super().__contains__(key)

    def keys(self) -> Any:
        return _RecordingKeys(self)


class _RecordingKeys(list):
    def __init__(self, owner: _Recording):
        super().__init__(dict.keys(owner))
        self.owner = owner

    def __contains__(self, key: Any) -> bool:
        self.owner.seen.add(key)
        return list.__contains__(self, key)


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _owner(settings: dict[str, Any], loc: tuple[Any, ...]) -> str | None:
    """The top-level section holding the key a pydantic error points at (its ``loc`` starts inside it)."""
    owners = [name for name, value in settings.items() if isinstance(value, dict) and str(loc[0]) in value]
    return owners[0] if len(owners) == 1 else None


def probe(settings: dict[str, Any], config: Any) -> dict[str, Any]:
    """``settings`` as one rank would parse them, with stand-ins for what only ranks know.

    An ``"auto"`` ktrain cannot fill is left out (``links.check`` reports it).
    """
    facts = links.Facts(dp_size=1, hidden_size=64, bf16=config.bf16 is True, total_steps=config.max_steps or 1)
    data = links.fill(zero.for_deepspeed(settings), config, facts, drop_unknown=True)
    data.pop("train_batch_size", None)  # checked on the ranks, which know how many there are
    return data


def problems(settings: dict[str, Any], config: Any) -> list[tuple[str, str]]:
    """``(json path, message)`` for what DeepSpeed itself rejects or would ignore in ``settings``."""
    data = probe(settings, config)
    deepspeed = load_deepspeed()
    import pydantic
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError
    from deepspeed.utils import logger

    version = f"DeepSpeed {deepspeed.__version__}"
    out: list[tuple[str, str]] = []
    while True:  # a section DeepSpeed rejects is reported and left out, so the rest is still checked
        recording = _Recording(data)
        try:
            with _quiet(logger):
                DeepSpeedConfig(recording)
            break
        except pydantic.ValidationError as e:
            rejected = set()
            for err in e.errors():
                owner = _owner(data, err["loc"])
                inner = ".".join(str(part) for part in err["loc"])
                path = f"{owner}.{inner}" if owner else f"{inner} (in DeepSpeed's {e.title})"
                out.append((path, f"{err['msg']} ({version})"))
                rejected.add(owner)
            if None in rejected:
                return out
            data = {name: value for name, value in data.items() if name not in rejected}
        except (DeepSpeedConfigError, AssertionError, ValueError, TypeError, KeyError) as e:
            return [*out, ("", f"{version} rejects it: {type(e).__name__}: {e}")]
    if "zero_optimization" in data and "zero_optimization" not in recording.seen:
        return out  # this DeepSpeed reads its dict some other way: nothing can be said about unread keys
    for name in data:
        if name in recording.seen:
            continue
        close = difflib.get_close_matches(name, sorted(k for k in recording.seen if isinstance(k, str)), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        out.append((name, f"{version} does not read this key, so it would be ignored; {hint}fix or remove it"))
    return out

"""The hook recorder: an entry module that writes down the hook calls of a run, rank by rank.

The ``ktrain_recorder`` fixture installs it as a plugin of the test's ``ktrain`` processes and sets
``KTRAIN_RECORD_HOOKS`` to a folder; each rank then appends one JSON line per hook call to
``hooks-rank-R.jsonl`` there: the hook, the rank, the step and a few facts (the types of the model
and engine, the metric names, the checkpoint folder). It answers only hooks that need no role and
returns None from each, so it changes nothing in the run it watches.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ktrain import hookimpl

ENV = "KTRAIN_RECORD_HOOKS"


def _type(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class Recorder:
    """The runtime object: one line per hook call in ``folder/hooks-rank-R.jsonl``."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _write(self, hook: str, run: Any, **facts: Any) -> None:
        record = {"hook": hook, "rank": run.rank, "step": run.step, **facts}
        with open(self.folder / f"hooks-rank-{run.rank}.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    @hookimpl
    def ktrain_collect_model_kwargs(self, run: Any) -> None:
        self._write("ktrain_collect_model_kwargs", run)

    @hookimpl
    def ktrain_wrap_model(self, model: Any, run: Any) -> None:
        self._write("ktrain_wrap_model", run, model=_type(model))

    @hookimpl
    def ktrain_parallelize(self, model: Any, run: Any) -> None:
        self._write("ktrain_parallelize", run, model=_type(model))

    @hookimpl
    def ktrain_wrap_train_step(self, step: Any, run: Any) -> None:
        self._write("ktrain_wrap_train_step", run)

    @hookimpl
    def ktrain_collect_metrics(self, run: Any, step: int) -> None:
        self._write("ktrain_collect_metrics", run)

    @hookimpl
    def ktrain_collect_checkpoint_state(self, run: Any) -> None:
        self._write("ktrain_collect_checkpoint_state", run)

    @hookimpl
    def ktrain_on_train_start(self, run: Any, engine: Any) -> None:
        owns = [f for f in ("backward", "accumulation", "clipping", "scheduler") if getattr(engine, f"owns_{f}", False)]
        self._write("ktrain_on_train_start", run, engine=_type(engine), module=_type(engine.module), owns=owns)

    @hookimpl
    def ktrain_on_step_end(self, run: Any, step: int, metrics: dict[str, float]) -> None:
        self._write("ktrain_on_step_end", run, metrics=sorted(metrics))

    @hookimpl
    def ktrain_on_eval_end(self, run: Any, step: int, metrics: dict[str, float]) -> None:
        self._write("ktrain_on_eval_end", run, metrics=sorted(metrics))

    @hookimpl
    def ktrain_on_checkpoint_saved(self, run: Any, step: int, path: Path) -> None:
        self._write("ktrain_on_checkpoint_saved", run, path=Path(path).name)

    @hookimpl
    def ktrain_on_exception(self, run: Any, error: BaseException) -> None:
        self._write("ktrain_on_exception", run, error=f"{type(error).__name__}: {error}")

    @hookimpl
    def ktrain_on_train_end(self, run: Any, engine: Any, metrics: dict[str, float]) -> None:
        self._write("ktrain_on_train_end", run, metrics=sorted(metrics))


@hookimpl
def ktrain_activate(config: Any, activate: Any) -> None:
    """Record the run's hook calls when ``KTRAIN_RECORD_HOOKS`` names a folder."""
    folder = os.environ.get(ENV)
    if folder:
        activate(Recorder(Path(folder)))


class HookRecorder:
    """What the recorded runs of a test called: ``calls()`` reads the lines the ranks wrote."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def calls(self, hook: str | None = None, rank: int = 0) -> list[dict[str, Any]]:
        """The calls of ``rank`` in order (of ``hook`` only, when given), each a dict with ``hook`` and ``step``."""
        path = self.folder / f"hooks-rank-{rank}.jsonl"
        if not path.exists():
            return []
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        return [r for r in records if hook is None or r["hook"] == hook]

    def names(self, rank: int = 0) -> list[str]:
        """The hooks ``rank`` called, in order, one entry per call."""
        return [r["hook"] for r in self.calls(rank=rank)]

    def clear(self) -> None:
        """Forget the calls recorded so far (before the next run of the test)."""
        for path in self.folder.glob("hooks-rank-*.jsonl"):
            path.unlink()

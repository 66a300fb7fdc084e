"""ktrain-plugin-wandb: real 2-rank runs tracked by W&B offline, read back from the run files W&B wrote.

W&B writes an offline run as a ``.wandb`` file: a log of protobuf records (wandb's own ``Record`` message)
in 32 KiB blocks, each chunk with a 7-byte header (checksum, length, type: whole, first, middle, last).
``wandb_records`` reads it back with wandb's message classes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from wandb.proto import wandb_internal_pb2

from ktrain.testing import KtrainProject, dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records

pytest_plugins = ["ktrain.testing"]

BLOCK = 32 * 1024
TIMINGS = ("tokens_per_s", "peak_mem_gib")  # measured again when a step runs again after a resume
KEYS = {"wandb_project": "ktrain-tests", "wandb_mode": "offline"}


def wandb_records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    """The records of one ``.wandb`` file, in order."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # the zero padding at the end of a block
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def item_name(item: object) -> str:
    return item.key or "/".join(item.nested_key)


class Tracked:
    """What the offline W&B runs under ``wandb_dir`` hold, file by file (oldest first)."""

    def __init__(self, wandb_dir: Path):
        self.files = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime)
        self.run_ids: list[str] = []
        self.configs: list[dict[str, object]] = []
        self.history: dict[str, list[tuple[int, float]]] = {}
        for path in self.files:
            for record in wandb_records(path):
                kind = record.WhichOneof("record_type")
                if kind == "run":
                    self.run_ids.append(record.run.run_id)
                    update = {item_name(i): json.loads(i.value_json) for i in record.run.config.update}
                    self.configs.append({k: v for k, v in update.items() if k != "_wandb"})
                elif kind == "history":
                    items = {item_name(i): json.loads(i.value_json) for i in record.history.item}
                    step = items.pop("_step")
                    for name, value in items.items():
                        if not name.startswith("_"):
                            self.history.setdefault(name, []).append((step, value))

    def steps(self, name: str) -> list[int]:
        return [step for step, _ in self.history[name]]

    def values(self, name: str) -> dict[int, float]:
        return dict(self.history[name])


def assert_tracked_as_logged(tracked: Tracked, run_dir: Path) -> None:
    """Every metric of metrics.jsonl at the same steps, each step once; the values too, but for timings."""
    logged_names = {k for line in (run_dir / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    assert set(tracked.history) == logged_names - {"step"}
    for name in tracked.history:
        logged = records(run_dir, name)
        steps = tracked.steps(name)
        assert len(steps) == len(set(steps)), f"{name}: a step logged twice: {steps}"
        assert sorted(steps) == sorted(logged), name
        if name not in TIMINGS:
            assert tracked.values(name) == logged, name


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wandb")
    model_dir(root)
    dataset(root, 96)
    return root


def run_env(root: Path) -> dict[str, str]:
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(root / "wb"), "WANDB_SILENT": "true"}


@pytest.fixture(scope="module")
def resumed(root: Path) -> Path:
    """2 ranks, 6 steps, checkpoints every 2, eval every 2; rank 0 fails in step 4 (step 3 logged after the
    checkpoint of step 2), and the resume runs steps 3 to 6 again."""
    config = write_config(root, **KEYS, max_steps=6, save_steps=2, val_set_size=16, eval_steps=2)
    killed = ktrain(
        "run", str(config), "--nproc-per-node", "2", env={**run_env(root), "KTRAIN_FAULT": "forward:4:0:raise"}
    )
    assert killed.returncode != 0, killed.stdout[-2000:]
    assert max(records(root / "out")) == 3
    done = ktrain("run", str(config), "--nproc-per-node", "2", "--resume", env=run_env(root))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return root / "out"


def test_a_killed_and_resumed_run_is_one_wandb_run_with_each_step_once(resumed: Path, root: Path) -> None:
    tracked = Tracked(root / "wb")
    assert len(tracked.files) == 2  # the first process and the resume, each its own offline file
    assert (
        len(set(tracked.run_ids)) == 1
        and tracked.run_ids[0] == json.loads((resumed / "tracking/wandb.json").read_text())["run_id"]
    )
    assert_tracked_as_logged(tracked, resumed)
    assert sorted(tracked.steps("loss")) == [1, 2, 3, 4, 5, 6] and sorted(tracked.steps("eval_loss")) == [2, 4, 6]


def test_the_resolved_config_is_logged_once(resumed: Path, root: Path) -> None:
    tracked = Tracked(root / "wb")
    first, again = tracked.configs
    assert first["learning_rate"] == 3.0e-3 and first["max_steps"] == 6 and first["wandb_project"] == "ktrain-tests"
    assert first["optimizer"] == "adamw_torch"  # a default: the resolved config, not only the written keys
    assert again == {}


@pytest.mark.parametrize(
    "keys",
    [
        {"wandb_project": None},
        {"wandb_project": "x", "wandb_mode": "disabled"},
        {"wandb_project": "x", "use_wandb": False},
    ],
)
def test_no_wandb_run_without_a_project(ktrain_project: KtrainProject, keys: dict) -> None:
    plan = ktrain_project.plan(**keys)
    assert not any(act.plugin.name == "wandb" for act in plan.plugins.activations)


def test_a_project_activates_the_tracker(ktrain_project: KtrainProject) -> None:
    plan = ktrain_project.plan(wandb_project="x", wandb_watch="gradients")
    (act,) = [act for act in plan.plugins.activations if act.plugin.name == "wandb"]
    assert act.keys == ("wandb_project", "wandb_watch")

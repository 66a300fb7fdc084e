"""Early stopping on the eval loss (Axolotl's early_stopping_patience): the run stops once the eval loss has not
improved for the patience, the final model is the best checkpoint's, rotation keeps that checkpoint, and a
resumed run counts on from its checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from ktrain.run.directory import prepare_run_dir
from ktrain.run.trainer import rank_main
from ktrain.testing import dataset, model_dir, read_metrics, write_config

PATIENCE = 2
# A learning rate high enough that the eval loss of this tiny model rises again within a few steps.
KEYS = {
    "learning_rate": 0.03,
    "micro_batch_size": 2,
    "max_steps": 12,
    "val_set_size": 8,
    "eval_steps": 1,
    "save_steps": 1,
    "save_total_limit": 2,
    "early_stopping_patience": PATIENCE,
}


def _train(config: Path, resume: bool) -> None:
    run_dir, lock = prepare_run_dir(prepare(config), resume=resume, overwrite=False)
    lock.close()
    rank_main(run_dir, resume=resume)


def _expected_stop(eval_losses: dict[int, float]) -> tuple[int, int]:
    """(the step the run stops at, the step of the lowest eval loss before it) by the rule, from the curve."""
    best, since = (0, float("inf")), 0
    for step in sorted(eval_losses):
        if eval_losses[step] < best[1]:
            best, since = (step, eval_losses[step]), 0
        else:
            since += 1
        if since >= PATIENCE:
            return step, best[0]
    raise AssertionError(f"the eval loss never stopped improving: {eval_losses}")


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("early")
    model_dir(root)
    dataset(root, 48)
    _train(write_config(root, **KEYS), resume=False)
    return root


def test_the_run_stops_after_patience_evaluations_and_exports_the_best_checkpoint(stopped: Path) -> None:
    out = stopped / "out"
    evals = read_metrics(out, "eval_loss")
    stop, best = _expected_stop(evals)
    assert max(evals) == max(read_metrics(out)) == stop < KEYS["max_steps"], evals
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == [f"step-{s:08d}" for s in sorted({best, stop - 1, stop})], kept  # the best outlives rotation
    final = load_file(out / "final" / "model.safetensors")
    saved = load_file(out / "checkpoints" / f"step-{best:08d}" / "model.safetensors")
    assert final.keys() == saved.keys() and all(final[k].equal(saved[k]) for k in final)
    record = json.loads((out / "checkpoints" / f"step-{stop:08d}" / "manifest.json").read_text())
    assert record["trainer"]["early_stop"]["best_checkpoint"][0] == best


def test_a_resumed_run_counts_on_and_stops_at_the_same_step_with_the_same_model(stopped: Path) -> None:
    """Resumed from the step before the stop (one evaluation without improvement counted), the run stops one
    evaluation later, as the run that went through did, and exports the same best checkpoint."""
    root = stopped / "resumed"
    shutil.copytree(stopped / "out", root / "out")
    stop = max(read_metrics(root / "out"))
    shutil.rmtree(root / "out" / "checkpoints" / f"step-{stop:08d}")
    shutil.rmtree(root / "out" / "final")
    lines = (root / "out" / "metrics.jsonl").read_text().splitlines()
    (root / "out" / "metrics.jsonl").write_text("".join(f"{x}\n" for x in lines if json.loads(x)["step"] < stop))
    config = yaml.safe_load((stopped / "run.yaml").read_text())
    (root / "run.yaml").write_text(yaml.safe_dump({**config, "output_dir": str(root / "out")}))
    _train(root / "run.yaml", resume=True)
    assert read_metrics(root / "out", "eval_loss") == read_metrics(stopped / "out", "eval_loss")
    final = load_file(root / "out" / "final" / "model.safetensors")
    first = load_file(stopped / "out" / "final" / "model.safetensors")
    assert all(final[k].equal(first[k]) for k in first)


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ({"val_set_size": 0}, "needs evaluations"),
        ({"save_steps": None}, "set save_steps or saves_per_epoch"),
        ({"save_steps": 3, "eval_steps": 2}, "save_steps (3) must be a multiple of eval_steps (2)"),
    ],
)
def test_patience_without_evaluations_or_saves_is_one_clear_error(tmp_path: Path, keys: dict, said: str) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 8)
    with pytest.raises(ConfigError) as caught:
        prepare(write_config(tmp_path, **{**KEYS, **keys}))
    assert [str(e).split(":")[0] for e in caught.value.report.errors] == ["early_stopping_patience"]
    assert said in str(caught.value.report.errors[0])


def test_load_best_model_at_end_without_an_evaluation_split_has_no_effect(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 8)
    keys = {**KEYS, "early_stopping_patience": None, "load_best_model_at_end": True, "val_set_size": 0}
    plan = prepare(write_config(tmp_path, **keys))
    assert any("load_best_model_at_end: no effect" in str(note) for note in plan.warnings)

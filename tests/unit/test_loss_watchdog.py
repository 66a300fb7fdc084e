"""The loss watchdog: Axolotl's loss_watchdog_threshold and loss_watchdog_patience, checked on the logged loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ktrain.config.plan import prepare
from ktrain.run.nonfinite import LossTooHigh, LossWatchdog
from ktrain.testing import dataset, model_dir


def test_the_run_stops_after_patience_logged_losses_in_a_row_above_the_threshold() -> None:
    watchdog = LossWatchdog(threshold=5.0, patience=3)
    for step, loss in enumerate([6.0, 7.0, 4.0, 6.0, 5.0, 6.0, 6.5], start=1):  # a loss at or below resets
        watchdog.observe(step, loss)
    with pytest.raises(LossTooHigh, match=r"loss 8 at step 8, above loss_watchdog_threshold \(5\) on 3 logged"):
        watchdog.observe(8, 8.0)
    off = LossWatchdog(threshold=None, patience=1)
    off.observe(1, float("inf"))


def test_axolotl_watchdog_keys_and_evals_per_epoch_zero_are_taken(tmp_path: Path) -> None:
    config = {
        "base_model": str(model_dir(tmp_path)),
        "random_init_weights": True,
        "datasets": [{"path": str(dataset(tmp_path, 8)), "type": "chat_template"}],
        "output_dir": str(tmp_path / "out"),
        "loss_watchdog_threshold": 5.0,
        "loss_watchdog_patience": 3,
        "evals_per_epoch": 0,
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    plan = prepare(tmp_path / "c.yaml", world_size=1)
    assert (plan.config.loss_watchdog_threshold, plan.config.loss_watchdog_patience) == (5.0, 3)
    assert any("evals_per_epoch" in str(note) for note in plan.warnings)

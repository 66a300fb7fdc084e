"""The memory model's activations for ``gradient_checkpointing_fraction``: ``ktrain plan --measure`` on the CPU
(fp32, a small Llama of 4 blocks) with every block recomputed and with half of them; the activations saved in
the first micro-batch's forward are within 5% of the prediction with half the blocks, and what the other half
keeps (measured with 0.5 less measured with 1.0) is within 5% of the predicted difference.
"""

from __future__ import annotations

import re
from pathlib import Path

from ktrain.cli import main
from ktrain.testing import write_chat_dataset, write_model_dir

TOLERANCE = 0.05
ROW = re.compile(r"^  activations \(saved\)\s+([0-9.]+) (\S+)\s+([0-9.]+) (\S+)\s+\S+$", re.MULTILINE)
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _saved(config: Path, fraction: float, capsys) -> tuple[float, float]:
    """(predicted, measured) bytes of the activations saved, with ``fraction`` of the blocks recomputed."""
    assert main(["plan", str(config), "--measure", "--set", f"gradient_checkpointing_fraction={fraction}"]) == 0
    printed = capsys.readouterr().out
    found = ROW.search(printed)
    assert found, printed
    predicted, unit, measured, measured_unit = found.groups()
    return float(predicted) * UNITS[unit], float(measured) * UNITS[measured_unit]


def test_the_blocks_kept_hold_what_the_memory_model_predicts(tmp_path: Path, capsys) -> None:
    model = write_model_dir(tmp_path / "model", num_hidden_layers=4)
    data = write_chat_dataset(tmp_path / "d.jsonl", 16)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"base_model: {model}\nrandom_init_weights: true\ndatasets: [{{path: {data}, type: chat_template}}]\n"
        f"output_dir: {tmp_path / 'out'}\nmicro_batch_size: 4\nsequence_len: 64\npad_to_sequence_len: true\n"
        "gradient_checkpointing: true\n",
        encoding="utf-8",
    )
    every_predicted, every_measured = _saved(config, 1.0, capsys)
    half_predicted, half_measured = _saved(config, 0.5, capsys)
    assert abs(half_measured / half_predicted - 1) < TOLERANCE
    kept_predicted, kept_measured = half_predicted - every_predicted, half_measured - every_measured
    assert kept_predicted > 0 and abs(kept_measured / kept_predicted - 1) < TOLERANCE, (kept_measured, kept_predicted)

"""On a GPU with float8 tensor cores: the 1.5B Llama shape trains in fp8 as in bf16 (skipped elsewhere).

The runs train configs/bench/llama_1p5b's shape from the same random weights on the same rows (the quick
start's arithmetic chat, packed into rows of 4096 tokens, its tokenizer), as configs/bench/llama_1p5b_fp8_master.yaml
does: bf16 weights, fp32 masters and Adam states in ``adamw_fp32_master``, compiled blocks, the fused loss.
Only the matrix multiplies differ. Over 200 steps the losses fall from about 12.5 to about 1.3.
Measured on an H200 (2026-12-04, docs/results/h200-2026-12-04-fp8/fp8_curves.json): the mean of the last 10
steps' losses was 1.2647 in bf16 and 1.2501 in fp8, fp8 1.15% lower, so the test allows 2% either way; how
far two bf16 runs of these nondeterministic kernels drift apart was not measured. A third run casts with delayed
scaling (``fp8_recipe: delayed``, each layer apart), held to the same 2%: 1.2453, 1.53% lower (an H100, 2026-12-07,
docs/results/h100-2026-12-07-fp8-head/fp8_curves.json, where bf16 gave 1.2647 again). A fourth puts the output
layer's products in float8 too (``fused_linear_cross_entropy_fp8``): 1.2229, 3.31% lower there, outside the 2%,
which is why that key stays off unless written; it is held to 5%, so that a wrong gradient still fails, and so
is the fastest step, which has it too. Over
steps 61-100 both float8 runs were 5-6% below bf16, so how much of either gap is float8 and how much the
trajectories' own spread is not known: the run ``bf16_again`` measures it. ``KTRAIN_FP8_CURVES``
names a JSON file to write the curves to (after each run).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from ktrain.testing import ktrain
from ktrain.testing import read_metrics as records

REPO = Path(__file__).resolve().parents[3]
STEPS = 200
RUNS = {
    "bf16": {"fp8": False},
    "bf16_again": {"fp8": False},
    "fp8": {"fp8": True},
    "fp8_delayed": {"fp8": True, "fp8_recipe": "delayed", "fp8_fused_mlp": False},
    "fp8_delayed_fused": {"fp8": True, "fp8_recipe": "delayed"},
    "fp8_output_layer": {"fp8": True, "fused_linear_cross_entropy_fp8": True},
    "fp8_fast_accumulation": {"fp8": True, "fp8_fast_accumulation": True},
    "fp8_fastest": {
        "fp8": True,
        "fp8_recipe": "delayed",
        "fp8_fast_accumulation": True,
        "fused_linear_cross_entropy_fp8": True,
    },
}
"""The runs compared: bf16; bf16 again (how far two runs of these nondeterministic kernels drift apart); the blocks
in float8; the same with delayed scaling, layer by layer and with the MLPs fused (``fp8_fused_mlp``, delayed's
default); the output layer's products in float8 too (in the fused loss); the
blocks in float8 with the backward's products accumulated the fast way; and the fastest step measured (delayed,
the MLPs fused, fast accumulation, the output layer in float8). ``KTRAIN_FP8_RUNS`` (comma-separated names) runs
bf16 and those only; all eight take about 17 minutes (three took 383 s on an H100)."""
TOLERANCE = {name: 0.02 for name in RUNS} | {"fp8_output_layer": 0.05, "fp8_fastest": 0.05}
"""How far each run's mean loss of the last 10 steps may be from bf16's, relatively."""
ANNOUNCED = {
    "fp8": "linear layers in float8 (tensorwise)",
    "fp8_output_layer": "output layer and loss fused, float8 products",
    "fp8_delayed": "linear layers in float8 (delayed)",
    "fp8_delayed_fused": "SwiGLU MLPs fused",
}


def _capable() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.gpu
@pytest.mark.skipif(not _capable(), reason="needs a GPU of compute capability 8.9 or later")
def test_fp8_loss_curve_follows_bf16_on_the_1p5b_shape(tmp_path: Path) -> None:
    base = yaml.safe_load((REPO / "configs/bench/llama_1p5b_fp8_master.yaml").read_text())
    base.update(
        base_model=str(REPO / "configs/bench/llama_1p5b"),
        tokenizer_config=str(REPO / "configs/quickstart/model"),
        datasets=[{"path": str(REPO / "configs/quickstart/data/train.jsonl"), "type": "chat_template"}],
        sample_packing=True,
        pad_to_sequence_len=True,
        micro_batch_size=2,
        max_steps=STEPS,
        lr_scheduler="cosine",
        warmup_steps=20,
        save_strategy="no",
    )
    chosen = os.environ.get("KTRAIN_FP8_RUNS")
    runs = {n: k for n, k in RUNS.items() if not chosen or n == "bf16" or n in chosen.split(",")}
    curves, outputs = {}, {}
    for name, keys in runs.items():
        config = tmp_path / f"{name}.yaml"
        config.write_text(yaml.safe_dump({**base, **keys, "output_dir": str(tmp_path / name)}))
        done = ktrain("run", str(config), timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        curves[name], outputs[name] = records(tmp_path / name), done.stdout
        if os.environ.get("KTRAIN_FP8_CURVES"):
            Path(os.environ["KTRAIN_FP8_CURVES"]).write_text(json.dumps(curves))
    for name, line in ANNOUNCED.items():
        assert name not in outputs or line in outputs[name], name
    want = curves["bf16"]
    last = sorted(want)[-10:]
    mean_bf16 = sum(want[s] for s in last) / len(last)
    assert want[min(want)] > 5 * mean_bf16  # the task is learnt, so the curves are compared where they move
    for name in sorted(set(runs) - {"bf16"}):
        got = curves[name]
        assert len(want) == len(got) == STEPS
        mean = sum(got[s] for s in last) / len(last)
        first = f"{want[min(want)]:.4f} / {got[min(got)]:.4f}"
        print(
            f"{name} loss curve (bf16 / {name}): first {first}, mean of the last 10 steps {mean_bf16:.4f} / {mean:.4f}"
        )
        assert mean == pytest.approx(mean_bf16, rel=TOLERANCE[name]), name

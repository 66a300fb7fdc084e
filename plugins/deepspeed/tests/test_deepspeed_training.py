"""Training for real on CPU (``DS_ACCELERATOR=cpu``, gloo, 2 ranks) with Axolotl's DeepSpeed JSON files:
ZeRO 1, 2 and 3 against one process, exact resume under ZeRO-3, the export loaded back in ``transformers``.

The runs share one global batch of 8 rows, split differently: one process without DeepSpeed (4 rows x 2
micro-batches) is the reference; ZeRO-1 takes 4 x 1 per rank, ZeRO-2 4 x 1, ZeRO-3 1 x 4 (accumulation
4). The files: zero3.json; zero2.json, which offloads the optimizer, so it steps with DeepSpeed's CPU
Adam; and zero1_torch_compile.json, inline, with its older ``compile`` section pointed at torch.compile's
``eager`` backend (inductor's C++ build of the model takes minutes on a CPU runner). The model starts from
saved weights, so every run starts from the same ones (ZeRO-3 initialises random weights its own way).
ZeRO-2 with this plugin's preset, at 1 and 2 ranks, resumed and exported, is in the conformance suite
(test_deepspeed_conformance.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records
from tests.kit import REPO

COMPAT = REPO / "tests" / "fixtures" / "deepspeed"
STEPS = 4
ZERO1_COMPILE = {**json.loads((COMPAT / "zero1_torch_compile.json").read_text()), "compile": {"backend": "eager"}}
RUNS = {  # name: (deepspeed:, micro_batch_size, gradient_accumulation_steps, ranks)
    "reference": (None, 4, 2, 1),
    "zero1": (ZERO1_COMPILE, 4, 1, 2),
    "zero2": (str(COMPAT / "zero2.json"), 4, 1, 2),
    "zero3": (str(COMPAT / "zero3.json"), 1, 4, 2),
}
RTOL = 1e-5  # fp32: sums in another order, other padding shapes, DeepSpeed's CPU Adam for ZeRO-2


def saved_model(root: Path) -> Path:
    """The tiny model folder of tests.kit with seeded random weights saved in it."""
    path = model_dir(root)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each run of ``RUNS`` for 4 steps (ZeRO-3 saving at steps 2 and 4); name -> run directory."""
    root = tmp_path_factory.mktemp("deepspeed-runs")
    saved_model(root)
    dataset(root, 200)
    out = {}
    for name, (deepspeed, micro, accumulation, ranks) in RUNS.items():
        keys = {"deepspeed": deepspeed} if deepspeed else {}
        if name == "zero3":
            keys["save_steps"] = 2
        config = write_config(
            root,
            f"{name}.yaml",
            random_init_weights=False,
            micro_batch_size=micro,
            gradient_accumulation_steps=accumulation,
            max_steps=STEPS,
            warmup_steps=1,
            val_set_size=16,
            output_dir=str(root / name),
            **keys,
        )
        done = ktrain("run", str(config), "--nproc-per-node", str(ranks))
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        (root / f"{name}.stdout").write_text(done.stdout)
        out[name] = root / name
    return out


@pytest.mark.parametrize("stage", ["zero1", "zero2", "zero3"])
def test_zero_matches_one_process(runs: dict[str, Path], stage: str) -> None:
    """The same global batch gives the same losses, gradient norms and held-out loss (ZeRO-3: 4 micro-batches)."""
    for key in ("loss", "grad_norm", "lr", "eval_loss"):
        want, got = records(runs["reference"], key), records(runs[stage], key)
        assert want.keys() == got.keys() == ({STEPS} if key == "eval_loss" else set(range(1, STEPS + 1)))
        for step in want:
            assert got[step] == pytest.approx(want[step], rel=RTOL), (key, step)
    stdout = runs[stage].with_suffix(".stdout").read_text()
    if stage == "zero1":  # the older compile section was applied, not dropped
        assert "deepspeed: torch.compile(backend='eager')" in stdout
    if stage == "zero3":  # each rank materialised only its partition of the saved weights
        assert "deepspeed: ZeRO-3 built the model inside zero.Init: this rank holds " in stdout


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _logits(folder: Path) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokenizer("What is 2+2?")["input_ids"]])).logits


def test_zero3_resume_is_exact_and_export_loads(runs: dict[str, Path], tmp_path: Path) -> None:
    """Killed after step 3, resumed from step 2: the same losses and final weights, to the bit, as one go;
    ``ktrain export`` of the last checkpoint (fp32 consolidation) gives the final model's weights and logits."""
    run = runs["zero3"]
    one_go = tmp_path / "one_go"
    shutil.copytree(run, one_go)
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    shutil.rmtree(run / "final")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")
    resumed = ktrain("run", str(run / "config.yaml"), "--resume", "--nproc-per-node", "2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    for key in ("loss", "grad_norm", "lr", "eval_loss"):
        assert records(run, key) == records(one_go, key), key
    assert _digest(run / "final" / "model.safetensors") == _digest(one_go / "final" / "model.safetensors")

    exported = ktrain("export", str(run))
    assert exported.returncode == 0, exported.stderr[-3000:]
    final = load_file(run / "final" / "model.safetensors")
    again = load_file(run / "export-step-00000004" / "model.safetensors")
    assert final.keys() == again.keys()
    assert all(torch.equal(final[name], again[name]) for name in final)  # fp32 run: master weights, bit for bit
    assert torch.equal(_logits(run / "final"), _logits(run / "export-step-00000004"))

"""Training for real on CPU: the loss falls, resume is exact, DDP matches one process, faults end runs."""

from __future__ import annotations

import gc
import hashlib
import shutil
import time
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from ktrain.testing import dataset, ktrain, model_dir, read_metrics, write_config


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    model_dir(tmp_path, attention_dropout=0.1)  # dropout: resume must restore the RNG to be exact
    dataset(tmp_path, 400)
    return tmp_path


def test_loss_falls_and_export_loads(root: Path) -> None:
    config = write_config(root, max_steps=25, val_set_size=40, eval_steps=25)
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr
    losses = read_metrics(root / "out")
    assert len(losses) == 25
    first, last = losses[1], sum(losses[s] for s in (23, 24, 25)) / 3
    assert last < 0.6 * first, losses
    assert read_metrics(root / "out", "eval_loss")[25] < first
    model = transformers.AutoModelForCausalLM.from_pretrained(root / "out" / "final")
    tokenizer = transformers.AutoTokenizer.from_pretrained(root / "out" / "final")
    ids = torch.tensor([tokenizer("What is 2+2?")["input_ids"]])
    assert model(input_ids=ids).logits.shape[-1] == model.config.vocab_size
    answer = ktrain("generate", str(root / "out"), "What is 2+2?", "--max-new-tokens", "4")
    assert answer.returncode == 0, answer.stderr


def test_pure_bf16_keeps_weights_and_optimizer_states_in_bf16(root: Path) -> None:
    """``bfloat16: true``: the checkpoint's weights and Adam states and the exported model are bf16, and it learns."""
    config = write_config(root, bfloat16=True, max_steps=20, save_steps=20)
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr
    losses = read_metrics(root / "out")
    assert sum(losses[s] for s in (18, 19, 20)) / 3 < 0.7 * losses[1], losses
    checkpoint = root / "out" / "checkpoints" / "step-00000020"
    assert {t.dtype for t in load_file(checkpoint / "model.safetensors").values()} == {torch.bfloat16}
    states = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"].values()
    assert {s[k].dtype for s in states for k in ("exp_avg", "exp_avg_sq")} == {torch.bfloat16}
    assert {t.dtype for t in load_file(root / "out" / "final" / "model.safetensors").values()} == {torch.bfloat16}


def _killed_after_step_4(root: Path, last_checkpoint: str) -> Path:
    """Keep the finished run as ``one_go``; make ``out/`` look like that run killed after step 4: the last
    checkpoint and the final model gone, the metrics of steps 1-4 only."""
    one_go = root / "one_go"
    shutil.copytree(root / "out", one_go)
    shutil.rmtree(root / "out" / "checkpoints" / last_checkpoint)
    shutil.rmtree(root / "out" / "final")
    lines = (root / "out" / "metrics.jsonl").read_text().splitlines()
    (root / "out" / "metrics.jsonl").write_text("\n".join(lines[:4]) + "\n")
    return one_go


def test_a_run_learns_keeps_fp32_masters_and_resumes_exactly(root: Path) -> None:
    """bf16 weights in the checkpoint and export, fp32 masters and moments in the optimizer state; a run
    resumed from step 4 ends with the same losses and bit-identical weights as one that ran through."""
    config = write_config(root, bfloat16=True, optimizer="adamw_fp32_master", max_steps=8, save_steps=4)
    whole = ktrain("run", str(config))
    assert whole.returncode == 0, whole.stderr
    losses = read_metrics(root / "out")
    assert losses[8] < 0.8 * losses[1], losses
    checkpoint = root / "out" / "checkpoints" / "step-00000004"
    assert {t.dtype for t in load_file(checkpoint / "model.safetensors").values()} == {torch.bfloat16}
    states = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"].values()
    assert {s[k].dtype for s in states for k in ("master", "exp_avg", "exp_avg_sq")} == {torch.float32}
    one_go = _killed_after_step_4(root, last_checkpoint="step-00000008")
    resumed = ktrain("run", str(config), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert read_metrics(root / "out") == read_metrics(one_go)
    final, again = (load_file(d / "final" / "model.safetensors") for d in (root / "out", one_go))
    assert final.keys() == again.keys() and all(torch.equal(final[k], again[k]) for k in final)


def test_resume_is_exact(root: Path) -> None:
    """N steps, a checkpoint, the rest after a resume: the same losses and weights, to the bit, as one go."""
    keys = dict(max_steps=6, save_steps=3, gradient_accumulation_steps=2, warmup_steps=2, lr_scheduler="cosine")
    config = write_config(root, **keys)
    whole = ktrain("run", str(config))
    assert whole.returncode == 0, whole.stderr
    one_go = _killed_after_step_4(root, last_checkpoint="step-00000006")  # step-3 committed, step 4 logged
    resumed = ktrain("run", str(config), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    assert read_metrics(root / "out") == read_metrics(one_go)
    assert _digest(root / "out" / "final" / "model.safetensors") == _digest(one_go / "final" / "model.safetensors")
    exported = ktrain("export", str(root / "out"))  # the last checkpoint, step 6, is the final model
    assert exported.returncode == 0, exported.stderr
    final = load_file(root / "out" / "final" / "model.safetensors")
    again = load_file(root / "out" / "export-step-00000006" / "model.safetensors")
    assert final.keys() == again.keys() and all(torch.equal(final[k], again[k]) for k in final)


def test_sigkill_during_save_keeps_previous_checkpoint(root: Path) -> None:
    config = write_config(root, max_steps=6, save_steps=2)
    killed = ktrain("run", str(config), env={"KTRAIN_FAULT": "save-before-commit:4:0:sigkill"})
    assert killed.returncode == -9
    checkpoints = root / "out" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [".tmp-step-00000004", "step-00000002"]
    resumed = ktrain("run", str(config), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "step-00000002 at step 2" in resumed.stdout
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000002", "step-00000004", "step-00000006"]
    uninterrupted = write_config(root, "clean.yaml", max_steps=6, save_steps=2, output_dir=str(root / "clean"))
    assert ktrain("run", str(uninterrupted)).returncode == 0
    assert read_metrics(root / "out") == read_metrics(root / "clean")


def test_ddp_two_ranks_match_one(root: Path) -> None:
    """Global batch 8 as 1 rank x 2 micro-batches of 4, and as 2 ranks x 1 micro-batch of 4."""
    model_dir(root, attention_dropout=0.0)  # each rank draws its own dropout masks: compare without
    one = write_config(root, "one.yaml", gradient_accumulation_steps=2, output_dir=str(root / "one"))
    two = write_config(root, "two.yaml", gradient_accumulation_steps=1, output_dir=str(root / "two"))
    assert ktrain("run", str(one)).returncode == 0
    done = ktrain("run", str(two), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr
    a, b = read_metrics(root / "one"), read_metrics(root / "two")
    assert a.keys() == b.keys() == set(range(1, 7))
    for step in a:  # fp32; only the order of the gradient sums differs
        assert b[step] == pytest.approx(a[step], rel=1e-5), step


def test_a_rank_that_raises_ends_the_run(root: Path) -> None:
    config = write_config(root, max_steps=50)
    started = time.monotonic()
    done = ktrain("run", str(config), "--nproc-per-node", "2", env={"KTRAIN_FAULT": "forward:2:1:raise"})
    elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert "rank 1 failed" in done.stderr
    assert "injected fault at forward, step 2, rank 1" in done.stderr
    assert elapsed < 90


def test_output_dir_of_an_earlier_run_is_refused(root: Path) -> None:
    config = write_config(root, max_steps=1)
    assert ktrain("run", str(config)).returncode == 0
    before = _digest(root / "out" / "final" / "model.safetensors")
    again = ktrain("run", str(config))
    assert again.returncode == 2
    assert "output_dir" in again.stderr and "--resume" in again.stderr and "Traceback" not in again.stderr
    assert _digest(root / "out" / "final" / "model.safetensors") == before
    assert ktrain("run", str(config), "--overwrite", "--set", "seed=8").returncode == 0
    assert _digest(root / "out" / "final" / "model.safetensors") != before


def test_the_next_steps_batch_is_collated_before_this_steps_update(root: Path) -> None:
    """While the device runs a step's backward, the host collates the next step's first micro-batch (it would
    otherwise do so after queueing the update, the device idle meanwhile); the last step collates nothing. The
    objects alive after the first step are left out of the garbage collector's passes until the run ends."""
    from ktrain import hookimpl
    from ktrain.builtin.causal_lm import CausalLM
    from ktrain.config.plan import prepare
    from ktrain.run.directory import prepare_run_dir
    from ktrain.run.trainer import rank_main

    events: list[str] = []
    frozen: list[int] = []

    class Recorded(CausalLM):
        @hookimpl(tryfirst=True)
        def ktrain_build_objective(self, run, engine):
            return self

        def collate(self, *args, **kwargs):
            events.append("collate")
            return super().collate(*args, **kwargs)

    class Record:
        @hookimpl
        def ktrain_activate(self, config, activate) -> None:
            activate(Recorded(config), roles=("objective",))

        @hookimpl
        def ktrain_on_step_end(self, run, step, metrics) -> None:
            events.append(f"end {step}")
            frozen.append(gc.get_freeze_count())

    config = write_config(root, max_steps=3, gradient_accumulation_steps=2, logging_steps=1)
    run_dir, lock = prepare_run_dir(prepare(config), resume=False, overwrite=False)
    try:
        rank_main(run_dir, resume=False, extra_plugins=(("record", Record()),))
    finally:
        lock.close()
    each = ["collate", "collate"]  # this step's second micro-batch, then the next step's first
    assert events == ["collate", *each, "end 1", *each, "end 2", "collate", "end 3"]
    # what was alive after the first step stayed out of the collector's passes (ktrain.run.host_gc), until the end
    assert min(frozen) > 100_000 and gc.get_freeze_count() == 0, frozen

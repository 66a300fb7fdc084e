"""The kernel's loop against a plain PyTorch loop: same model, data, optimizer and schedule, on CPU.

    python tests/benchmarks/loop_overhead.py [--steps 60] [--rounds 3]

Both run in this process, alternating, round after round; each reports the median time of a step after
10 warm-up steps, and the kernel's overhead is (kernel - plain) / plain of the medians of all rounds.
The plain loop is what a user writes by hand: forward with labels, mean loss / accumulation, backward,
clip, AdamW, LambdaLR.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
import yaml

from ktrain import hookimpl
from ktrain.config.plan import prepare
from ktrain.data.batches import BatchPlan, collate
from ktrain.data.cache import build
from ktrain.run.directory import prepare_run_dir
from ktrain.run.trainer import rank_main

REPO = Path(__file__).resolve().parents[2]
WARMUP = 10


class StepClock:
    """An observer plugin: the time at the end of every step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    @hookimpl
    def ktrain_on_train_start(self, run, engine) -> None:
        self.times = [time.perf_counter()]

    @hookimpl
    def ktrain_on_step_end(self, run, step, metrics) -> None:
        self.times.append(time.perf_counter())


def median_step(times: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(times[WARMUP:], times[WARMUP + 1 :], strict=False))


def kernel_loop(config_path: Path, out: Path) -> float:
    clock = StepClock()
    plan = prepare(config_path, [f"output_dir={out}"], world_size=1, extra_plugins=[("clock", clock)])
    run_dir, lock = prepare_run_dir(plan, resume=False, overwrite=True)
    try:
        rank_main(run_dir, False, extra_plugins=(("clock", clock),))
    finally:
        lock.close()
    return median_step(clock.times)


def plain_loop(config_path: Path) -> float:
    plan = prepare(config_path, world_size=1)
    config = plan.config
    tokenizer = transformers.AutoTokenizer.from_pretrained(config.base_model)
    examples = build(config, tokenizer, plan.formats).train
    torch.manual_seed(config.seed)
    model_config = transformers.AutoConfig.from_pretrained(config.base_model)
    model = transformers.AutoModelForCausalLM.from_config(model_config, attn_implementation="sdpa")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    batches = BatchPlan(len(examples), config.micro_batch_size, config.gradient_accumulation_steps, 1, config.seed)
    times = [time.perf_counter()]
    for step in range(config.max_steps):
        for micro in batches.step_rows(step)[0]:
            batch = collate([[examples[i]] for i in micro], tokenizer.pad_token_id)
            loss = model(**batch).loss / config.gradient_accumulation_steps
            loss.backward()
            float(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter())
    return median_step(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ktrain-bench-"))
    config = {
        "base_model": str(REPO / "configs/quickstart/model"),
        "random_init_weights": True,
        "datasets": [{"path": str(REPO / "configs/quickstart/data/train.jsonl"), "type": "chat_template"}],
        "sequence_len": 64,
        "micro_batch_size": 16,
        "gradient_accumulation_steps": 2,
        "max_steps": args.steps,
        "learning_rate": 1.0e-3,
        "lr_scheduler": "constant",
        "logging_steps": args.steps,
        "save_strategy": "no",
        "seed": 1,
    }
    config_path = work / "bench.yaml"
    config_path.write_text(yaml.safe_dump(config))
    kernel, plain = [], []
    try:
        for r in range(args.rounds):
            plain.append(plain_loop(config_path))
            kernel.append(kernel_loop(config_path, work / "out"))
            print(f"round {r + 1}: plain {plain[-1] * 1e3:.1f} ms/step, ktrain {kernel[-1] * 1e3:.1f} ms/step")
    finally:
        shutil.rmtree(work)
    k, p = statistics.median(kernel), statistics.median(plain)
    print(
        f"median over {args.rounds} rounds: plain {p * 1e3:.1f} ms/step, ktrain {k * 1e3:.1f} ms/step, "
        f"overhead {(k - p) / p:+.1%}"
    )


if __name__ == "__main__":
    main()

"""The peer of ``ktrain bench --peer axolotl``: Axolotl itself, ``python -m axolotl.cli.train`` in a subprocess,
trained on the same YAML before the ktrain side is built.

The config file, with the ``--set`` overrides, is written again for Axolotl (``axolotl.yaml`` in the run
directory), changed only where Axolotl must be told something ktrain does not need, or reads a key
differently; each change is one line of the report (``differences``):

- a key that is ktrain's, not Axolotl's (not in ``ktrain.config.axolotl_keys.TOP_LEVEL``), is left out, but
  ``random_init_weights: true``, which Axolotl writes ``reinit_weights: true``;
- ``adapter: qlora`` without ``load_in_4bit`` gets ``load_in_4bit: true`` (ktrain quantizes a QLoRA base
  without it, Axolotl only with it);
- with synthetic rows (a config without ``datasets``), the rows are written as a pre-tokenized jsonl of random
  tokens, every token trained (``sequence_len`` tokens a row), Axolotl's ``datasets`` naming it; and where the
  model folder has no tokenizer, a word-level tokenizer of the model's vocabulary (the rows are token ids
  already) is written beside it and named by ``tokenizer_config``;
- ``max_steps`` (warm-up + timed steps), ``logging_steps: 1``, ``save_strategy: "no"``, and ``output_dir``
  and ``dataset_prepared_path`` inside the run directory.

Axolotl logs each step's trainable tokens a second (``tokens/train_per_sec_per_gpu``: the tokens since the
last log over the wall time since it) and the GPU's peak allocation (``memory/max_allocated (GiB)``); the
peer's tokens/s is the median over the steps after the warm-up, its peak memory the largest logged.
``AXOLOTL_DO_NOT_TRACK=1`` keeps Axolotl's telemetry off.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs

from ktrain.config.axolotl_keys import TOP_LEVEL
from ktrain.config.load import apply_override
from ktrain.config.yaml_io import dump_yaml, load_yaml

TOKENS_PER_S = "tokens/train_per_sec_per_gpu"
PEAK_GIB = "memory/max_allocated (GiB)"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_STEP_LOG = re.compile(r"\{'loss': [^{}]*\}")


class AxolotlFailed(RuntimeError):
    """``axolotl train`` exited with an error, or logged no step."""


@attrs.frozen
class AxolotlConfig:
    """The YAML Axolotl trains on, and where it differs from the config, one line each."""

    data: dict[str, Any]
    differences: tuple[str, ...]


@attrs.frozen
class AxolotlTiming:
    """What Axolotl's log says of its steps."""

    tokens_per_s: float
    peak_memory_gib: float | None
    first_loss: float
    last_loss: float
    steps: int


def installed() -> bool:
    """Whether Axolotl can be imported here (``python -m axolotl.cli.train`` then runs)."""
    return importlib.util.find_spec("axolotl") is not None


def source_config(path: str, overrides: list[str]) -> dict[str, Any]:
    """The config file as written, with the ``--set`` overrides applied (no defaults, no ktrain-only reading)."""
    data, _ = load_yaml(Path(path))
    for assignment in overrides:
        apply_override(data, assignment)
    return data


def axolotl_config(
    source: dict[str, Any], run_dir: Path, total_steps: int, rows: Path | None, tokenizer: Path | None
) -> AxolotlConfig:
    """Axolotl's YAML for ``source`` (the config as written): ``rows`` (a jsonl) replaces its datasets and
    ``tokenizer`` (a folder) is its tokenizer, when given."""
    data: dict[str, Any] = {}
    differences: list[str] = []
    for key, value in source.items():
        if key == "random_init_weights":
            if value:
                data["reinit_weights"] = True
                differences.append("random_init_weights: true is written reinit_weights: true (Axolotl's name)")
            else:
                differences.append("random_init_weights: false left out (Axolotl loads base_model's weights)")
        elif key not in TOP_LEVEL:
            differences.append(f"{key}: ktrain's key, not Axolotl's: left out")
        else:
            data[key] = value
    if data.get("adapter") == "qlora" and "load_in_4bit" not in data:
        data["load_in_4bit"] = True
        differences.append("load_in_4bit: true added (adapter: qlora; Axolotl quantizes the base only with it)")
    if rows is not None:
        data["datasets"] = [{"path": str(rows), "ds_type": "json"}]
        differences.append("datasets: the same random-token rows, written as a pre-tokenized jsonl")
    if tokenizer is not None:
        data["tokenizer_config"] = str(tokenizer)
        differences.append("tokenizer_config: a word-level tokenizer of the model's vocabulary (no tokenizer there)")
    run = {
        "max_steps": total_steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "output_dir": str(run_dir / "axolotl_out"),
        "dataset_prepared_path": str(run_dir / "axolotl_prepared"),
    }
    data.update(run)
    timing = ", ".join(f"{k}: {v}" for k, v in run.items() if k not in ("output_dir", "dataset_prepared_path"))
    differences.append(f"set for the timing: {timing}; output_dir and dataset_prepared_path in the run directory")
    return AxolotlConfig(data, tuple(differences))


def write_rows(path: Path, train: Any, total_steps: int) -> None:
    """The rows of ``total_steps`` steps of ``train`` (rank 0's), one sample a line, every token labelled."""
    with path.open("w", encoding="utf-8") as f:
        for step in range(total_steps):
            for micro in train.step(step)[0]:
                for row in micro:
                    ids = [int(t) for example in row for t in example.input_ids]
                    f.write(json.dumps({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": ids}) + "\n")


def has_tokenizer(model_dir: str) -> bool:
    """Whether ``model_dir`` is a local folder with a tokenizer, or not a local folder (a hub name)."""
    folder = Path(model_dir)
    return not folder.is_dir() or any((folder / name).exists() for name in TOKENIZER_FILES)


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer of ``vocab_size`` words ``t0``, ``t1``, ...; ``t0`` is its pad, bos, eos and unk
    token, so Axolotl adds no token and the embeddings keep their size."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")))
    tokenizer.pad_token = tokenizer.bos_token = tokenizer.eos_token = tokenizer.unk_token = "t0"
    tokenizer.save_pretrained(folder)


def read_log(text: str, warmup: int) -> AxolotlTiming:
    """The median tokens/s of the steps after ``warmup`` (at least the last step's), the largest peak memory,
    and the first and last losses, from Axolotl's log of one line a step."""
    logs = [ast.literal_eval(match) for match in _STEP_LOG.findall(text)]
    if not logs:
        raise AxolotlFailed("Axolotl's log holds no step (no {'loss': ...} line)")
    rates = [float(log[TOKENS_PER_S]) for log in logs[warmup:] if TOKENS_PER_S in log]
    rates = rates or [float(log[TOKENS_PER_S]) for log in logs[-1:] if TOKENS_PER_S in log]
    if not rates:
        raise AxolotlFailed(f"Axolotl's log has no {TOKENS_PER_S} after the warm-up ({len(logs)} steps logged)")
    peaks = [float(log[PEAK_GIB]) for log in logs if PEAK_GIB in log]
    return AxolotlTiming(
        tokens_per_s=statistics.median(rates),
        peak_memory_gib=max(peaks) if peaks else None,
        first_loss=float(logs[0]["loss"]),
        last_loss=float(logs[-1]["loss"]),
        steps=len(logs),
    )


def run_axolotl(config: AxolotlConfig, run_dir: Path, warmup: int) -> AxolotlTiming:
    """Write ``axolotl.yaml`` into ``run_dir``, train it with Axolotl in a subprocess, read its log there."""
    path = run_dir / "axolotl.yaml"
    path.write_text(dump_yaml(config.data), encoding="utf-8")
    log = run_dir / "axolotl.log"
    env = {**os.environ, "AXOLOTL_DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}
    print(f"peer axolotl: python -m axolotl.cli.train {path} (log: {log})", flush=True)
    with log.open("w", encoding="utf-8") as out:
        code = subprocess.call(
            [sys.executable, "-m", "axolotl.cli.train", str(path)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    text = log.read_text(encoding="utf-8", errors="replace")
    if code != 0:
        lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()] or ["(no output)"]
        print("\n".join(lines[-20:]), file=sys.stderr)  # the end of Axolotl's log: the run directory goes
        raise AxolotlFailed(f"ktrain: --peer axolotl: axolotl train exited with {code}: {lines[-1][:300]}")
    return read_log(text, warmup)


def time_axolotl(
    path: str, overrides: list[str], config: Any, run_dir: Path, warmup: int, steps: int, synthetic: bool
) -> tuple[AxolotlTiming, AxolotlConfig]:
    """Axolotl on the config at ``path`` (``config``: ktrain's reading of it): with ``synthetic`` rows, the ktrain
    side's random tokens written for it; time ``warmup`` + ``steps`` steps."""
    from ktrain.bench.rows import SyntheticRows

    source = source_config(path, overrides)
    total = warmup + steps
    rows = tokenizer = None
    if synthetic:
        import transformers

        model = config.base_model_config or config.base_model
        vocab = transformers.AutoConfig.from_pretrained(model, trust_remote_code=config.trust_remote_code).vocab_size
        rows = run_dir / "axolotl_rows.jsonl"
        write_rows(rows, SyntheticRows(vocab, config), total)
        if not has_tokenizer(config.tokenizer_config or config.base_model):
            tokenizer = run_dir / "axolotl_tokenizer"
            write_tokenizer(tokenizer, vocab)
    written = axolotl_config(source, run_dir, total, rows, tokenizer)
    return run_axolotl(written, run_dir, warmup), written


def side(timing: AxolotlTiming, tokens_per_step: int, flops: float, peak: float | None, cuda: bool) -> dict[str, Any]:
    """The peer's side of the report, from Axolotl's log: no split of the step (Axolotl logs none), the
    FLOPs a token of the ktrain side's model (the same model); no peak memory off a GPU."""
    from importlib.metadata import version

    return {
        "name": f"peer axolotl: Axolotl {version('axolotl')}",
        "padding": 0.0,
        "tokens_per_s": timing.tokens_per_s,
        "mfu": timing.tokens_per_s * flops / peak if peak else None,
        "peak_memory_gib": timing.peak_memory_gib if cuda else None,
        "held_before_gib": None,
        "step_s": tokens_per_step / timing.tokens_per_s,
        "split_s": None,
        "flops_per_token": flops,
        "first_loss": timing.first_loss,
        "last_loss": timing.last_loss,
        "device_state": None,
    }

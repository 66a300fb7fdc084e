"""ktrain's DPO and IPO against TRL's DPOTrainer, ORPO against its ORPOTrainer, SimPO against its CPOTrainer, KTO
against its KTOTrainer: the same tiny model (seeded weights on disk), the same pairs, the same reference (the model
as loaded), the same optimizer and schedule. DPO and IPO read pairs of chat turns, ORPO and SimPO pairs of text
(TRL's trainers of those take text only), KTO unpaired text rows, given to TRL in the order of their token ids
(KTO's KL estimate pairs each prompt with the answer of the row before it in a batch; ktrain orders a micro-batch
by token ids, TRL keeps the dataset's order).

Every step's global batch is the whole dataset, so both trainers see the same pairs at every step whatever
their order. Step 1 (before any update) must agree to 1e-5, the first 10 losses to 1e-3.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from ktrain.testing import ktrain, model_dir, read_metrics, write_config

PAIRS = 8
STEPS = 10
LR = 1e-3


def pair_rows(count: int, chat: bool, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` rows in TRL's forms: ``prompt``, ``chosen`` and ``rejected`` lists of turns (``chat``), or text."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        prompt, chosen, rejected = f"What is {a}+{b}?", str(a + b), str(a + b + rng.randint(1, 9))
        if chat:
            rows.append(
                {
                    "prompt": [{"role": "user", "content": prompt}],
                    "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}],
                }
            )
        else:
            rows.append({"prompt": f"{prompt} ", "chosen": chosen, "rejected": rejected})
    return rows


def unpaired_rows(count: int, model: Path) -> list[dict[str, Any]]:
    """``count`` KTO rows (text ``prompt`` and ``completion``, ``label``) in the order of their token ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = [
        {"prompt": row["prompt"], "completion": row["chosen" if i % 3 else "rejected"], "label": bool(i % 3)}
        for i, row in enumerate(pair_rows(count, chat=False))
    ]
    return sorted(rows, key=lambda r: tokenizer(r["prompt"] + r["completion"] + tokenizer.eos_token)["input_ids"])


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


STEP_ONE = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected")


def trl_history(
    root: Path, model: Path, rows: list[dict[str, Any]], method: str, beta: float
) -> list[dict[str, float]]:
    """TRL's logged records (one a step) of the trainer of ``method`` on the model folder ``model``."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    torch.manual_seed(0)
    config, trainer_class, own = {
        "dpo": (DPOConfig, DPOTrainer, {"loss_type": ["sigmoid"]}),
        "ipo": (DPOConfig, DPOTrainer, {"loss_type": ["ipo"]}),
        "orpo": (ORPOConfig, ORPOTrainer, {}),
        "simpo": (CPOConfig, CPOTrainer, {"loss_type": "simpo", "simpo_gamma": 0.5, "cpo_alpha": 1.0}),
        "kto": (KTOConfig, KTOTrainer, {}),
    }[method]
    args = config(
        output_dir=str(root / f"trl-{method}"),
        per_device_train_batch_size=PAIRS,
        max_steps=STEPS,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        beta=beta,
        max_length=64,
        seed=7,
        dataloader_drop_last=True,
        **own,
    )
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    trainer = trainer_class(
        model=policy,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model),
    )
    trainer.train()
    return [record for record in trainer.state.log_history if "rewards/chosen" in record]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with seeded weights saved, which both trainers load."""
    return model_dir(tmp_path_factory.mktemp("parity-model"), weights=True)


METHODS = [("dpo", 0.1), ("ipo", 0.5), ("orpo", 0.2), ("simpo", 2.0), ("kto", 0.5)]


@pytest.fixture(scope="module", params=METHODS, ids=lambda p: p[0])
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model: Path
) -> tuple[Path, list[dict]]:
    """(ktrain's run directory, TRL's records) for one method."""
    method, beta = request.param
    root = tmp_path_factory.mktemp(f"parity-{method}")
    rows = unpaired_rows(PAIRS, model) if method == "kto" else pair_rows(PAIRS, chat=method in ("dpo", "ipo"))
    write_rows(root / "pairs.jsonl", rows)
    config = write_config(
        root,
        base_model=str(model),
        random_init_weights=False,
        rl=method,
        **({"orpo_alpha": beta} if method == "orpo" else {"rl_beta": beta}),
        datasets=[{"path": str(root / "pairs.jsonl"), "type": "chat_template.default"}],
        micro_batch_size=PAIRS,
        max_steps=STEPS,
        learning_rate=LR,
        lr_scheduler="constant",
        optimizer="adamw_torch",
        max_grad_norm=1.0,
        save_strategy="no",
    )
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "out", trl_history(root, model, rows, method, beta)


def test_step_one_matches_trl(runs: tuple[Path, list[dict]]) -> None:
    out, trl = runs
    for name in STEP_ONE:
        ours = read_metrics(out, name)[1]
        assert abs(ours - trl[0][name]) <= 1e-5, (name, ours, trl[0][name])


def test_ten_losses_and_rewards_match_trl(runs: tuple[Path, list[dict]]) -> None:
    out, trl = runs
    assert len(trl) == STEPS
    names = ("loss", "rewards/margins", "kl") if "kl" in trl[0] else ("loss", "rewards/margins", "rewards/accuracies")
    for name in names:
        ours = read_metrics(out, name)
        for step, record in enumerate(trl, start=1):
            assert abs(ours[step] - record[name]) <= 1e-3, (name, step, ours[step], record[name])


def test_kto_reads_pairs_as_trl_unpairs_them(tmp_path: Path, model: Path) -> None:
    """Under ``rl: kto`` a pair (prompt/chosen/rejected) is two rows, the chosen answer desirable and the rejected one
    not, as TRL's ``unpair_preference_dataset`` makes them: step 1 equals TRL's KTOTrainer on those rows."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.data_utils import unpair_preference_dataset

    pairs = pair_rows(PAIRS // 2, chat=False)
    write_rows(tmp_path / "pairs.jsonl", pairs)
    config = write_config(
        tmp_path,
        base_model=str(model),
        random_init_weights=False,
        rl="kto",
        rl_beta=0.5,
        datasets=[{"path": str(tmp_path / "pairs.jsonl"), "type": "chat_template.default"}],
        micro_batch_size=PAIRS,
        max_steps=1,
        learning_rate=LR,
        optimizer="adamw_torch",
        save_strategy="no",
    )
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{PAIRS} samples, {PAIRS} kept" in done.stdout  # two of each pair
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = sorted(  # ktrain orders a micro-batch by token ids; TRL keeps the dataset's order
        unpair_preference_dataset(Dataset.from_list(pairs)).to_list(),
        key=lambda r: tokenizer(r["prompt"] + r["completion"] + tokenizer.eos_token)["input_ids"],
    )
    trl = trl_history(tmp_path, model, rows, "kto", 0.5)
    for name in STEP_ONE:
        ours = read_metrics(tmp_path / "out", name)[1]
        assert abs(ours - trl[0][name]) <= 1e-5, (name, ours, trl[0][name])

"""Preference configs as users write them: Axolotl's QLoRA DPO example checks and trains on CPU; methods
that generate while training, and configs that cannot train pairs, are refused before any rank starts."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from ktrain.cli import main
from ktrain.testing import ktrain, model_dir, read_metrics

AXOLOTL_DPO = Path(__file__).parent / "fixtures" / "axolotl_dpo_qlora.yaml"


def _axolotl_rows(path: Path, count: int) -> Path:
    """Rows as Axolotl's DPO examples hold them: the prompt's turns in ``conversation``, each answer a turn."""
    rng = random.Random(1)
    rows = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append(
            {
                "conversation": [{"role": "user", "content": f"{a}+{b}="}],
                "chosen": {"role": "assistant", "content": str(a + b)},
                "rejected": {"role": "assistant", "content": str(a - b)},
            }
        )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("axolotl-dpo")
    model_dir(path, weights=True)  # QLoRA quantizes saved weights
    _axolotl_rows(path / "pairs.jsonl", 40)
    return path


def _sets(root: Path, **keys: object) -> list[str]:
    pairs = {
        "base_model": root / "model",
        "datasets.0.path": root / "pairs.jsonl",
        "sequence_len": 64,
        "max_steps": 2,
        "output_dir": root / "out",
        **keys,
    }
    return [arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]


def test_axolotl_qlora_dpo_config_checks_and_trains_on_cpu(root: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["check", str(AXOLOTL_DPO), *_sets(root)]) == 0, capsys.readouterr().err[-2000:]
    checked = capsys.readouterr().out
    assert "objective" in checked and "ktrain-plugin-preference" in checked
    done = ktrain("run", str(AXOLOTL_DPO), *_sets(root))
    assert done.returncode == 0, done.stderr[-3000:]
    losses = read_metrics(root / "out")
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
    assert losses[1] == pytest.approx(math.log(2), abs=1e-6)  # the adapter starts at zero: policy == reference
    assert read_metrics(root / "out", "rewards/margins")[2] != 0.0
    assert (root / "out" / "final" / "adapter_model.safetensors").is_file()


def test_generation_methods_are_refused_by_name_before_launch(root: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["run", str(AXOLOTL_DPO), *_sets(root, rl="grpo", output_dir=root / "grpo")]) == 2
    err = capsys.readouterr().err
    assert "grpo needs a generation engine; not supported yet" in err
    assert "Traceback" not in err and not (root / "grpo").exists()


def test_packed_pairs_fused_losses_kto_misfits_and_non_pairs_are_refused(
    root: Path, capsys: pytest.CaptureFixture
) -> None:
    plain = {"sample_packing": "true", "datasets.0.type": "chat_template", "fused_linear_cross_entropy": "true"}
    assert main(["check", str(AXOLOTL_DPO), *_sets(root, **plain)]) == 2
    err = capsys.readouterr().err
    assert "sample_packing" in err and "datasets[0].type" in err and "leave fused_linear_cross_entropy out" in err
    assert main(["check", str(AXOLOTL_DPO), *_sets(root, kto_desirable_weight=2)]) == 2
    assert "kto_desirable_weight: applies to rl: kto only" in capsys.readouterr().err
    assert main(["check", str(AXOLOTL_DPO), *_sets(root, rl="kto", micro_batch_size=1)]) == 2
    assert "micro_batch_size: rl: kto estimates its KL term from the other rows" in capsys.readouterr().err


def test_a_pair_whose_prompt_fills_sequence_len_is_reported_by_the_data_check(
    root: Path, capsys: pytest.CaptureFixture
) -> None:
    long = root / "long.jsonl"
    rows = [{"conversation": prompt, "chosen": "2", "rejected": "3"} for prompt in ("1+1=" * 20, "1+1=")]
    long.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    sets = _sets(root, **{"datasets.0.path": long})
    assert main(["preprocess", str(AXOLOTL_DPO), *sets, "--check-only"]) == 2
    out = capsys.readouterr().out
    assert "sample 0" in out and "fill sequence_len 64" in out and "1 kept" in out


def test_axolotl_chatml_and_llama3_preference_types_are_written_as_axolotl_writes_them(
    root: Path, capsys: pytest.CaptureFixture
) -> None:
    cases = {
        "chatml.intel": (
            {"system": "Be brief.", "question": "1+1=", "chosen": "2", "rejected": "3"},
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n",
            "[[2<|im_end|>]]",
        ),
        "llama3.default": (
            {"instruction": "1+1=", "chosen_response": "2", "rejected_response": "3"},
            "<|start_header_id|>user<|end_header_id|>\n\n1+1=<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            "[[2<|eot_id|><|im_end|>]]",  # the tiny tokenizer's EOS is <|im_end|>; TRL appends it to text answers
        ),
    }
    for name, (row, prompt, answer) in cases.items():
        path = root / f"{name}.jsonl"
        path.write_text(json.dumps(row) + "\n", encoding="utf-8")
        sets = _sets(root, **{"datasets.0.path": path, "datasets.0.type": name, "sequence_len": 128})
        assert main(["preprocess", str(AXOLOTL_DPO), *sets, "--check-only"]) == 0, capsys.readouterr().err[-2000:]
        out = capsys.readouterr().out
        assert f"{prompt}{answer}{prompt}{answer.replace('2', '3')}" in out, out[-1500:]


def test_axolotl_kto_types_are_written_as_axolotl_writes_them(root: Path, capsys: pytest.CaptureFixture) -> None:
    llama3_user = "<|start_header_id|>user<|end_header_id|>\n\n1+1=<|eot_id|>"
    cases = {
        "llama3.ultra": (  # the type of Axolotl's KTO example (llama-3/qlora-1b-kto.yaml)
            {"system": "Be brief.", "prompt": "1+1=", "completion": "2", "label": True},
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            f"{llama3_user}<|start_header_id|>assistant<|end_header_id|>\n\n",
            "[[2<|eot_id|><|im_end|>]]",  # the tiny tokenizer's EOS is <|im_end|>; TRL appends it to text answers
        ),
        "chatml.argilla_chat": (
            {"completion": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}], "label": True},
            "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n",
            "[[2<|im_end|>]]",
        ),
    }
    for name, (row, prompt, answer) in cases.items():
        path = root / f"kto-{name}.jsonl"
        path.write_text(json.dumps(row) + "\n", encoding="utf-8")
        sets = _sets(root, rl="kto", micro_batch_size=2, sequence_len=512, **{"datasets.0.path": path})
        sets += ["--set", f"datasets.0.type={name}"]
        assert main(["preprocess", str(AXOLOTL_DPO), *sets, "--check-only"]) == 0, capsys.readouterr().err[-2000:]
        out = capsys.readouterr().out
        assert f"{prompt}{answer}" in out, out[-1500:]
    assert (
        main(
            ["check", str(AXOLOTL_DPO), *_sets(root, rl="kto", micro_batch_size=2, **{"datasets.0.type": "chatml.icr"})]
        )
        == 2
    )
    assert "rl: kto reads prompt/completion/label rows" in capsys.readouterr().err
    assert main(["check", str(AXOLOTL_DPO), *_sets(root, **{"datasets.0.type": "llama3.argilla"})]) == 2
    assert "rl: dpo trains on preference pairs" in capsys.readouterr().err

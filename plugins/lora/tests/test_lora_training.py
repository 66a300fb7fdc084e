"""Adapters trained for real through the CLI on CPU: QLoRA, LoRA with DoRA/rsLoRA, an 8-bit base, a bf16 base.

One QLoRA run (module fixture, a base with weights on disk) is shared: its loss falls, a resume from its
middle checkpoint repeats it bit for bit, ``ktrain merge-lora`` turns it into a model whose logits match
the adapter model's, and it is the reference that FSDP2 and DeepSpeed ZeRO runs on 2 ranks must match.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from peft import PeftModel
from safetensors.torch import load_file

from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records

QLORA = {
    "adapter": "qlora",
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_target_linear": True,
    "gradient_accumulation_steps": 2,
    "max_steps": 6,
    "save_steps": 3,
    "val_set_size": 16,
    "eval_steps": 3,  # an evaluation between training steps: the CPU repacking of 4-bit weights must stay off
    "random_init_weights": False,  # the fixture saves the base's weights
}
# What the plugin's defaults ask bitsandbytes for in an fp32 run.
NF4 = transformers.BitsAndBytesConfig(
    load_in_4bit=True,
    bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True,
    bnb_4bit_compute_dtype=torch.float32,
    bnb_4bit_quant_storage=torch.bfloat16,
)
# Logits of the merged model against the adapter model, fp32 on CPU: only the order of the sums differs.
LOGITS_ATOL = 1e-4


@pytest.fixture(scope="module")
def qlora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 6-step QLoRA run on the tiny model (checkpoints at steps 3 and 6)."""
    root = tmp_path_factory.mktemp("qlora")
    model_dir(root)
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(root / "model")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(root / "model")
    dataset(root, 200)
    config = write_config(root, **QLORA)
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr
    return root


def _adapter_model(root: Path, adapter: Path, quantization: transformers.BitsAndBytesConfig | None) -> PeftModel:
    """The trained adapter on its base, rebuilt here as the run built it (random weights: from the seed).

    Left in train mode (nothing drops out: no dropout is set): in eval mode bitsandbytes would compute
    4-bit layers through its CPU inference kernels, in lower precision than training did.
    """
    if (root / "model" / "model.safetensors").exists():
        base = transformers.AutoModelForCausalLM.from_pretrained(root / "model", quantization_config=quantization)
    else:
        config = transformers.AutoConfig.from_pretrained(root / "model")
        torch.manual_seed(7)  # tests.kit's seed
        base = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if quantization is not None:
            base = type(base).from_pretrained(
                None, config=config, state_dict=base.state_dict(), quantization_config=quantization
            )
    return PeftModel.from_pretrained(base, adapter).train()


def _assert_merged_matches(
    root: Path, merged_dir: Path, adapter: Path, quantization: transformers.BitsAndBytesConfig | None
) -> None:
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert not any("bitsandbytes" in type(m).__module__ for m in merged.modules())  # a plain model
    assert "quantization_config" not in json.loads((merged_dir / "config.json").read_text())
    ids = torch.randint(0, merged.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = _adapter_model(root, adapter, quantization)(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    assert (got - expected).abs().max() < LOGITS_ATOL


def test_qlora_trains_resumes_exactly_and_merges(qlora_run: Path) -> None:
    out = qlora_run / "out"
    losses = records(out)
    assert sorted(losses) == list(range(1, 7))
    assert losses[6] < losses[1]
    checkpoint = load_file(out / "checkpoints" / "step-00000003" / "model.safetensors")
    assert checkpoint and all(".lora_" in name for name in checkpoint)  # the adapter only, never the 4-bit base
    adapter = load_file(out / "final" / "adapter_model.safetensors")
    assert len(adapter) == 2 * 7 * 2  # A and B of 7 linear layers in 2 blocks

    # Resume from step 3 of a copy: the same losses and the same adapter, to the bit.
    again = qlora_run / "again"
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "step-00000006")
    shutil.rmtree(again / "final")
    lines = (again / "metrics.jsonl").read_text().splitlines()
    (again / "metrics.jsonl").write_text("\n".join(line for line in lines if json.loads(line)["step"] <= 3) + "\n")
    config = write_config(qlora_run, "again.yaml", **QLORA, output_dir=str(again))
    resumed = ktrain("run", str(config), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    assert records(again) == losses
    assert (again / "final" / "adapter_model.safetensors").read_bytes() == (
        out / "final" / "adapter_model.safetensors"
    ).read_bytes()

    merged = ktrain("merge-lora", str(out))
    assert merged.returncode == 0, merged.stderr
    _assert_merged_matches(qlora_run, out / "merged", out / "final", NF4)


def test_lora_dora_rslora_modules_to_save_train_and_merge(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 200)
    config = write_config(
        tmp_path,
        adapter="lora",
        peft_use_dora=True,
        peft_use_rslora=True,
        lora_target_modules=["q_proj", "v_proj", "down_proj"],
        lora_modules_to_save=["lm_head"],
        max_steps=4,
        save_steps=4,
    )
    done = ktrain("run", str(config), env={"PYTHONPROFILEIMPORTTIME": "1"})  # every import on stderr
    assert done.returncode == 0, done.stderr
    imports = done.stderr + (tmp_path / "out" / "logs" / "rank-0.log").read_text()  # the rank's are in its log
    assert "import time:" in imports and "bitsandbytes." not in imports  # an unquantized base: never imported
    losses = records(tmp_path / "out")
    assert losses[4] < losses[1]
    adapter = load_file(tmp_path / "out" / "final" / "adapter_model.safetensors")
    assert any("lora_magnitude_vector" in name for name in adapter)  # DoRA's magnitudes
    assert any("lm_head" in name for name in adapter)  # the module trained in full
    checkpoint = ktrain(
        "merge-lora", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "out" / "checkpoints" / "step-00000004")
    )
    assert checkpoint.returncode == 0, checkpoint.stderr
    _assert_merged_matches(tmp_path, tmp_path / "out" / "merged", tmp_path / "out" / "final", None)
    # ktrain generate on the run: its base with the adapter on it answers as the merged model does.
    out = tmp_path / "out"
    answers = [ktrain("generate", str(folder), "What is 12+34?") for folder in (out, out / "merged")]
    assert [a.returncode for a in answers] == [0, 0], answers[0].stderr
    assert answers[0].stdout == answers[1].stdout
    # The trained adapter, continued (lora_model_dir): its first loss is the trained adapter's, not the base's.
    again = write_config(
        tmp_path,
        "again.yaml",
        adapter="lora",
        lora_model_dir=str(tmp_path / "out" / "final"),
        max_steps=1,
        output_dir=str(tmp_path / "again"),
    )
    done = ktrain("run", str(again))
    assert done.returncode == 0, done.stderr
    assert records(tmp_path / "again")[1] < losses[1] - 0.1


def test_lora_on_an_8bit_base_trains_and_merges(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 200)
    config = write_config(tmp_path, adapter="lora", load_in_8bit=True, lora_target_linear=True, max_steps=4)
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr
    losses = records(tmp_path / "out")
    assert losses[4] < losses[1]
    merged = ktrain("merge-lora", str(tmp_path / "out"))
    assert merged.returncode == 0, merged.stderr
    out = tmp_path / "out"
    _assert_merged_matches(tmp_path, out / "merged", out / "final", transformers.BitsAndBytesConfig(load_in_8bit=True))


def test_lora_on_a_bf16_base_trains_fp32_adapter_weights(tmp_path: Path) -> None:
    """``bfloat16: true`` with an adapter, as a GPU run takes it by default: the base loads in bf16, the adapter's
    weights train in fp32 under bf16 autocast."""
    model_dir(tmp_path)
    dataset(tmp_path, 200)
    config = write_config(tmp_path, adapter="lora", lora_target_linear=True, bf16=True, bfloat16=True, max_steps=4)
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr
    losses = records(tmp_path / "out")
    assert losses[4] < losses[1]
    adapter = load_file(tmp_path / "out" / "final" / "adapter_model.safetensors")
    assert adapter and {t.dtype for t in adapter.values()} == {torch.float32}


def test_lora_with_fp32_masters_trains_bf16_adapter_weights_resumes_exactly_and_follows_fp32_adapters(
    tmp_path: Path,
) -> None:
    """``bfloat16: true`` with ``adamw_fp32_master``, as a GPU run takes them by default: the adapter's weights and
    gradients are bf16 (no casts of them under autocast), their fp32 masters and moments in the optimizer. The
    losses follow those of fp32 adapter weights (the masters start from the bf16 rounding of the adapter's
    initial weights); the exported adapter holds bf16 weights; a resume from step 2 repeats the run to the bit
    (the masters are in the checkpoint)."""
    model_dir(tmp_path)
    dataset(tmp_path, 200)
    lora = {"adapter": "lora", "lora_target_linear": True, "bf16": True, "bfloat16": True, "max_steps": 4}
    runs = {}
    for name, optimizer in (("fp32", "adamw_torch"), ("masters", "adamw_fp32_master")):
        config = write_config(
            tmp_path, f"{name}.yaml", **lora, optimizer=optimizer, save_steps=2, output_dir=str(tmp_path / name)
        )
        done = ktrain("run", str(config))
        assert done.returncode == 0, done.stderr
        runs[name] = records(tmp_path / name)
    assert runs["masters"].keys() == runs["fp32"].keys() == set(range(1, 5))
    assert runs["masters"][1] == runs["fp32"][1]  # the same forward: the bf16 values autocast computes with
    for step in (2, 3, 4):  # updates of the same fp32 arithmetic from a start rounded to bf16
        assert runs["masters"][step] == pytest.approx(runs["fp32"][step], rel=1e-3), step
    assert runs["masters"][4] < runs["masters"][1]
    out = tmp_path / "masters"
    adapter = load_file(out / "final" / "adapter_model.safetensors")
    assert adapter and {t.dtype for t in adapter.values()} == {torch.bfloat16}

    again = tmp_path / "again"
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "step-00000004", ignore_errors=True)
    shutil.rmtree(again / "final")
    lines = (again / "metrics.jsonl").read_text().splitlines()
    (again / "metrics.jsonl").write_text("\n".join(line for line in lines if json.loads(line)["step"] <= 2) + "\n")
    config = write_config(tmp_path, "again.yaml", **lora, optimizer="adamw_fp32_master", output_dir=str(again))
    resumed = ktrain("run", str(config), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    assert records(again) == runs["masters"]
    assert (again / "final" / "adapter_model.safetensors").read_bytes() == (
        out / "final" / "adapter_model.safetensors"
    ).read_bytes()


def test_qlora_with_fp32_masters_trains_bf16_adapter_weights_over_the_4bit_base(tmp_path: Path) -> None:
    """A QLoRA run takes ``bfloat16: true`` with ``adamw_fp32_master`` by default on a GPU: the 4-bit base keeps its
    weights and computes in bf16, the adapter's weights and gradients are bf16 with fp32 masters and moments in
    the optimizer. Step 1's loss is that of fp32 adapter weights under bf16 autocast; the next follow them to a
    relative 1e-3 (the same fp32 updates from a start rounded to bf16); the exported adapter holds bf16 weights."""
    model_dir(tmp_path)
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(tmp_path / "model")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    dataset(tmp_path, 200)
    keys = {**QLORA, "gradient_accumulation_steps": 1, "max_steps": 4, "bf16": True, "bfloat16": True}
    keys = {k: v for k, v in keys.items() if k not in ("val_set_size", "eval_steps", "save_steps")}
    runs = {}
    for name, optimizer in (("fp32", "adamw_torch"), ("masters", "adamw_fp32_master")):
        config = write_config(tmp_path, f"{name}.yaml", **keys, optimizer=optimizer, output_dir=str(tmp_path / name))
        done = ktrain("run", str(config))
        assert done.returncode == 0, done.stderr
        runs[name] = records(tmp_path / name)
    assert runs["masters"].keys() == runs["fp32"].keys() == set(range(1, 5))
    assert runs["masters"][1] == runs["fp32"][1]
    for step in (2, 3, 4):
        assert runs["masters"][step] == pytest.approx(runs["fp32"][step], rel=1e-3), step
    assert runs["masters"][4] < runs["masters"][1]
    adapter = load_file(tmp_path / "masters" / "final" / "adapter_model.safetensors")
    assert adapter and {t.dtype for t in adapter.values()} == {torch.bfloat16}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _two_ranks_match_the_reference(qlora_run: Path, name: str, **keys: object) -> Path:
    """The fixture's run on 2 ranks of 4 rows (it took 2 micro-batches of 4): the same losses, fp32."""
    run_keys = {**QLORA, "gradient_accumulation_steps": 1, **keys}
    config = write_config(qlora_run, f"{name}.yaml", **run_keys, output_dir=str(qlora_run / name))
    done = ktrain("run", str(config), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    expected, got = records(qlora_run / "out"), records(qlora_run / name)
    assert got.keys() == expected.keys() == set(range(1, 7))
    for step in expected:  # only the order of the gradient sums differs
        assert got[step] == pytest.approx(expected[step], rel=1e-5), step
    return qlora_run / name


@pytest.mark.skipif(not _installed("ktrain_fsdp"), reason="needs ktrain-plugin-fsdp: pip install -e plugins/fsdp")
def test_qlora_under_fsdp2_with_cpu_ram_efficient_loading_matches_one_process(qlora_run: Path) -> None:
    """The quantized base sharded by FSDP2, rank 0 alone reading and quantizing it (the others get its packed 4-bit
    weights and quantization states by broadcast): the same losses as one process; the DCP checkpoint's adapter
    merges like the final one."""
    fsdp = {"reshard_after_forward": True, "cpu_ram_efficient_loading": True}
    run = _two_ranks_match_the_reference(qlora_run, "fsdp2-ram", fsdp_version=2, fsdp_config=fsdp)
    merged = ktrain(
        "merge-lora", str(run), "--checkpoint", str(run / "checkpoints" / "step-00000006"), "--output", str(run / "m")
    )
    assert merged.returncode == 0, merged.stderr
    _assert_merged_matches(qlora_run, run / "m", qlora_run / "out" / "final", NF4)


def test_qlora_with_peft_forward_gives_the_fused_forward_losses(qlora_run: Path) -> None:
    """``lora_fused_forward: false`` (peft's forward in every LoRA layer): the fixture's losses, fp32."""
    config = write_config(qlora_run, "peft.yaml", **QLORA, lora_fused_forward=False, output_dir=str(qlora_run / "peft"))
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr
    expected, got = records(qlora_run / "out"), records(qlora_run / "peft")
    assert got.keys() == expected.keys() == set(range(1, 7))
    for step in expected:  # only the rounding of the adapter's scale and sum differs
        assert got[step] == pytest.approx(expected[step], rel=1e-5), step


def test_generate_answers_with_the_qlora_adapter_on_its_4bit_base(qlora_run: Path) -> None:
    done = ktrain("generate", str(qlora_run / "out"), "What is 12+34?")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1


@pytest.mark.skipif(
    not _installed("ktrain_deepspeed"), reason="needs ktrain-plugin-deepspeed: pip install -e plugins/deepspeed"
)
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_qlora_under_deepspeed_on_two_ranks_matches_one_process(qlora_run: Path, stage: str) -> None:
    """ZeRO-2 shards the adapter's optimizer state; ZeRO-3 partitions the 4-bit base itself."""
    run = _two_ranks_match_the_reference(qlora_run, stage, deepspeed=stage)
    assert (run / "final" / "adapter_model.safetensors").exists()

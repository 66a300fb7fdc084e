"""Fast defaults: on a GPU a config that does not say otherwise gets bf16 weights with fp32 masters, compiled
blocks and the fused loss; on a CPU nothing changes; a written key switches its default off. In process: the
plan is made as ``ktrain run`` makes it on a GPU (``device="cuda"``), no GPU needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktrain.commands.describe import describe_plan
from ktrain.config import fast_defaults
from ktrain.config.plan import load_plugins_and_config, prepare

MODEL = Path(__file__).parents[2] / "configs" / "bench" / "llama_1p5b"  # a Llama's config.json: nothing loads

LINES = [
    "fused_linear_cross_entropy: on (fast default on CUDA; set fused_linear_cross_entropy: false to switch off)",
    "torch_compile: on (fast default on CUDA; set torch_compile: false to switch off)",
    "bfloat16: on with optimizer: adamw_fp32_master (fast default on CUDA; set bfloat16: false to switch off)",
]


@pytest.fixture
def write(tmp_path: Path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "a b c"}\n', encoding="utf-8")

    def write(extra: str = "") -> Path:
        path = tmp_path / "config.yaml"
        path.write_text(
            f"base_model: {MODEL}\nrandom_init_weights: true\nbf16: true\noptimizer: adamw_torch_fused\n"
            f"datasets:\n  - path: {data}\n    type: completion\noutput_dir: {tmp_path / 'out'}\n{extra}",
            encoding="utf-8",
        )
        return path

    return write


def _fast(config) -> tuple:
    return config.bfloat16, config.optimizer, config.torch_compile, config.fused_linear_cross_entropy


def test_a_gpu_run_gets_every_fast_path_and_writes_it_for_its_ranks(write) -> None:
    plan = prepare(write(), world_size=1, device="cuda", capability=(9, 0))
    config = plan.config
    assert _fast(config) == (True, "adamw_fp32_master", True, True)
    assert {a.plugin.name for a in plan.plugins.activations} >= {"compile", "fused_loss"}
    assert sorted(c.line() for c in fast_defaults.applied(config)) == sorted(LINES)
    assert config.origins["optimizer"] == fast_defaults.ORIGIN
    written = config.to_yaml(only_present=True)  # the run directory's config.yaml, which every rank reads
    for line in ("bfloat16: true", "optimizer: adamw_fp32_master", "torch_compile: true"):
        assert line in written


def test_a_cpu_run_keeps_the_keys_as_written_and_check_lists_the_gpu_choices(write) -> None:
    for device in ("cpu", None):
        plan = prepare(write(), world_size=1, device=device)
        assert _fast(plan.config) == (False, "adamw_torch_fused", False, False)
        assert not fast_defaults.applied(plan.config)
    shown = describe_plan(prepare(write(), world_size=1))
    assert all(f"  {line}" in shown for line in LINES)


def test_a_written_key_switches_its_default_off(write) -> None:
    config = prepare(write("torch_compile: false\nbfloat16: false\n"), device="cuda", capability=(9, 0)).config
    assert _fast(config) == (False, "adamw_torch_fused", False, True)
    liger = ["liger_rope", "liger_rms_norm", "liger_glu_activation"]  # Liger's kernels where blocks are not compiled
    assert [c.key for c in fast_defaults.applied(config)] == [*liger, "fused_linear_cross_entropy"]


@pytest.mark.parametrize(
    ("overrides", "taken"),
    [
        (["gradient_accumulation_steps=2"], {"torch_compile", "fused_linear_cross_entropy"}),
        (["optimizer=sgd"], {"torch_compile", "fused_linear_cross_entropy"}),
        (["deepspeed={zero_optimization: {stage: 2}}"], {"torch_compile", "fused_linear_cross_entropy"}),
        (["liger_fused_linear_cross_entropy=true"], {"torch_compile", "bfloat16"}),
        (
            ["adapter=qlora", "load_in_4bit=true"],
            {"bfloat16", "fused_linear_cross_entropy", "liger_rope", "liger_rms_norm", "liger_glu_activation"},
        ),
        (["tensor_parallel_size=2"], {"bfloat16"}),
        (["bf16=false"], {"torch_compile", "fused_linear_cross_entropy"}),
    ],
)
def test_a_default_that_does_not_fit_the_config_is_not_taken(write, overrides: list[str], taken: set[str]) -> None:
    _, config = load_plugins_and_config(write(), overrides)
    assert {c.key for c in fast_defaults.pending(config, (9, 0))} == taken


def test_an_adapter_run_gets_a_bf16_base_and_bf16_adapter_weights_with_fp32_masters(write) -> None:
    """With an adapter the frozen base turns bf16, and under AdamW in one micro-batch a step the adapter's weights
    too, their fp32 masters in ``adamw_fp32_master``; micro-batches that accumulate, or another optimizer, keep the
    adapter's weights fp32 and the optimizer as written; a 4-bit base keeps its 4-bit weights and gets bf16 adapter
    weights with fp32 masters too; an 8-bit base or FSDP keeps its dtypes."""
    lora = "adapter: lora\nlora_target_linear: true\n"
    config = prepare(write(lora), device="cuda", capability=(9, 0)).config
    assert (config.bfloat16, config.optimizer) == (True, "adamw_fp32_master")
    lines = [c.line() for c in fast_defaults.applied(config)]
    assert LINES[2] in lines
    for override, optimizer in (("gradient_accumulation_steps=2", "adamw_torch_fused"), ("optimizer=sgd", "sgd")):
        config = prepare(write(lora), [override], device="cuda", capability=(9, 0)).config
        assert (config.bfloat16, config.optimizer) == (True, optimizer), override
        lines = [c.line() for c in fast_defaults.applied(config)]
        assert "bfloat16: on (fast default on CUDA; set bfloat16: false to switch off)" in lines
    config = prepare(write(lora), ["adapter=qlora", "load_in_4bit=true"], device="cuda", capability=(9, 0)).config
    assert (config.bfloat16, config.optimizer) == (True, "adamw_fp32_master")
    for overrides in (["fsdp_version=2", "fsdp_config={reshard_after_forward: true}"], ["load_in_8bit=true"]):
        _, config = load_plugins_and_config(write(lora), overrides)
        assert "bfloat16" not in {c.key for c in fast_defaults.pending(config, (9, 0))}, overrides


def test_a_frozen_output_layer_gets_the_fused_loss_in_chunks(write) -> None:
    """With an adapter the output layer is frozen: the fused loss's default splits the tokens into chunks of at most
    2**28 logits (4 x 2,048 tokens x 128,256 logits: 4 chunks), so no gradient of the logits is held until the
    backward. The whole model trained, an adapter that trains the output layer, or logits that fit one chunk: one."""
    lora = "adapter: lora\nlora_target_linear: true\nmicro_batch_size: 4\n"
    config = prepare(write(lora), device="cuda", capability=(9, 0)).config
    assert (config.fused_linear_cross_entropy, config.fused_linear_cross_entropy_chunks) == (True, 4)
    assert config.origins["fused_linear_cross_entropy_chunks"] == fast_defaults.ORIGIN
    assert "fused_linear_cross_entropy: on with fused_linear_cross_entropy_chunks: 4 (fast default on CUDA" in " ".join(
        c.line() for c in fast_defaults.applied(config)
    )
    for extra, overrides in (
        ("micro_batch_size: 4\n", []),
        (lora, ["lora_modules_to_save=[lm_head]"]),
        (lora, ["micro_batch_size=1"]),
    ):
        config = prepare(write(extra), overrides, device="cuda", capability=(9, 0)).config
        assert (config.fused_linear_cross_entropy, config.fused_linear_cross_entropy_chunks) == (True, 1), extra
    config = prepare(write(lora + "fused_linear_cross_entropy_chunks: 2\n"), device="cuda", capability=(9, 0)).config
    assert (config.fused_linear_cross_entropy, config.fused_linear_cross_entropy_chunks) == (True, 2)

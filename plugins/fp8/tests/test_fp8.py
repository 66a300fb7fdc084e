"""ktrain-plugin-fp8 on CPU: the conversion plan, the conversion itself, and the refusals before launch.

The plan is computed on the 1.5B Llama shape of configs/bench built on the ``meta`` device (no memory, no
weights). The conversion runs torchao on a tiny Llama on the CPU, where torch emulates the float8 matrix
multiply: the parameters stay the same objects, names and dtypes, and a forward and backward run. The
refusals go through the checks a ``ktrain run`` makes before any rank starts.
"""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import pytest
import torch
import transformers

from ktrain.commands.describe import describe_plan
from ktrain.config import fast_defaults
from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from ktrain.testing import dataset, ktrain, launch_problems, model_dir, write_config
from ktrain.testing.assets import TINY_LLAMA
from ktrain_fp8.plan import conversion_plan
from ktrain_fp8.runtime import convert

REPO = Path(__file__).resolve().parents[3]
TINY = {**TINY_LLAMA, "use_cache": False}


def _fp8_keys(**keys) -> types.SimpleNamespace:
    defaults = {
        "fp8_recipe": "tensorwise",
        "fp8_fast_accumulation": False,
        "fp8_exclude_modules": ["lm_head"],
        "fp8_skip_small_layers": True,
        "fp8_enable_fsdp_float8_all_gather": False,
        "source": "run.yaml",
    }
    return types.SimpleNamespace(**{**defaults, **keys})


def test_the_plan_of_the_1p5b_shape() -> None:
    """Tensorwise converts q, o, gate, up and down of each block; the output layer and the 512-wide k and v
    projections stay in bf16. Rowwise's thresholds leave only gate and up. Names and globs exclude more.
    (Two of the 16 blocks: the plan of a block does not depend on how many there are.)"""
    config = transformers.AutoConfig.from_pretrained(REPO / "configs/bench/llama_1p5b", num_hidden_layers=2)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    plan = conversion_plan(model, "tensorwise", ["lm_head"])
    assert len(plan.converted) == 10 and len(plan.kept) == 5
    kinds = {name.rsplit(".", 1)[-1] for name in plan.converted}
    assert kinds == {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert plan.kept["lm_head"] == "excluded by name"
    assert plan.kept["model.layers.1.self_attn.k_proj"] == "too small to gain"
    assert plan.describe() == (
        "10 of 15 linear layers in float8 (tensorwise), kept in bf16: 1 excluded by name (lm_head); "
        "4 too small to gain (k_proj, v_proj)"
    )
    rowwise = conversion_plan(model, "rowwise", ["lm_head"])
    assert {name.rsplit(".", 1)[-1] for name in rowwise.converted} == {"gate_proj", "up_proj"}
    assert len(conversion_plan(model, "tensorwise", ["lm_head"], skip_small=False).converted) == 14
    fewer = conversion_plan(model, "tensorwise", ["lm_head", "mlp.down_proj", "model.layers.0.*"])
    assert len(fewer.converted) == 10 - 2 - 4 and "model.layers.0.mlp.up_proj" in fewer.kept


def test_dimensions_not_multiples_of_16_stay() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.Linear(8192, 4104))
    plan = conversion_plan(model, "tensorwise", [])
    assert plan.converted == ("0",) and plan.kept == {"1": "not multiples of 16"}


def test_conversion_keeps_the_parameters_and_trains() -> None:
    """Only the planned layers become Float8Linear; every parameter is the same tensor (so the optimizer and its
    master weights see what they saw), and the first loss is the bf16 model's within float8's rounding."""
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**TINY)).to(torch.bfloat16)
    before = dict(model.named_parameters())
    ids = torch.randint(0, 96, (2, 32))
    want = model(input_ids=ids, labels=ids).loss.item()
    convert(model, _fp8_keys(fp8_skip_small_layers=False))
    converted = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert len(converted) == 14 and "lm_head" not in converted and type(model.lm_head) is torch.nn.Linear
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is p for n, p in before.items())
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert loss.item() == pytest.approx(want, rel=0.02)
    weight = model.model.layers[0].mlp.up_proj.weight
    assert weight.dtype == weight.grad.dtype == torch.bfloat16


def test_nothing_left_to_convert_is_named() -> None:
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**TINY))
    with pytest.raises(ConfigError, match="fp8_exclude_modules: leaves no linear layer of LlamaForCausalLM"):
        convert(model, _fp8_keys())  # every layer of the tiny model is below the thresholds


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fp8")
    model_dir(root)
    dataset(root, 8)
    return root


def _problems(root: Path, device: str | None, capability: tuple[int, int] | None = None, **keys) -> str:
    """The report of the checks ``ktrain run`` makes before launch ('' when it passes)."""
    return launch_problems(write_config(root, "check.yaml", fp8=True, **keys), device, capability)


def test_the_device_is_checked_before_launch(root: Path) -> None:
    assert "fp8: needs a GPU of compute capability 8.9 or later; this run's ranks would use the CPU" in _problems(
        root, "cpu"
    )
    assert "this one is 8.0; remove fp8" in _problems(root, "cuda", (8, 0))
    assert "needs a GPU" not in _problems(root, "cuda", (9, 0), torch_compile=True)
    assert "`ktrain run` refuses it elsewhere" in _problems(root, None)  # ktrain check: a warning


def test_combinations_that_cannot_work_name_both_keys(root: Path) -> None:
    fused = _problems(root, "cuda", (9, 0), fused_linear_cross_entropy=True, fp8_exclude_modules=["k_proj"])
    assert "fp8_exclude_modules: must keep lm_head in bf16 with fused_linear_cross_entropy" in fused
    gather = _problems(root, "cuda", (9, 0), fp8_enable_fsdp_float8_all_gather=True, fp8_recipe="rowwise")
    assert "fp8_enable_fsdp_float8_all_gather: gathers FSDP2's shards; set fsdp_version: 2" in gather
    assert "works with fp8_recipe: tensorwise only (torchao), not rowwise" in gather
    assert "fp8: computes beside bf16, not fp16" in _problems(root, "cuda", (9, 0), fp16=True)
    if importlib.util.find_spec("ktrain_fsdp"):  # the fsdp plugin's key
        assert "fp8: cannot be used with FSDP1" in _problems(root, "cuda", (9, 0), fsdp_version=1)
    assert "fp8: without torch_compile the casts" in _problems(root, "cuda", (9, 0), torch_compile=False)
    write_config(root, "off.yaml", fp8_recipe="rowwise")
    plan = prepare(root / "off.yaml")
    assert any("fp8_recipe: has no effect without fp8: true" in str(w) for w in plan.warnings)


def test_the_delayed_recipe_checks_its_keys(root: Path) -> None:
    def problems(**keys) -> str:
        return _problems(root, "cuda", (9, 0), torch_compile=True, **keys)

    assert "fp8_amax_history_len: must be at least 1, not 0" in problems(fp8_recipe="delayed", fp8_amax_history_len=0)
    assert "fp8_amax_history_len: has no effect with fp8_recipe: tensorwise (only with delayed)" in problems(
        fp8_recipe="tensorwise", fp8_amax_history_len=8
    )
    assert problems(fp8_amax_history_len=8) == ""  # delayed: the GPU default
    assert "fp8_fused_mlp: has no effect with fp8_recipe: rowwise (only with delayed)" in problems(
        fp8_recipe="rowwise", fp8_fused_mlp=False
    )
    assert problems(fp8_recipe="delayed", fp8_amax_history_len=8, fp8_fused_mlp=False) == ""
    gather = problems(fp8_recipe="delayed", fp8_enable_fsdp_float8_all_gather=True)
    assert "works with fp8_recipe: tensorwise only (torchao), not delayed" in gather


FASTEST = {"fp8_recipe": "delayed", "fp8_fast_accumulation": True, "fused_linear_cross_entropy_fp8": True}
"""The float8 keys a GPU run with ``fp8: true`` takes where the config writes none of them."""


def _taken(root: Path, device: str = "cuda", capability: tuple[int, int] = (9, 0), **keys) -> dict:
    """The float8 keys a run of the config takes from its GPU defaults, with their values."""
    config = write_config(root, "defaults.yaml", bf16=True, **keys)
    plan = prepare(config, world_size=1, device=device, capability=capability)
    return {c.key: c.value for c in fast_defaults.applied(plan.config) if "fp8" in c.key}


def test_on_a_gpu_fp8_takes_delayed_scaling_fast_accumulation_and_the_output_layer_in_float8(root: Path) -> None:
    """The fastest float8 step measured, where a config writes ``fp8: true`` alone; each key written switches its
    own default off; none without fp8 or on a GPU without float8 tensor cores (on a CPU no GPU default applies,
    and fp8 is refused); FSDP2 takes them too (``test_fp8_fsdp``), but tensorwise with the float8 all-gather;
    ``ktrain check`` lists them."""
    assert _taken(root, fp8=True) == FASTEST
    assert _taken(root) == {}
    checked = prepare(write_config(root, "defaults.yaml", bf16=True, fp8=True), world_size=1).config  # ktrain check
    assert not any("fp8" in c.key for c in fast_defaults.pending(checked, (8, 0)))  # no float8 tensor cores
    assert _taken(root, fp8=True, fp8_recipe="tensorwise") == {k: v for k, v in FASTEST.items() if k != "fp8_recipe"}
    assert _taken(root, fp8=True, fp8_fast_accumulation=False).keys() == FASTEST.keys() - {"fp8_fast_accumulation"}
    head = {k: v for k, v in FASTEST.items() if k != "fused_linear_cross_entropy_fp8"}
    assert _taken(root, fp8=True, fused_linear_cross_entropy=False) == head
    assert _taken(root, fp8=True, fused_linear_cross_entropy_chunks=2) == head
    if importlib.util.find_spec("ktrain_fsdp"):  # the fsdp plugin's key
        assert _taken(root, fp8=True, fsdp_version=2) == FASTEST
        gather = _taken(root, fp8=True, fsdp_version=2, fp8_enable_fsdp_float8_all_gather=True)
        assert gather == {k: v for k, v in FASTEST.items() if k != "fp8_recipe"}
    shown = describe_plan(prepare(write_config(root, "defaults.yaml", bf16=True, fp8=True), world_size=1))
    assert "  fp8_recipe: delayed (fast default on CUDA; set fp8_recipe: tensorwise to switch off)" in shown
    assert "  fp8_fast_accumulation: on (fast default on CUDA; set fp8_fast_accumulation: false to switch off)" in shown


def test_ktrain_run_on_a_cpu_is_refused_with_one_line(root: Path) -> None:
    config = write_config(root, "run.yaml", fp8=True, output_dir=str(root / "refused"))
    done = ktrain("run", str(config))
    assert done.returncode == 2, done.stderr
    assert "fp8: needs a GPU of compute capability 8.9 or later" in done.stderr
    assert "Traceback" not in done.stderr and not (root / "refused").exists()


def test_bench_reports_an_fp8_run_against_both_peaks() -> None:
    """``ktrain bench``'s printed report of the fp8 run measured on an H200: MFU against the bf16 peak in the table,
    and a labelled line against the FP8 peak."""
    from ktrain.bench.report import describe_report

    report = json.loads((REPO / "docs/results/h200-2026-12-04-fp8/profile_fp8_tensorwise.json").read_text())
    text = describe_report(report)
    assert "peak 989 TFLOP/s" in text and " 67.3% " in text
    assert "fp8: MFU 33.7% against the dense FP8 peak (1978 TFLOP/s); the MFU column is against the bf16 peak" in text

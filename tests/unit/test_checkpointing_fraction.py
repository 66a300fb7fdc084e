"""``gradient_checkpointing_fraction``: the share of the blocks that recompute under transformers' own switch,
and ``auto``, its GPU default, resolved from the memory model as a function of the config and a GPU's memory.

The blocks not chosen keep their activations (each ``GradientCheckpointingLayer``'s own attribute), the module
names stay those of the model, and the loss and gradients are those without checkpointing (fp32 on CPU). The
resolution is made as ``ktrain run`` makes it on a GPU (``device="cuda"``), no GPU needed.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path

import attrs
import pytest
import torch
import transformers

from ktrain import hookimpl
from ktrain.builtin.checkpointing import Recompute, apply_checkpointing
from ktrain.cli import EXIT_BAD_INPUT, main
from ktrain.commands.describe import describe_plan
from ktrain.config import fast_defaults
from ktrain.config.plan import load_plugins_and_config, prepare
from ktrain.memory.fraction import GPU_SHARE, fraction_of, with_fraction
from ktrain.memory.model import predict
from ktrain.testing import model_dir

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
KEY = "gradient_checkpointing_fraction"


def _step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[int], torch.Tensor, list[torch.Tensor]]:
    """Forward and backward; how often each block's MLP ran, the loss and the gradients."""
    calls = [0] * len(model.model.layers)
    hooks = [
        layer.mlp.register_forward_pre_hook(lambda module, args, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, layer in enumerate(model.model.layers)
    ]
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    for hook in hooks:
        hook.remove()
    return calls, loss.detach(), [p.grad for p in model.parameters()]


def test_the_blocks_not_chosen_run_once_and_the_gradients_are_those_without_checkpointing(
    tmp_path: Path, tiny_config
) -> None:
    config = transformers.AutoConfig.from_pretrained(model_dir(tmp_path, num_hidden_layers=4))
    torch.manual_seed(0)
    plain = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    once, loss, want = _step(copy.deepcopy(plain), ids)
    assert once == [1, 1, 1, 1]
    written = load_plugins_and_config(tiny_config(gradient_checkpointing=True, **{KEY: 0.5}), [])[1]
    model = copy.deepcopy(plain)
    assert apply_checkpointing(model, Recompute.from_config(written)) == 2
    assert [name for name, _ in model.named_modules()] == [name for name, _ in plain.named_modules()]  # PEFT's targets
    model.train()
    calls, got_loss, got = _step(model, ids)
    assert calls == [1, 2, 1, 2]  # two blocks of four, spread evenly, ran again in backward
    assert torch.equal(loss, got_loss)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-7) for a, b in zip(want, got, strict=True))


@pytest.mark.parametrize("value", ["0", "1.5", "-0.5", "abc", "true"])
def test_a_bad_fraction_is_one_line_naming_the_key_and_exit_2(tiny_config, capsys, value: str) -> None:
    path = tiny_config(gradient_checkpointing=True)
    assert main(["check", str(path), "--set", f"{KEY}={value}"]) == EXIT_BAD_INPUT
    problems = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith(f"  - {KEY}: "), problems


def _bench(name: str, *sets: str) -> tuple[Path, list[str]]:
    return REPO / "configs" / "bench" / f"{name}.yaml", [*sets, "datasets=[{path: .}]"]


@pytest.mark.parametrize(("name", "sets"), [("llama_1p5b", ("gradient_checkpointing=true",)), ("llama_8b_qlora", ())])
@pytest.mark.parametrize("gib", [80, 141])
def test_auto_recomputes_the_fewest_blocks_within_the_budget(name: str, sets: tuple[str, ...], gib: int) -> None:
    """The budget: the predicted peak on the plain path (no GPU defaults, every block recomputed, bf16 weights as
    Axolotl loads them for bf16 compute), at most 90% of the GPU."""
    path, overrides = _bench(name, *sets)
    plan = prepare(path, overrides, world_size=1, device="cuda", capability=(9, 0), gpu_memory=gib * GIB)
    plain = prepare(path, [*overrides, "bfloat16=true"], world_size=1)  # no GPU defaults, bf16 weights
    budget = min(predict(plain.config, plain.mesh, plain.plugins).peak, int(GPU_SHARE * gib * GIB))
    config, blocks = plan.config, 16 if name == "llama_1p5b" else 32
    fraction = config.gradient_checkpointing_fraction
    recomputed = round(fraction * blocks)
    assert isinstance(fraction, float) and fraction == fraction_of(recomputed, blocks) and recomputed < blocks
    assert predict(config, plan.mesh, plan.plugins).peak <= budget
    if recomputed > 1:
        fewer = with_fraction(config, fraction_of(recomputed - 1, blocks))
        assert predict(fewer, plan.mesh, plan.plugins).peak > budget
    (choice,) = [c for c in fast_defaults.applied(config) if c.key == KEY]
    assert choice.line().startswith(f"{KEY}: {fraction} ({recomputed} of {blocks} blocks recompute; predicted peak ")
    assert f"of the GPU's {gib}.0 GiB" in choice.line()
    assert f"{KEY}: {fraction}" in config.to_yaml(only_present=True)  # the run directory's config.yaml


def test_auto_is_listed_by_check_and_a_cpu_run_recomputes_every_block(tiny_config) -> None:
    path = tiny_config(gradient_checkpointing=True)
    plan = prepare(path, world_size=1, device="cpu")
    assert plan.config.gradient_checkpointing_fraction == 1.0 and not fast_defaults.applied(plan.config)
    shown = describe_plan(prepare(path, world_size=1))
    assert f"  {KEY}: auto (fast default on CUDA; set {KEY}: 1.0 to switch off)" in shown
    written = load_plugins_and_config(tiny_config(gradient_checkpointing=True, **{KEY: "auto"}), [])[1]
    assert Recompute.from_config(written).fraction == 1.0


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ({"gradient_checkpointing": "offload"}, "offload"),
        ({"gradient_checkpointing": True, "fsdp_version": 2}, "sharded run"),
        ({"gradient_checkpointing": True, KEY: 0.5}, None),  # written: kept
        ({}, "gradient_checkpointing is false"),
    ],
)
def test_auto_is_not_the_default_where_it_does_not_apply(tiny_config, keys: dict, why: str | None) -> None:
    if "fsdp_version" in keys:
        pytest.importorskip("ktrain_fsdp")
    config = load_plugins_and_config(tiny_config(**keys), [])[1]
    assert KEY not in {c.key for c in fast_defaults.pending(config)}
    if why is not None:
        assert why in fast_defaults.AUTO_FRACTION.unless(config, (9, 0))


def test_where_the_memory_model_cannot_predict_every_block_recomputes_and_says_why(tiny_config) -> None:
    """A plugin owning a role without answering ``ktrain_collect_memory``, and a GPU whose memory is not known."""
    section = attrs.make_class("ShardKeys", {"my_shard": attrs.field(default=False, metadata={"help": "on"})})
    entry = types.ModuleType("my_sharder")
    entry.ktrain_register_config = hookimpl(lambda register: register(section))
    entry.ktrain_activate = hookimpl(
        lambda config, activate: activate(types.SimpleNamespace(), roles=("sharding",), keys=("my_shard",))
    )
    path = tiny_config(gradient_checkpointing=True, my_shard=True)
    plan = prepare(path, world_size=1, device="cuda", gpu_memory=80 * GIB, extra_plugins=[("my_sharder", entry)])
    assert plan.config.gradient_checkpointing_fraction == 1.0
    (choice,) = [c for c in fast_defaults.applied(plan.config) if c.key == KEY]
    assert "blocks recompute: the memory model does not predict 'my_sharder'" in choice.line()
    if not torch.cuda.is_available():
        plan = prepare(tiny_config(gradient_checkpointing=True), world_size=1, device="cuda")
        (choice,) = [c for c in fast_defaults.applied(plan.config) if c.key == KEY]
        assert plan.config.gradient_checkpointing_fraction == 1.0 and "memory is not known" in choice.line()

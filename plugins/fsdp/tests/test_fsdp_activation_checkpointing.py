"""Selective activation checkpointing by block (``activation_checkpointing_fraction``): the chosen blocks,
spread evenly, run their forward a second time in backward, the others once; with
``activation_checkpointing_scope: mlp`` only the chosen blocks' MLPs run again. The gradients are those of
the model without checkpointing, exactly (fp32 on CPU: recomputation repeats the same operations)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import transformers

import ktrain_fsdp.sharding
from ktrain.builtin.checkpointing import Recompute, apply_checkpointing, recomputed_blocks
from ktrain.config.report import ConfigError
from ktrain.testing import model_dir
from ktrain_fsdp.options import FsdpOptions
from ktrain_fsdp.sharding import recompute


def _options(fraction: float = 1.0, scope: str = "block") -> FsdpOptions:
    return FsdpOptions(
        2,
        activation_checkpointing=True,
        activation_checkpointing_fraction=fraction,
        activation_checkpointing_scope=scope,
    )


SPREADS = [
    (4, 1.0, [0, 1, 2, 3]),
    (4, 0.5, [1, 3]),
    (16, 0.75, [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15]),
    (4, 0.1, [3]),  # at least one block
]


@pytest.mark.parametrize(("count", "fraction", "chosen"), SPREADS)
def test_the_recomputed_blocks_are_spread_evenly(count: int, fraction: float, chosen: list[int]) -> None:
    assert recomputed_blocks(count, fraction) == chosen


def test_half_the_blocks_recompute_and_the_gradients_do_not_change(tmp_path: Path) -> None:
    config = transformers.AutoConfig.from_pretrained(model_dir(tmp_path, num_hidden_layers=4))
    torch.manual_seed(0)
    plain = transformers.AutoModelForCausalLM.from_config(config)
    selective = copy.deepcopy(plain)
    block = type(plain.model.layers[0])
    assert apply_checkpointing(selective, recompute(_options(0.5)), (block,)) == 2
    calls = [0] * 4
    for i, layer in enumerate(selective.model.layers):  # the block inside its checkpoint wrapper, if any
        inner = getattr(layer, "_checkpoint_wrapped_module", layer)
        inner.register_forward_pre_hook(lambda module, args, i=i: calls.__setitem__(i, calls[i] + 1))
    ids = torch.randint(0, config.vocab_size, (2, 24))
    for model in (plain, selective):
        model(input_ids=ids, labels=ids).loss.backward()
    assert calls == [1, 2, 1, 2]  # blocks 1 and 3 ran again in backward
    for (name, a), (_, b) in zip(plain.named_parameters(), selective.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name


def _counted(model: torch.nn.Module, part: str) -> list[int]:
    """Forward calls of each block's ``part`` (``self_attn`` or ``mlp``), through any checkpoint wrapper."""
    calls = [0] * len(model.model.layers)
    for i, layer in enumerate(model.model.layers):
        block = getattr(layer, "_checkpoint_wrapped_module", layer)
        module = getattr(block, part)
        inner = getattr(module, "_checkpoint_wrapped_module", module)
        inner.register_forward_pre_hook(lambda module, args, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


def test_the_mlp_scope_recomputes_only_the_chosen_blocks_mlps(tmp_path: Path) -> None:
    config = transformers.AutoConfig.from_pretrained(model_dir(tmp_path, num_hidden_layers=4))
    torch.manual_seed(0)
    plain = transformers.AutoModelForCausalLM.from_config(config)
    selective = copy.deepcopy(plain)
    assert apply_checkpointing(selective, recompute(_options(0.75, "mlp")), (type(plain.model.layers[0]),)) == 3
    mlp, attention = _counted(selective, "mlp"), _counted(selective, "self_attn")
    ids = torch.randint(0, config.vocab_size, (2, 24))
    for model in (plain, selective):
        model(input_ids=ids, labels=ids).loss.backward()
    assert mlp == [1, 2, 2, 2] and attention == [1, 1, 1, 1]
    for (name, a), (_, b) in zip(plain.named_parameters(), selective.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name
    assert selective.state_dict().keys() == plain.state_dict().keys()  # checkpoints keep the model's names


def test_the_mlp_scope_names_the_key_for_a_block_without_an_mlp() -> None:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ffn = torch.nn.Linear(2, 2)

    with pytest.raises(ConfigError, match=r"activation_checkpointing_scope.*Block has no `mlp`"):
        apply_checkpointing(torch.nn.Sequential(Block(), Block()), recompute(_options(1.0, "mlp")), (Block,))


def test_the_plugin_recomputes_through_the_kernel_alone() -> None:
    """The plugin has no checkpointing of its own: neither checkpoint wrappers nor transformers' switch
    appear in its modules; ``ktrain_fsdp.sharding`` calls the kernel's ``apply_checkpointing``."""
    package = Path(ktrain_fsdp.sharding.__file__).parent
    for path in sorted(package.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        for name in ("checkpoint_wrapper", "torch.utils.checkpoint", "checkpointing_enable", "def recomputed_blocks"):
            assert name not in text, f"{path.name} recomputes by itself ({name}); call ktrain.builtin.checkpointing"
    assert "apply_checkpointing(" in (package / "sharding.py").read_text(encoding="utf-8")


def test_full_recomputation_under_fsdp_and_by_default_recomputes_the_same_blocks(tmp_path: Path) -> None:
    """``fsdp_config.activation_checkpointing: true`` and ``gradient_checkpointing: true`` recompute the same
    blocks: every one, once more in backward, with the same gradients."""
    config = transformers.AutoConfig.from_pretrained(model_dir(tmp_path, num_hidden_layers=3))
    torch.manual_seed(0)
    default = transformers.AutoModelForCausalLM.from_config(config).train()
    fsdp = copy.deepcopy(default)
    assert apply_checkpointing(default, Recompute()) == 3
    assert apply_checkpointing(fsdp, recompute(_options()), (type(default.model.layers[0]),)) == 3
    counts = [_counted(model, "mlp") for model in (default, fsdp)]
    ids = torch.randint(0, config.vocab_size, (2, 24))
    for model in (default, fsdp):
        model(input_ids=ids, labels=ids).loss.backward()
    assert counts[0] == counts[1] == [2, 2, 2]
    for (name, a), (_, b) in zip(default.named_parameters(), fsdp.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name

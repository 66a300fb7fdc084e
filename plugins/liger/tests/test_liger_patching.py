"""Liger on CPU, as far as it goes without running Triton: what is patched, what stops a run, what conflicts.

Patching binds Liger's forwards onto the modules of a real tiny Llama and Qwen3 model (no kernel runs
until a forward, which needs a GPU). liger-kernel also replaces functions of the architecture's module
(``apply_rotary_pos_emb``, the classes) for the whole process, so the fixture restores them.
"""

from __future__ import annotations

import functools
import types
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

from ktrain import hookimpl
from ktrain.cli import main
from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from ktrain.plugins import PluginError
from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain_liger.patch import patch, unsupported

SMALL = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
SMALL_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


@pytest.fixture
def restored():
    """Put back what liger-kernel replaces process-wide in the modules it patches."""
    modules = (modeling_llama, modeling_qwen3, torch.nn.functional)
    saved = [dict(vars(m)) for m in modules]
    yield
    for module, before in zip(modules, saved, strict=True):
        for name in set(vars(module)) - set(before):
            delattr(module, name)
        for name, value in before.items():
            if vars(module).get(name) is not value:
                setattr(module, name, value)


@pytest.mark.parametrize(
    ("config", "norms"),
    [
        (transformers.LlamaConfig(**SMALL, **SMALL_HEADS), 5),  # 2 per block and the final norm
        (transformers.Qwen3Config(**SMALL, **SMALL_HEADS), 9),  # Qwen3 adds q_norm and k_norm per block
    ],
    ids=["llama", "qwen3"],
)
def test_patching_replaces_exactly_the_requested_ops(restored, config, norms: int) -> None:
    model = transformers.AutoModelForCausalLM.from_config(config)
    modeling = modeling_llama if config.model_type == "llama" else modeling_qwen3
    rope, cross_entropy, forward = modeling.apply_rotary_pos_emb, torch.nn.functional.cross_entropy, model.forward
    done = patch(model, {"rms_norm", "swiglu", "fused_linear_cross_entropy"})
    assert done == {
        "rms_norm": f"{norms} LigerRMSNorm",
        "swiglu": "2 LigerSwiGLUMLP",
        "fused_linear_cross_entropy": "function",
    }
    names = {name: m._get_name() for name, m in model.named_modules()}
    assert sum(n == "LigerRMSNorm" for n in names.values()) == norms
    assert names["model.layers.0.mlp"] == names["model.layers.1.mlp"] == "LigerSwiGLUMLP"
    assert model.forward.__func__ is not forward.__func__  # the fused loss forward, bound to this model
    assert model.forward.__func__.__module__.startswith("liger_kernel")
    # not asked for: left alone
    assert modeling.apply_rotary_pos_emb is rope
    assert torch.nn.functional.cross_entropy is cross_entropy
    assert names["model.layers.0.self_attn"] == type(model.model.layers[0].self_attn).__name__
    assert names["model.embed_tokens"] == "Embedding"


def test_chunk_mem_const_reaches_liger_s_fused_loss(restored, monkeypatch) -> None:
    """``liger_flce_chunk_mem_const`` travels from the model's call through Liger's patched forward into its
    fused loss. The decoder runs on CPU (only the loss is patched); the loss itself, a Triton kernel, is
    replaced by a recorder that stops the forward there."""
    from liger_kernel.transformers import functional

    from ktrain_liger.runtime import Liger

    fused = functional.liger_fused_linear_cross_entropy
    seen: dict[str, object] = {}

    @functools.wraps(fused)  # Liger passes on only the keywords the loss's signature names
    def recorder(*args, **kwargs):
        seen.update(kwargs)
        raise StopIteration

    monkeypatch.setattr(functional, "liger_fused_linear_cross_entropy", recorder)
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL, **SMALL_HEADS))
    config = types.SimpleNamespace(liger_flce_chunk_mem_const=4)
    Liger(config, {"liger_fused_linear_cross_entropy": "fused_linear_cross_entropy"}).ktrain_wrap_model(
        model, types.SimpleNamespace(is_main=False)
    )
    ids = torch.randint(0, 100, (2, 8))
    with pytest.raises(StopIteration):
        model(input_ids=ids, labels=ids)
    assert seen["chunk_mem_const"] == 4


def test_rope_and_cross_entropy_replace_functions(restored) -> None:
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL, **SMALL_HEADS))
    rope = modeling_llama.apply_rotary_pos_emb
    assert patch(model, {"rope", "cross_entropy"}) == {"rope": "function", "cross_entropy": "function"}
    assert modeling_llama.apply_rotary_pos_emb is not rope
    assert torch.nn.functional.cross_entropy.__module__.startswith("liger_kernel")
    assert all(m._get_name() != "LigerRMSNorm" for m in model.modules())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    model_dir(tmp_path)
    dataset(tmp_path, 40)
    return tmp_path


@pytest.mark.skipif(torch.cuda.is_available(), reason="the ranks of a run here would use CUDA")
def test_a_cpu_run_stops_before_any_rank_starts_naming_the_key(root: Path) -> None:
    config = write_config(root, liger_rms_norm=True, liger_glu_activation=True)
    done = ktrain("run", str(config))
    assert done.returncode == 2, done.stderr
    assert "  - liger_rms_norm: Liger's kernels need a CUDA GPU (enabled by liger_rms_norm, liger_glu_activation)" in (
        done.stderr
    )
    assert "the ranks of this run would use the CPU" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (root / "out").exists()  # refused before the run directory, before any rank


def test_an_architecture_liger_lacks_stops_before_the_model_loads(root: Path) -> None:
    """On the ranks, before the model loads (``ktrain run`` on CPU ranks is refused earlier, by the device)."""
    model_dir(root, model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=64, n_layer=2, n_head=4)
    config = write_config(root, liger_swiglu=True)  # the older spelling of liger_glu_activation
    plan = prepare(config, with_defaults=True)  # the runtime object, as a rank builds it
    liger = next(a.obj for a in plan.plugins.activations if a.plugin.name == "liger")
    with pytest.raises(ConfigError, match="liger_swiglu: liger-kernel has no kernels for model_type 'gpt2'"):
        liger.ktrain_collect_model_kwargs(run=types.SimpleNamespace(device=torch.device("cpu")))


def test_an_op_the_architecture_lacks_is_named() -> None:
    found = unsupported("llama", {"liger_layer_norm": "layer_norm", "liger_rope": "rope"})
    assert list(found) == ["liger_layer_norm"]  # Llama has a rope kernel, no LayerNorm
    assert "no layer_norm kernel for model_type 'llama' (it has: cross_entropy, " in found["liger_layer_norm"]
    assert "gemma" in str(unsupported("gpt2", {"liger_rope": "rope"}))  # the architectures it has


def _check(root: Path, capsys, **keys: object) -> tuple[int, str]:
    path = write_config(root, "check.yaml", **keys)
    code = main(["check", str(path)])
    out = capsys.readouterr()
    return code, out.err + out.out


def test_check_passes_on_cpu_and_names_conflicting_keys(root: Path, capsys) -> None:
    code, out = _check(root, capsys, liger_rope=True, liger_rms_norm=True, liger_fused_linear_cross_entropy=True)
    assert code == 0, out
    assert "warning: liger_rope: Liger's kernels need a CUDA GPU" in out  # check may run anywhere: a note
    assert "op:rope, op:rms_norm, op:fused_linear_cross_entropy: 'liger' (ktrain-plugin-liger" in out
    code, out = _check(root, capsys, liger_cross_entropy=True, liger_fused_linear_cross_entropy=True)
    assert code == 2 and "liger_cross_entropy: liger_fused_linear_cross_entropy already computes the loss" in out
    code, out = _check(root, capsys, liger_swiglu=False, liger_glu_activation=True)
    assert code == 2 and "liger_swiglu: contradicts liger_glu_activation" in out
    code, out = _check(root, capsys, liger_rms_norm="yes")
    assert code == 2 and "liger_rms_norm: expected a boolean" in out
    code, out = _check(root, capsys, liger_rms_norm=True, liger_flce_chunk_mem_const=4)
    assert code == 2 and "liger_flce_chunk_mem_const: sizes liger_fused_linear_cross_entropy's chunks" in out
    code, out = _check(root, capsys, liger_fused_linear_cross_entropy=True, liger_flce_chunk_mem_const=0)
    assert code == 2 and "liger_flce_chunk_mem_const: must be a whole number of at least 1" in out


def test_two_plugins_patching_one_op_stop_naming_both(root: Path) -> None:
    class OtherNorm:
        @hookimpl
        def ktrain_wrap_model(self, model, run):
            return None

    def ktrain_activate(config, activate):
        activate(OtherNorm(), roles=("op:rms_norm",), keys=("base_model",))

    other = types.ModuleType("other_norm")
    other.ktrain_activate = hookimpl(ktrain_activate)
    path = write_config(root, "conflict.yaml", liger_rms_norm=True)
    with pytest.raises(PluginError) as caught:
        prepare(path, extra_plugins=[("other_norm", other)])
    message = str(caught.value)
    assert "two plugins claim the role 'op:rms_norm'" in message
    assert "'liger' (ktrain-plugin-liger" in message and "enabled by: liger_rms_norm" in message
    assert "'other_norm'" in message
    assert yaml.safe_load(path.read_text())["liger_rms_norm"] is True

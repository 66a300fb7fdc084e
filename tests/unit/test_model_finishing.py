"""Axolotl's model keys applied as the kernel builds and readies the model: ``model_config`` changes the
model's config, ``unfrozen_parameters`` leaves only the matching parameters trainable (a period literal,
matched from the name's start), ``resize_token_embeddings_to_32x`` grows the embeddings to a multiple of 32;
bad patterns, an adapter beside them and a config setting the model lacks stop the run naming the key. The
model loader, which the launcher imports too, imports transformers' quantizers only to build a quantization config."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch
import transformers

from ktrain.builtin.freezing import freeze_except
from ktrain.builtin.hf_model import build_model, finish_model
from ktrain.config.plan import load_plugins_and_config, prepare
from ktrain.config.report import ConfigError
from ktrain.testing import model_dir


def _ready(tiny_config, **keys: object) -> torch.nn.Module:
    config = load_plugins_and_config(tiny_config(**{"random_init_weights": True, **keys}), [])[1]
    tokenizer = transformers.AutoTokenizer.from_pretrained(config.base_model)
    run = types.SimpleNamespace(tokenizer=tokenizer, device=torch.device("cpu"))
    return finish_model(build_model(config, run, {}), config, run)


def test_unfrozen_parameters_and_embeddings_to_32x(tiny_config) -> None:
    model = _ready(
        tiny_config, unfrozen_parameters=["model.layers.1.mlp", "^lm_head"], resize_token_embeddings_to_32x=True
    )
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained == {n for n, _ in model.named_parameters() if n.startswith(("model.layers.1.mlp.", "lm_head."))}
    assert model.get_input_embeddings().num_embeddings == 128  # the tokenizer's 100 tokens, rounded up
    with pytest.raises(ValueError, match="no parameter of the model matches"):
        freeze_except(model, ["model_layers"])  # the period is literal: model_layers is not model.layers


def test_bad_patterns_and_an_adapter_are_refused(tiny_config) -> None:
    with pytest.raises(ConfigError) as e:
        prepare(tiny_config(unfrozen_parameters=["^model.embed_tokens.weight$[:32000]", "(unclosed"]))
    assert "unfrozen_parameters[0]: '^model.embed_tokens.weight$[:32000]': index ranges are not supported" in str(
        e.value
    )
    assert "unfrozen_parameters[1]: '(unclosed' is not a regular expression" in str(e.value)
    with pytest.raises(ConfigError, match="unfrozen_parameters: the adapter chooses what trains"):
        prepare(tiny_config(unfrozen_parameters=["lm_head"], adapter="lora", lora_target_linear=True))


def test_model_config_changes_the_config_the_model_is_built_with(tmp_path, tiny_config) -> None:
    weights = model_dir(tmp_path, weights=True)
    for random_init in (True, False):
        model = _ready(
            tiny_config, base_model=str(weights), random_init_weights=random_init, model_config={"rms_norm_eps": 0.25}
        )
        assert model.config.rms_norm_eps == 0.25 and model.model.norm.variance_epsilon == 0.25, random_init
    with pytest.raises(
        ConfigError, match=r"model_config.output_router_logit: the model's config \(LlamaConfig\) has no"
    ):
        _ready(tiny_config, model_config={"output_router_logit": True})


def test_revision_of_model_is_read_and_has_nothing_to_choose_in_a_local_folder(tiny_config) -> None:
    plan = prepare(tiny_config(revision_of_model="6299b5a"))
    assert plan.config.revision_of_model == "6299b5a"
    notes = {str(p.path): p.message for p in plan.warnings}
    assert notes["revision_of_model"] == "base_model is a local folder, which has no revisions: not used"


def test_the_model_loader_imports_no_quantization_library_until_a_quantization_config_is_built() -> None:
    """The launcher imports the kernel's model loader with the built-in hooks on every run. transformers'
    quantizers import each installed quantization library: torchao, and torch._dynamo with it, about a second
    of CPU before the first rank starts, and torchao's messages about its CUDA kernels on a CPU build."""
    script = (
        "import sys, ktrain.builtin.hf_model; "
        "print([m for m in ('transformers.quantizers', 'torchao') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout

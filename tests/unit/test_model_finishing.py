"""Axolotl's model keys applied as the kernel readies the model: ``unfrozen_parameters`` leaves only the
matching parameters trainable (a period literal, matched from the name's start), ``resize_token_embeddings_to_32x``
grows the embeddings to a multiple of 32; bad patterns and an adapter beside them stop the check."""

from __future__ import annotations

import types

import pytest
import torch
import transformers

from ktrain.builtin.freezing import freeze_except
from ktrain.builtin.hf_model import build_model, finish_model
from ktrain.config.plan import load_plugins_and_config, prepare
from ktrain.config.report import ConfigError


def _ready(tiny_config, **keys: object) -> torch.nn.Module:
    config = load_plugins_and_config(tiny_config(random_init_weights=True, **keys), [])[1]
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

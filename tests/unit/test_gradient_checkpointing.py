"""``gradient_checkpointing``: true recomputes every block in backward, ``offload`` also keeps each block's
saved input in host memory until backward (on a GPU; on a CPU it runs as true); neither changes a gradient
(fp32 on CPU: the recomputation repeats the same operations). The memory ``offload`` saves shows on a GPU."""

from __future__ import annotations

import copy
import inspect
import warnings
from pathlib import Path

import pytest
import torch
import transformers

from ktrain.builtin.checkpointing import Recompute, apply_checkpointing
from ktrain.config.plan import load_plugins_and_config
from ktrain.testing import model_dir


def _config(tiny_config, setting: object) -> object:
    return load_plugins_and_config(tiny_config(gradient_checkpointing=setting), [])[1]


def _step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    """Forward and backward; the number of times each block's MLP ran, and the gradients."""
    calls = [0] * len(model.model.layers)
    hooks = [
        layer.mlp.register_forward_pre_hook(lambda module, args, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, layer in enumerate(model.model.layers)
    ]
    model(input_ids=ids, labels=ids).loss.backward()
    for hook in hooks:
        hook.remove()
    return calls, [p.grad for p in model.parameters()]


def test_recomputed_and_offloaded_blocks_give_the_same_gradients(tmp_path: Path, tiny_config) -> None:
    config = transformers.AutoConfig.from_pretrained(model_dir(tmp_path, num_hidden_layers=3))
    torch.manual_seed(0)
    plain = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    once, want = _step(plain, ids)
    assert once == [1, 1, 1]
    for setting in (True, "offload"):
        model = copy.deepcopy(plain)
        model.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # transformers here takes offload: no fallback, no deprecation
            apply_checkpointing(model, Recompute.from_config(_config(tiny_config, setting)))
        model.train()
        calls, got = _step(model, ids)
        assert calls == [2, 2, 2], setting  # every block ran again in backward
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True)), setting


@pytest.mark.gpu
def test_offload_holds_less_on_the_gpu(tmp_path: Path, tiny_config) -> None:
    """On a GPU, 8 blocks at 2048 tokens: the peak with ``offload`` is below the peak with ``true``.

    Needs a transformers whose ``activation_checkpointing_enable`` takes ``offload`` (5.24 does; the
    device image's 5.17 does not, and there ``offload`` recomputes without offloading, with a warning).
    """
    enable = getattr(transformers.PreTrainedModel, "activation_checkpointing_enable", None)
    if enable is None or "offload" not in inspect.signature(enable).parameters:
        pytest.skip(f"transformers {transformers.__version__} cannot offload checkpointed inputs (5.24 can)")
    config = transformers.AutoConfig.from_pretrained(
        model_dir(tmp_path, num_hidden_layers=8, hidden_size=512, intermediate_size=1024, max_position_embeddings=2048)
    )
    ids = torch.randint(0, config.vocab_size, (4, 2048), device="cuda")
    peaks = {}
    for setting in (True, "offload"):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).cuda().train()
        apply_checkpointing(model, Recompute.from_config(_config(tiny_config, setting)))
        torch.cuda.reset_peak_memory_stats()
        model(input_ids=ids, labels=ids).loss.backward()
        peaks[setting] = torch.cuda.max_memory_allocated()
        del model
        torch.cuda.empty_cache()
    assert peaks["offload"] < peaks[True], peaks

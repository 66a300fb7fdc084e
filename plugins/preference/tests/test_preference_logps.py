"""The chunked log-probability head gives the log-probabilities of the full logits, and their gradients, within 1e-5,
computing only the scored positions, a few at a time; through a trained output layer (the logits recomputed in
the backward) and a frozen one (each token's gradient found in the forward)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ktrain.data.formats import IGNORE
from ktrain.testing import model_dir
from ktrain_preference import logps


@pytest.mark.parametrize(
    ("frozen_head", "kept"),
    [(False, True), (False, False), (True, False)],
    ids=["trained-head-gradients-kept", "trained-head-logits-recomputed", "frozen-head"],
)
def test_chunked_head_matches_the_full_logits_in_values_and_gradients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frozen_head: bool, kept: bool
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir(tmp_path, weights=True), dtype=torch.float32)
    model.get_output_embeddings().weight.requires_grad_(not frozen_head)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[2, 9:] = 0  # a padded row
    targets = ids.masked_fill(mask == 0, IGNORE)
    targets[:, :5] = IGNORE  # the prompts
    inputs = {"input_ids": ids, "attention_mask": mask, "use_cache": False}
    at = logps.shifted(targets)
    assert at.shape == (3, 7 + 7 + 4) and torch.equal(at[2], targets[:, 1:][targets[:, 1:] != IGNORE])
    weights = torch.randn(at.shape[1], generator=generator)  # a loss that weighs every token differently

    def run(head: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        values = logps.token_logps(model, inputs, at, head)
        expected = "FrozenHeadLogpsBackward" if frozen_head else "TrainedHeadLogpsBackward"
        assert (type(values.grad_fn).__name__ == expected) == head
        if head and not frozen_head:  # hidden, weight, targets, norms, the hidden states' slopes (+ 5 chunks')
            assert len(values.grad_fn.saved_tensors) == (5 + 5 if kept else 5)
        (values * weights).sum().backward()
        return values.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    full, full_grads = run(head=False)
    assert len(full_grads) == len(list(model.parameters())) - frozen_head
    monkeypatch.setattr(logps, "CHUNK_ELEMENTS", 4 * model.config.vocab_size)  # 4 rows a chunk: 5 chunks here
    monkeypatch.setattr(logps, "KEPT_ELEMENTS", 18 * model.config.vocab_size if kept else 17 * model.config.vocab_size)
    assert logps.add_logps_head(model)
    chunked, chunked_grads = run(head=True)
    torch.testing.assert_close(chunked, full, rtol=0, atol=1e-5)
    for a, b in zip(chunked_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert model(**inputs).logits.shape == (3, 12, model.config.vocab_size)  # without targets: the usual forward


@pytest.mark.gpu
@pytest.mark.parametrize("frozen_head", [False, True], ids=["trained-head", "frozen-head"])
def test_the_compiled_head_on_a_gpu_gives_the_eager_values_and_gradients(
    monkeypatch: pytest.MonkeyPatch, frozen_head: bool
) -> None:
    """On CUDA the work over a chunk's logits is compiled; in bf16 it gives what the eager functions give."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    tokens, width, vocab = 3000, 256, 50000
    options = {"device": "cuda", "dtype": torch.bfloat16, "generator": generator}
    hidden = torch.randn(1, tokens, width, **options).requires_grad_()
    weight = (torch.randn(vocab, width, **options) * 0.05).requires_grad_(not frozen_head)
    targets = torch.randint(0, vocab, (tokens,), device="cuda", generator=generator)
    at = torch.stack([torch.zeros_like(targets), torch.arange(tokens, device="cuda"), targets])
    incoming = torch.randn(tokens, device="cuda", generator=generator)

    def run() -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        values = logps.chunked(hidden, weight, at, rows=1024)
        return values, torch.autograd.grad((values * incoming).sum(), [hidden] if frozen_head else [hidden, weight])

    compiled, compiled_grads = run()
    monkeypatch.setattr(logps, "_on", lambda logits, function: function)
    eager, eager_grads = run()
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-4)
    for a, b in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=1e-3)

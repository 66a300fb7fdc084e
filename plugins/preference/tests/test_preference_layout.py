"""A pair's prompt computed once for both answers gives each answer the log-probabilities (and gradients) of the
two-row layout, in every attention form the shared layout is built for; where it cannot be built, the two-row
layout is kept."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ktrain.data.examples import Example
from ktrain.testing.assets import TINY_LLAMA
from ktrain_preference import layout
from ktrain_preference.logps import add_logps_head, token_logps
from ktrain_preference.objective import PairObjective, answer_sums, model_inputs
from ktrain_preference.pairs import pair_sample

# The preference keys of a DPO config, as PairObjective reads them.
KEYS = {"rl": "dpo", "rl_beta": 0.1, "orpo_alpha": None, "simpo_gamma": 0.5, "cpo_alpha": 1.0, "dpo_label_smoothing": 0}


def tiny(model_type: str, attention: str) -> Any:
    """A tiny random-weight model of ``model_type`` (the test Llama's shape) with ``attention``, fp32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {k: v for k, v in TINY_LLAMA.items() if k not in ("architectures", "model_type", "torch_dtype")}
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **shape)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)


def samples(vocab: int) -> list[Example]:
    """Three pairs: prompts of 5, 3 and 7 tokens, answers of unequal lengths (one pair's answers start alike)."""
    generator = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=generator).tolist()

    out = []
    for prompt, chosen, rejected in ((5, 4, 6), (3, 7, 2), (7, 3, 3)):
        p, c, r = ids(prompt), ids(chosen), ids(rejected)
        if prompt == 7:
            r[0] = c[0]
        sample = pair_sample(p, p + c, p + r, limit=32)
        out.append(Example(sample["input_ids"], sample["labels"]))
    return out


def logps_and_grads(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    sums = answer_sums(token_logps(model, model_inputs(batch), batch["logps_at"], True), batch)
    (sums * torch.linspace(0.5, 1.5, len(sums))).sum().backward()
    return sums.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("model_type", "attention"), [("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa"), ("qwen3", "sdpa")]
)
def test_shared_prompt_gives_the_two_row_answers_log_probabilities(model_type: str, attention: str) -> None:
    model = tiny(model_type, attention)
    assert add_logps_head(model)
    assert layout.shared_attention(model) == attention
    pairs = samples(model.config.vocab_size)
    shared = layout.shared_rows(pairs, 0, attention, whole_chosen=True, device=None)
    two = layout.two_rows(pairs, 0, None, whole_chosen=True)
    assert shared is not None and shared["input_ids"].shape == (3, 5 + 4 + 6) and two["input_ids"].shape == (6, 11)
    assert torch.equal(shared["answer_tokens"], two["answer_tokens"])  # per pair: chosen, rejected, chosen's prompt
    assert shared["answer_tokens"].tolist() == [4, 7, 3, 6, 2, 3, 4, 2, 6]
    got, got_grads = logps_and_grads(model, shared)
    want, want_grads = logps_and_grads(model, two)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_flex_block_mask_allows_what_the_sdpa_mask_allows() -> None:
    """FlexAttention gets the same attention as SDPA (its forward on a CPU is too slow for a unit test: the
    mask's function is compared with SDPA's boolean mask, position by position)."""
    from torch.nn.attention.flex_attention import create_mask

    pairs = samples(64)
    dense = layout.shared_rows(pairs, 0, "sdpa", False, None)["attention_mask"]
    block = layout.shared_rows(pairs, 0, "flex_attention", False, None)["attention_mask"]
    rows, _, length, _ = dense.shape
    assert torch.equal(create_mask(block.mask_mod, rows, 1, length, length, device="cpu"), dense)
    assert dense[0, 0, 9:, 5:9].sum() == 0 and dense[0, 0, 9:, :5].all()  # rejected sees the prompt, not chosen


def test_two_rows_where_the_prompts_differ_the_shapes_are_fixed_or_the_attention_takes_no_mask() -> None:
    model = tiny("llama", "sdpa")
    pairs = samples(model.config.vocab_size)
    ids, labels = list(pairs[1].input_ids), list(pairs[1].labels)
    ids[len(ids) - 3] += 1  # the rejected sequence's prompt (3 tokens, then 2 answer tokens) differs
    assert layout.shared_rows([pairs[0], Example(ids, labels)], 0, "sdpa", False, None) is None
    objective = PairObjective(SimpleNamespace(**KEYS), None, "cpu", True, "sdpa")
    assert objective.collate([[p] for p in pairs], 0, None, None, None)["input_ids"].shape == (3, 15)
    assert objective.collate([[p] for p in pairs], 0, 32, None, None)["input_ids"].shape == (6, 32)  # pad_to
    model.config._attn_implementation = "flash_attention_2"
    assert layout.shared_attention(model) is None
    windowed = tiny("qwen2", "sdpa")
    windowed.config.layer_types = ["sliding_attention", "full_attention"]
    assert layout.shared_attention(windowed) is None

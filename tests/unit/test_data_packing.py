"""Packing: the bins, and parity: a packed row's summed loss (and gradient) equals its samples' run one by one."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from ktrain.data import packing
from ktrain.data.batches import collate, document_mask, row_trained
from ktrain.data.examples import Example
from ktrain.data.formats import IGNORE
from ktrain.testing import model_dir

LENGTH = 96


@pytest.mark.parametrize("method", sorted(packing.METHODS))
def test_every_sample_lands_once_within_capacity_and_deterministically(method: str) -> None:
    rng = random.Random(0)
    lengths = np.array([rng.randint(1, 512) for _ in range(3000)])
    rows = packing.pack(lengths, 512, method, seed=3)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert max(int(lengths[row].sum()) for row in rows) <= 512
    assert rows == packing.pack(lengths, 512, method, seed=3)
    lower_bound = -(-int(lengths.sum()) // 512)
    assert len(rows) <= lower_bound * 1.02, (len(rows), lower_bound)  # both are near-optimal on such lengths
    with pytest.raises(ValueError, match="sample 1 has 600 tokens, more than a row of 512"):
        packing.pack(np.array([3, 600]), 512, method, seed=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_dir(tmp_path_factory.mktemp("packing"), max_position_embeddings=256)


def _model(path: Path, attention: str) -> Any:
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)
    model.config.use_cache = False
    return model


def _samples(path: Path) -> list[Example]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    texts = ["What is 12+30? It is 42.", "Hello", "a b c d e f g h i j k l m n o p", "xyz!", "The end of it all."]
    out = []
    for n, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        labels = [IGNORE] * 3 + ids[3:] if n % 2 else list(ids)  # some samples with a masked prompt
        out.append(Example(ids, labels))
    return out


def _loss_and_grads(model: Any, batch: dict[str, Any], grads: bool) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad()
    loss = model(**batch, num_items_in_batch=torch.tensor(1.0)).loss  # a sum over the trained tokens
    if not grads:
        return float(loss), []
    loss.backward()
    return float(loss), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_row_loss_equals_its_samples_one_by_one(attention: str, tiny: Path) -> None:
    """fp32, relative tolerance 1e-5 on the loss and 1e-4 on the gradients (only summation orders differ).

    The samples run one by one through SDPA, with the same weights."""
    model = _model(tiny, attention)
    reference = _model(tiny, "sdpa")
    samples = _samples(tiny)
    rows = [samples[:3], samples[3:]]  # two packed rows in one micro-batch, padded to LENGTH
    alone = [_loss_and_grads(reference, collate([[e]], pad_id=0), True) for e in samples]
    packed_loss, packed_grads = _loss_and_grads(model, collate(rows, 0, LENGTH, attention), True)
    assert packed_loss == pytest.approx(sum(loss for loss, _ in alone), rel=1e-5)
    assert sum(row_trained(r) for r in rows) == sum(e.trained_tokens for e in samples)
    for n, grad in enumerate(packed_grads):
        assert torch.allclose(grad, sum(g[n] for _, g in alone), rtol=1e-4, atol=1e-6), n
    leaky = collate(rows, 0, LENGTH, attention)  # without isolation the same row gives another loss
    leaky.pop("attention_mask")
    leaky["position_ids"] = torch.arange(LENGTH).expand(2, -1)
    with torch.no_grad():
        assert _loss_and_grads(model, leaky, False)[0] != pytest.approx(packed_loss, rel=1e-3)


def test_flex_attention_block_mask_allows_what_the_sdpa_mask_allows(tiny: Path) -> None:
    """FlexAttention's document ``BlockMask``, evaluated at every (query, key), is SDPA's boolean mask (the
    FlexAttention kernel itself runs on a GPU: the test below)."""
    from torch.nn.attention.flex_attention import create_mask

    samples = _samples(tiny)
    rows = [samples[:3], samples[3:]]
    block_mask = collate(rows, 0, LENGTH, "flex_attention")["attention_mask"]
    dense = create_mask(block_mask.mask_mod, len(rows), 1, LENGTH, LENGTH, device="cpu")
    assert torch.equal(dense, collate(rows, 0, LENGTH, "sdpa")["attention_mask"])


@pytest.mark.parametrize(("length", "prefix"), [(96, None), (300, None), (300, 1), (1536, 1)])
def test_the_document_block_mask_has_create_block_masks_tiles(length: int, prefix: int | None) -> None:
    """The ``BlockMask`` built from the boolean mask's tiles is the one ``create_block_mask`` builds by evaluating the
    mask position by position: the same partial and full tiles, in the same order, for queries and for keys
    (lengths that are and are not a multiple of 128; documents, and documents that also see a shared prefix);
    every index tensor contiguous, as FlexAttention's FLASH backend takes them."""
    from torch.nn.attention.flex_attention import create_block_mask

    documents = torch.randint(0, 4, (3, length), generator=torch.Generator().manual_seed(length)).sort(-1).values

    def same_document(b: Any, h: Any, q: Any, k: Any) -> Any:
        seen = documents[b, q] == documents[b, k]
        if prefix is not None:
            seen = seen | ((documents[b, k] == prefix) & (documents[b, q] > prefix))
        return seen & (q >= k)

    expected = create_block_mask(same_document, 3, None, length, length, device="cpu").as_tuple()
    built = document_mask(documents, "flex_attention", prefix=prefix).as_tuple()
    tensors = [(a, b) for a, b in zip(built, expected, strict=True) if isinstance(b, torch.Tensor)]
    assert len(tensors) == 8  # kv and q: partial counts and indices, full counts and indices
    for a, b in tensors:
        assert torch.equal(a, b) and a.is_contiguous()
    assert built[:2] == expected[:2]  # the sequence lengths


@pytest.mark.gpu
def test_flex_attention_packed_row_matches_samples_one_by_one(tiny: Path) -> None:
    """On a GPU: a packed row through FlexAttention gives its samples' summed loss, in bf16 (the dtype it trains in),
    relative tolerance 2e-2. The rows are 128 positions long: below 128 queries inductor lowers FlexAttention to its
    decoding kernel, which had no kernel choice for the tiny model's head dimension on an H100 (torch 2.11)."""
    model = _model(tiny, "flex_attention").to("cuda", torch.bfloat16)
    reference = _model(tiny, "sdpa").to("cuda", torch.bfloat16)
    samples = _samples(tiny)
    rows = [samples[:3], samples[3:]]

    def on_gpu(batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    with torch.no_grad():
        alone = [_loss_and_grads(reference, on_gpu(collate([[e]], pad_id=0)), False)[0] for e in samples]
        batch = on_gpu(collate(rows, 0, 128, "flex_attention", mask_device=torch.device("cuda")))
        packed = _loss_and_grads(model, batch, False)[0]
    assert packed == pytest.approx(sum(alone), rel=2e-2)


def test_packed_batch_layout(tiny: Path) -> None:
    a, b = Example([5, 6, 7], [5, 6, 7]), Example([8, 9], [IGNORE, 9])
    batch = collate([[a, b]], pad_id=0, pad_to=7, packed_attention="sdpa")
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 6, 7, IGNORE, 9, IGNORE, IGNORE]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1]]
    mask = batch["attention_mask"][0, 0].int().tolist()
    assert mask[4] == [0, 0, 0, 1, 1, 0, 0] and mask[2] == [1, 1, 1, 0, 0, 0, 0]
    flash = collate([[a, b]], pad_id=0, pad_to=7, packed_attention="flash_attention_2")
    assert "attention_mask" not in flash  # the varlen kernels read the samples from position_ids


@pytest.mark.gpu
def test_flash_varlen_packed_row_matches_samples_one_by_one(tiny: Path) -> None:
    """On a GPU with flash-attn: packed rows through the varlen kernels, bf16, relative tolerance 2e-2."""
    pytest.importorskip("flash_attn")
    model = _model(tiny, "flash_attention_2").to("cuda", torch.bfloat16)
    samples = _samples(tiny)
    with torch.no_grad():
        alone = []
        for e in samples:
            batch = {k: v.cuda() for k, v in collate([[e]], pad_id=0).items()}
            alone.append(float(model(**batch, num_items_in_batch=torch.tensor(1.0)).loss))
        batch = {k: v.cuda() for k, v in collate([samples], 0, None, "flash_attention_2").items()}
        packed = float(model(**batch, num_items_in_batch=torch.tensor(1.0)).loss)
    assert packed == pytest.approx(sum(alone), rel=2e-2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback is for a machine without a GPU")
def test_flex_attention_falls_back_to_sdpa_without_a_gpu(tiny_config) -> None:
    """FlexAttention has no backward on a CPU: a run asking for it trains with SDPA, and says so."""
    from ktrain.builtin.hf_model import attention_implementation
    from ktrain.config.plan import load_plugins_and_config

    _, config = load_plugins_and_config(tiny_config(attn_implementation="flex_attention", sample_packing=True), [])
    with pytest.warns(UserWarning, match="FlexAttention has no backward pass on a CPU; using PyTorch SDPA"):
        assert attention_implementation(config) == "sdpa"

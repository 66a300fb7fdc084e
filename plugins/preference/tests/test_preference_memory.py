"""The memory model of a preference run: both answers in one forward, the reference copy, chunked logits."""

from __future__ import annotations

from pathlib import Path

from ktrain.config.plan import prepare
from ktrain.memory.model import predict

BENCH = Path(__file__).resolve().parents[3] / "configs" / "bench"


def _predict(name: str, *sets: str):
    plan = prepare(BENCH / f"{name}.yaml", list(sets), world_size=1, device="cuda", capability=(9, 0))
    return predict(plan.config, plan.mesh, plan.plugins)


def test_dpo_holds_a_reference_copy_and_both_answers() -> None:
    """DPO's copy of the bf16 weights; its trained output layer keeps up to 2**29 logits' gradients beside one
    chunk of 2**28 logits (bf16: 2 bytes an element; fp32 compute: 4); ORPO no copy. Under LoRA the frozen output
    layer holds one chunk's logits and their gradient."""
    dpo, orpo = _predict("llama_1p5b_dpo"), _predict("llama_1p5b_dpo", "rl=orpo")
    assert dpo.not_modelled == ()
    assert dpo.states.parameters == 2 * orpo.states.parameters
    assert dpo.logits == 2 * (2**28 + 2**29)
    fp32 = _predict("llama_1p5b_dpo", "bf16=false", "bfloat16=false", "optimizer=adamw_torch_fused")
    assert fp32.logits == 4 * (2**28 + 2**29)
    assert _predict("llama_1p5b_dpo_lora").logits == 2 * 2 * 2**28

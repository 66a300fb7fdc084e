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
    """DPO's copy of the bf16 weights and one chunk of logits (bf16: the logits and their gradient, 2 + 2 bytes an
    element; fp32 compute: 4 + 4); ORPO no copy."""
    dpo, orpo = _predict("llama_1p5b_dpo"), _predict("llama_1p5b_dpo", "rl=orpo")
    assert dpo.not_modelled == ()
    assert dpo.states.parameters == 2 * orpo.states.parameters
    assert dpo.logits == 4 * 2**28
    fp32 = _predict("llama_1p5b_dpo", "bf16=false", "bfloat16=false", "optimizer=adamw_torch_fused")
    assert fp32.logits == 8 * 2**28

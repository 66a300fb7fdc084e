"""The memory model of float8 layers: tensorwise (and delayed) keep the MLP's input and product in a byte an element."""

from __future__ import annotations

from pathlib import Path

from ktrain.config.plan import prepare
from ktrain.memory.model import predict

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "bench" / "llama_1p5b_fp8_master.yaml"


def _saved(*sets: str) -> int:
    plan = prepare(CONFIG, ["datasets=[{path: .}]", *sets], world_size=1, device="cuda", capability=(9, 0))
    return predict(plan.config, plan.mesh, plan.plugins).activations.saved


def test_tensorwise_keeps_float8_inputs() -> None:
    """Against rowwise (bf16 inputs kept), tensorwise saves a byte a token of the MLP's input and product."""
    tokens, layers, hidden, intermediate = 4 * 4096, 16, 2048, 8192
    assert _saved("fp8_recipe=rowwise") - _saved() == tokens * layers * (hidden + intermediate)
    assert _saved("fp8_recipe=rowwise") == _saved("fp8=false")
    assert _saved("fp8_recipe=delayed") == _saved()  # one scale a tensor too: the same float8 inputs kept

"""Liger's rope, RMSNorm and SwiGLU as the GPU default where the blocks are not compiled (a quantized base).

In process: the plan is made as ``ktrain run`` makes it on a GPU (``device="cuda"``), no GPU needed; the
tiny Llama's config.json is all that is read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ktrain.commands.describe import describe_plan
from ktrain.config import fast_defaults
from ktrain.config.plan import prepare
from ktrain.testing import dataset, model_dir, write_config
from ktrain_liger.keys import SUPPORTED
from ktrain_liger.patch import supported_ops

KERNELS = ["liger_rope", "liger_rms_norm", "liger_glu_activation"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("defaults")
    model_dir(root)
    dataset(root, 8)
    return root


def _liger(root: Path, device: str | None = "cuda", **keys: object) -> list[str]:
    """The Liger keys a run of the config takes from its GPU defaults."""
    config = prepare(write_config(root, bf16=True, **keys), world_size=1, device=device, capability=(9, 0)).config
    return [c.key for c in fast_defaults.applied(config) if c.key.startswith("liger_")]


def test_a_quantized_base_gets_liger_s_block_kernels_on_a_gpu(root: Path) -> None:
    plan = prepare(write_config(root, adapter="qlora", bf16=True), world_size=1, device="cuda", capability=(9, 0))
    assert [c.key for c in fast_defaults.applied(plan.config) if c.key.startswith("liger_")] == KERNELS
    assert "liger" in {a.plugin.name for a in plan.plugins.activations}
    assert "liger_rope: true" in plan.config.to_yaml(only_present=True)  # written for the ranks
    shown = describe_plan(prepare(write_config(root, adapter="qlora", bf16=True), world_size=1))  # ktrain check
    for name in KERNELS:
        assert f"  {name}: on (fast default on CUDA; set {name}: false to switch off)" in shown
    assert _liger(root, device="cpu", adapter="qlora") == []


@pytest.mark.parametrize(
    ("keys", "taken"),
    [
        ({}, []),  # compiled blocks are the default: they fuse the same work
        ({"torch_compile": False}, KERNELS),
        ({"adapter": "qlora", "torch_compile": True}, []),
        ({"adapter": "qlora", "liger_rope": False}, KERNELS[1:]),
        ({"adapter": "qlora", "liger_swiglu": False}, KERNELS[:2]),  # the older spelling of liger_glu_activation
        ({"liger_rms_norm": True}, [KERNELS[0], KERNELS[2]]),  # and no compiled blocks
    ],
)
def test_the_kernels_are_a_default_only_where_the_blocks_are_not_compiled(
    root: Path, keys: dict, taken: list[str]
) -> None:
    assert _liger(root, **keys) == taken


def test_liger_kernel_has_the_three_kernels_for_every_architecture_named() -> None:
    for kind in SUPPORTED:
        assert {"rope", "rms_norm", "swiglu"} <= supported_ops(kind), kind

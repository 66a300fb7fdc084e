"""ktrain-plugin-flash-attention on CPU: where FlashAttention-4 is a GPU default, and the refusals before launch.

The GPU defaults are resolved as ``ktrain run`` resolves them on a GPU (``device="cuda"`` and a compute
capability), no GPU needed. Whether flash-attn-4 is installed is read from where Python would import
``flash_attn.cute`` from, without importing it: the tests that need it found put a folder holding
``flash_attn/cute/interface.py`` first on ``sys.path``; the CPU machine itself has no flash-attn-4.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.attention

from ktrain.config import fast_defaults
from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from ktrain.testing import dataset, ktrain, launch_problems, model_dir, write_config
from ktrain_flash_attention.keys import installed
from ktrain_flash_attention.runtime import prefer_flash

KEY = "flash_attention_4"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fa4")
    model_dir(root)
    dataset(root, 8)
    return root


@pytest.fixture
def found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``flash_attn.cute`` where Python looks first (its interface module's file; nothing imports it)."""
    cute = tmp_path / "site" / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute.parent / "__init__.py").write_text("")
    (cute / "interface.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def _taken(
    root: Path, capability: tuple[int, int] | None = (9, 0), device: str = "cuda", ranks: int = 1, **keys: object
) -> bool:
    config = write_config(root, bf16=True, **keys)
    config = prepare(config, world_size=ranks, device=device, capability=capability).config
    return KEY in [choice.key for choice in fast_defaults.applied(config)]


def _problems(root: Path, device: str | None, capability: tuple[int, int] | None = None, **keys) -> str:
    """The report of the checks ``ktrain run`` makes before launch ('' when it passes)."""
    return launch_problems(write_config(root, "check.yaml", flash_attention_4=True, **keys), device, capability)


@pytest.mark.usefixtures("found")
def test_a_hopper_or_blackwell_gpu_with_flash_attn_4_takes_it_under_sdpa_and_flexattention(root: Path) -> None:
    assert installed()
    assert _taken(root, (9, 0)) and _taken(root, (10, 0)) and _taken(root, attn_implementation="sdpa")
    assert not _taken(root, (8, 0)) and not _taken(root, (12, 0))  # Ampere, and Blackwell's 12.x
    assert _taken(root, attn_implementation="flex_attention") and _taken(root, flex_attention=True)
    assert not _taken(root, attn_implementation="eager")
    assert not _taken(root, device="cpu")
    assert _taken(root, ranks=2) and not _taken(root, ranks=2, context_parallel_size=2)
    assert not _taken(root, **{KEY: False})  # written: never changed


def test_without_flash_attn_4_nothing_is_taken_and_check_says_how_to_install(root: Path) -> None:
    if installed():
        pytest.skip("flash-attn-4 is installed here")
    assert not _taken(root, (9, 0))
    assert "flash_attention_4: needs flash-attn-4, which is not installed here" in _problems(root, "cuda", (9, 0))
    assert "pip install 'ktrain-plugin-flash-attention[kernels]'" in _problems(root, "cuda", (9, 0))
    assert "needs flash-attn-4" in _problems(root, None)  # ktrain check anywhere: a warning, not an error
    with pytest.raises(ConfigError):
        prepare(write_config(root, "run.yaml", flash_attention_4=True), world_size=1, device="cuda", capability=(9, 0))


@pytest.mark.usefixtures("found")
def test_the_device_and_the_attention_are_checked_before_launch(root: Path) -> None:
    assert "flash_attention_4: needs a GPU of compute capability 9.x or 10.x; this run's ranks would use the CPU" in (
        _problems(root, "cpu")
    )
    assert "this one is 8.0; set flash_attention_4: false" in _problems(root, "cuda", (8, 0))
    assert _problems(root, "cuda", (9, 0)) == ""
    assert _problems(root, "cuda", (9, 0), attn_implementation="flex_attention") == ""  # its FLASH backend
    assert "runs under attn_implementation: sdpa or flex_attention, not eager" in _problems(
        root, "cuda", (9, 0), attn_implementation="eager"
    )
    assert "`ktrain run` refuses it elsewhere" in _problems(root, None)


@pytest.mark.usefixtures("found")
def test_checkpointed_runs_keep_their_chosen_share_of_recomputed_blocks(root: Path) -> None:
    """The memory model counts what FlashAttention-4 saves, so ``gradient_checkpointing_fraction: auto`` still
    chooses from the predicted peak rather than recomputing every block because the model cannot predict."""
    config = write_config(root, "ckpt.yaml", bf16=True, gradient_checkpointing=True, micro_batch_size=1)
    config = prepare(config, world_size=1, device="cuda", capability=(9, 0), gpu_memory=80 * 2**30).config
    applied = {choice.key: choice for choice in fast_defaults.applied(config)}
    assert KEY in applied
    assert "the plain path's peak" in applied["gradient_checkpointing_fraction"].line()


def test_the_flash_backend_is_put_first_in_sdpas_priority_order() -> None:
    flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
    before = torch._C._get_sdp_priority_order()
    torch._C._set_sdp_priority_order([*(b for b in before if b != flash), flash])  # flash last
    try:
        assert prefer_flash(torch.device("cpu")) == "first before cuDNN's"
        assert torch._C._get_sdp_priority_order()[0] == flash
    finally:
        torch._C._set_sdp_priority_order(before)


def test_flexattention_is_asked_for_its_flash_backend_in_compiled_blocks_unless_a_call_names_one() -> None:
    """transformers' ``flex_attention`` function, once the rank uses the FLASH backend, hands FlexAttention
    ``BACKEND: FLASH`` and the call's other options where it is compiled with gradients on; a backend the call
    names is kept; an uncompiled call, and one without gradients (evaluation, generation), is handed on as it came;
    registering twice wraps once. (FlexAttention's FLASH backend itself runs on the GPU:
    tests/test_flash_attention_gpu.py.)"""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from ktrain_flash_attention.flex import flash_backend, use_flash_backend

    def backend(module, q, k, v, mask, **kwargs) -> torch.Tensor:  # the backend asked for, as a number
        return q + {None: 0, "TRITON": 1, "FLASH": 2}[(kwargs.get("kernel_options") or {}).get("BACKEND")]

    attend = flash_backend(backend)
    zero = torch.zeros(())
    compiled = torch.compile(lambda **options: attend(None, zero, None, None, None, **options), backend="eager")
    assert compiled().item() == 2 and compiled(kernel_options={"BLOCK_M": 64}).item() == 2
    assert compiled(kernel_options={"BACKEND": "TRITON"}).item() == 1
    assert attend(None, zero, None, None, None).item() == 0  # uncompiled: Triton's kernels, as transformers asks
    with torch.no_grad():
        assert compiled().item() == 0
    original = ALL_ATTENTION_FUNCTIONS["flex_attention"]
    try:
        use_flash_backend()
        use_flash_backend()
        registered = ALL_ATTENTION_FUNCTIONS["flex_attention"]
        assert registered.flash_backend and registered.__wrapped__ is original
    finally:
        AttentionInterface.register("flex_attention", original)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the run's ranks would use the GPU")
def test_ktrain_run_on_a_cpu_is_refused_with_one_line(root: Path) -> None:
    config = write_config(root, "run.yaml", flash_attention_4=True, output_dir=str(root / "refused"))
    done = ktrain("run", str(config))
    assert done.returncode == 2, done.stderr
    assert "flash_attention_4: needs" in done.stderr
    assert "Traceback" not in done.stderr and not (root / "refused").exists()

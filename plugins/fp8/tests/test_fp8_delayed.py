"""``fp8_recipe: delayed`` on CPU (torch emulates the float8 products): the layers, their scale histories, the
checkpoint state, and the compiled blocks.

A tiny Llama in bf16 with every block linear layer converted. The first micro-step scales each tensor by its own
absolute maximum, as torchao's tensorwise layers do, so its loss is torchao's to the bit (the gradients to bf16's
rounding); later
micro-steps cast with the largest maxima of the last ``fp8_amax_history_len`` ones.
"""

from __future__ import annotations

import functools
import io
import types

import pytest
import torch
from fp8_tiny import delayed_keys, tiny_llama, train_steps

from ktrain_fp8.delayed import LIMITS, DelayedFloat8Linear, DelayedScales
from ktrain_fp8.runtime import Fp8Training, convert

_keys = functools.partial(delayed_keys, fp8_fused_mlp=False)


def _batches(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 96, (2, 32), generator=generator) for _ in range(count)]


def _micro_step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward and backward; the loss and the block weights' gradients (then cleared)."""
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None and ".layers." in n}
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


def test_the_first_micro_step_is_tensorwise_and_later_ones_cast_with_the_history() -> None:
    tensorwise, delayed = tiny_llama(), tiny_llama()
    convert(tensorwise, _keys(fp8_recipe="tensorwise"))
    scales = convert(delayed, _keys())
    layers = [m for m in delayed.modules() if isinstance(m, DelayedFloat8Linear)]
    assert isinstance(scales, DelayedScales) and len(layers) == 14 and type(delayed.lm_head) is torch.nn.Linear
    inputs, grads = {}, {}
    for layer in layers:  # each layer's input and output gradient of the last micro-step, from outside the layer
        layer.register_forward_pre_hook(lambda m, args: inputs.__setitem__(m.index, args[0].detach()))
        layer.register_full_backward_hook(lambda m, _, out: grads.__setitem__(m.index, out[0].detach()))

    a, b = _batches(2)
    for ids in (a, a):  # step 1 has no history; step 2's history is step 1's maxima of the same batch
        loss, got = _micro_step(delayed, ids)
        want_loss, want = _micro_step(tensorwise, ids)
        assert loss == want_loss and got.keys() == want.keys()
        for name, grad in want.items():  # the same casts; the sums of the gradients of q, k and v's input may
            difference = (got[name].float() - grad.float()).abs().max()  # differ by bf16's rounding
            assert difference <= 2**-8 * grad.float().abs().max(), name
    assert scales.calibrated
    loss, got = _micro_step(delayed, b)  # step 3: batch b cast with the maxima of batch a
    want_loss, want = _micro_step(tensorwise, b)
    assert loss == pytest.approx(want_loss, rel=0.01) and loss != want_loss
    step3 = {i: torch.stack([inputs[i].abs().amax(), layers[i].weight.abs().amax(), grads[i].abs().amax()]).float()
             for i in inputs}  # fmt: skip

    delayed.eval()
    with torch.no_grad():
        delayed(input_ids=a)  # evaluation: the scales are used, the history is left alone
    delayed.train()
    delayed(input_ids=a)  # a training forward rolls step 3's maxima in
    for layer in layers:
        i = layer.index
        assert torch.equal(scales.history[i, :, 0], step3[i]), "step 3's maxima (evaluation's input left out)"
        largest = scales.history[i].amax(dim=1)  # the last 2 micro-steps
        assert torch.equal(scales.scales[i], torch.tensor(LIMITS) / largest)


def test_the_scales_are_checkpoint_state_and_a_resume_casts_as_the_uninterrupted_run() -> None:
    """The runtime object hands the scales to the kernel's checkpoint (``rank-R.pt``, read with
    ``weights_only=True``); a model restored with them trains on exactly as the one that went on."""
    model = tiny_llama()
    runtime = Fp8Training(_keys(fp8_amax_history_len=3))
    runtime.ktrain_parallelize(model, types.SimpleNamespace(is_main=False, device=torch.device("cpu")))
    batches = _batches(6)
    train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), batches[:3])
    state = runtime.ktrain_collect_checkpoint_state(run=None)
    assert list(state) == ["fp8_delayed_scales"]
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "fp8": state["fp8_delayed_scales"].state_dict()}, saved)

    def go_on(model: torch.nn.Module) -> list[float]:
        return train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), batches[3:])

    uninterrupted = go_on(model)
    saved.seek(0)
    checkpoint = torch.load(saved, weights_only=True)
    resumed, fresh = tiny_llama(seed=5), tiny_llama(seed=5)
    for restored in (resumed, fresh):
        restored.load_state_dict(checkpoint["model"])
    convert(resumed, _keys(fp8_amax_history_len=3)).load_state_dict(checkpoint["fp8"])
    convert(fresh, _keys(fp8_amax_history_len=3))
    assert go_on(resumed) == uninterrupted
    assert go_on(fresh) != uninterrupted  # without the scales the first step casts by its own maxima
    with pytest.raises(ValueError, match="resume with the fp8 keys it was saved with"):
        convert(tiny_llama(), _keys(fp8_amax_history_len=4)).load_state_dict(checkpoint["fp8"])


@pytest.mark.parametrize("fused", [False, True])
def test_a_compiled_block_traces_whole_once_a_mode(fused: bool) -> None:
    """Each block compiled whole (``fullgraph``), with its MLP's layers apart or fused (``fp8_fused_mlp``): the
    history flows out of the compiled backward, the losses are eager's, and the 2 blocks share 2 graphs (no
    history, then the history's scales)."""
    eager, compiled = tiny_llama(), tiny_llama()
    convert(eager, _keys(fp8_fused_mlp=fused))
    scales = convert(compiled, _keys(fp8_fused_mlp=fused))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for block in compiled.model.layers:
        block.forward = torch.compile(block.forward, backend="aot_eager", fullgraph=True)
    for ids in _batches(3):
        want, _ = _micro_step(eager, ids)
        got, _ = _micro_step(compiled, ids)
        assert got == pytest.approx(want, rel=1e-3)
    assert torch.count_nonzero(scales.history[:, 2, :2]) == 2 * len(scales.sinks)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


def test_fast_accumulation_reaches_the_backward_products_of_either_recipe() -> None:
    """``fp8_fast_accumulation`` sets torchao's backward products' accumulation and the delayed layers' (the CPU's
    emulated products have one way only: the values are not what is checked here)."""
    torchao_model, delayed_model = tiny_llama(), tiny_llama()
    convert(torchao_model, _keys(fp8_recipe="tensorwise", fp8_fast_accumulation=True))
    convert(delayed_model, _keys(fp8_fast_accumulation=True))
    layer = torchao_model.model.layers[0].mlp.up_proj
    settings = layer.config
    assert settings.gemm_config_output.use_fast_accum
    assert settings.gemm_config_grad_input.use_fast_accum and settings.gemm_config_grad_weight.use_fast_accum
    assert all(m.fast_backward for m in delayed_model.modules() if isinstance(m, DelayedFloat8Linear))
    plain = tiny_llama()
    convert(plain, _keys())
    assert not any(m.fast_backward for m in plain.modules() if isinstance(m, DelayedFloat8Linear))

"""``fp8_fused_mlp`` on CPU (torch emulates the float8 products): the fused SwiGLU MLP against the same float8
computation written out in fp32, which models are fused, training beside the unfused layers, and the Triton
kernel of its backward in Triton's interpreter and compiled for a Hopper GPU ahead of time. On a GPU,
``test_fp8_gpu`` trains the 1.5B shape with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fp8_tiny import delayed_keys, tiny_llama

from ktrain_fp8.delayed import E4M3, E5M2, DelayedFloat8Linear
from ktrain_fp8.runtime import convert
from ktrain_fp8.swiglu import DelayedFloat8SwiGLU


def _dequantized(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` cast to ``dtype`` at ``scale`` (saturated) and back, in fp32."""
    limit = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-limit, limit).to(dtype).float() / scale


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


def _written_out(x, weights, grad, s_x, s_w, s_h, s_g) -> dict[str, torch.Tensor]:
    """The fused MLP's float8 computation in fp32 with autograd: each product of dequantized float8 operands,
    rounded to bf16 where the products write bf16; the SiLU's gradient by autograd. ``s_g``: the output
    gradient's scale of the gate, up and down projections, in that order. Tokens flattened."""
    x, grad = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
    w_gate, w_up, w_down = (_dequantized(w, s, E4M3) for w, s in zip(weights, s_w, strict=True))
    xq = _dequantized(x, s_x, E4M3)
    gate = _bf16(xq @ w_gate.t()).requires_grad_()
    up = _bf16(xq @ w_up.t()).requires_grad_()
    hidden = F.silu(gate) * up
    y = _bf16(_dequantized(hidden, s_h, E4M3) @ w_down.t())
    g = _dequantized(grad, s_g[2], E5M2)
    grad_h = _bf16(g @ w_down)
    d_gate, d_up = torch.autograd.grad(hidden, (gate, up), grad_h)
    maxima = torch.stack([d_gate.abs().amax(), d_up.abs().amax()])
    d_gate, d_up = _dequantized(d_gate, s_g[0], E5M2), _dequantized(d_up, s_g[1], E5M2)
    return {
        "y": y,
        "x": _bf16(_bf16(d_gate @ w_gate) + _bf16(d_up @ w_up)),
        "gate_proj": _bf16(d_gate.t() @ xq),
        "up_proj": _bf16(d_up.t() @ xq),
        "down_proj": _bf16(g.t() @ _dequantized(hidden, s_h, E4M3)),
        "maxima": maxima,
        "hidden": hidden.detach(),
    }


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("delayed", [False, True])
def test_the_fused_mlp_is_the_float8_computation_written_out(delayed: bool) -> None:
    """One MLP of 50 tokens (padded to 64 for the weight gradients): its output and gradients are those of the
    float8 computation written out in fp32 within 1e-3 (bf16's rounding: a product rounded differently can move
    a float8 cast by a step; measured: at most 1e-4), with the scales of the history (``delayed``) or each
    tensor's own (the first micro-step); the layers' maxima and the output gradients' reach the history's
    inputs."""
    model = tiny_llama()
    scales = convert(model, delayed_keys())
    mlp = model.model.layers[0].mlp
    assert isinstance(mlp, DelayedFloat8SwiGLU)
    layers = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    torch.manual_seed(1)
    x = torch.randn(2, 25, mlp.gate_proj.in_features, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(2, 25, mlp.down_proj.out_features, dtype=torch.bfloat16) * 1e-3
    weights = [layer.weight.detach() for layer in layers]
    if delayed:  # scales of an earlier step: a quarter of each tensor's own, so nothing saturates
        scales.calibrated = True
        for layer, limit in zip(layers, (448.0, 448.0, 448.0), strict=True):
            layer.scales.copy_(torch.tensor([limit / 8, limit / 4 / layer.weight.abs().max().item(), 57344.0 / 4]))
        s_x, s_w = layers[0].scales[0], [layer.scales[1] for layer in layers]
        s_g = [layer.scales[2] for layer in layers]
        want = _written_out(x.detach(), weights, grad, s_x, s_w, layers[2].scales[0], s_g)
    else:
        own = lambda t, dtype: torch.finfo(dtype).max / t.float().abs().max()  # noqa: E731
        s_x, s_w = own(x, E4M3), [own(w, E4M3) for w in weights]
        first = _written_out(x.detach(), weights, grad, s_x, s_w, 1.0, [1.0, 1.0, own(grad, E5M2)])
        s_h = own(first["hidden"], E4M3)
        probe = _written_out(x.detach(), weights, grad, s_x, s_w, s_h, [1.0, 1.0, own(grad, E5M2)])
        s_g = [57344.0 / probe["maxima"][0], 57344.0 / probe["maxima"][1], own(grad, E5M2)]
        want = _written_out(x.detach(), weights, grad, s_x, s_w, s_h, s_g)

    y = mlp(x)
    y.backward(grad)
    assert _relative(y.view(50, -1), want["y"]) < 1e-3
    assert _relative(x.grad.view(50, -1), want["x"]) < 1e-3
    for layer, name in zip(layers, ("gate_proj", "up_proj", "down_proj"), strict=True):
        assert layer.weight.grad.dtype == torch.bfloat16
        assert _relative(layer.weight.grad, want[name]) < 1e-3, name
    sunk = torch.stack([layers[0].sink.grad, layers[1].sink.grad])
    torch.testing.assert_close(sunk, want["maxima"], rtol=0.02, atol=0)
    assert layers[2].sink.grad == grad.float().abs().max()
    x_max = x.detach().float().abs().max()
    assert torch.equal(layers[0].amax, torch.stack([x_max, weights[0].float().abs().max()]))
    assert torch.equal(layers[1].amax[0], x_max)
    assert layers[2].amax[0] == pytest.approx(want["hidden"].abs().max().item(), rel=0.01)


def test_the_mlps_whose_three_projections_are_float8_are_fused() -> None:
    """Every block of the tiny Llama: the MLP is replaced, its parameters keep their names; an MLP with a
    projection kept in bf16, the key off, or a torchao recipe: nothing fused."""
    model = tiny_llama()
    names = list(model.state_dict())
    convert(model, delayed_keys())
    assert all(isinstance(block.mlp, DelayedFloat8SwiGLU) for block in model.model.layers)
    assert list(model.state_dict()) == names
    assert all(isinstance(layer, DelayedFloat8Linear) for layer in model.model.layers[1].mlp.children())
    partly, off = tiny_llama(), tiny_llama()
    convert(partly, delayed_keys(fp8_exclude_modules=["lm_head", "layers.1.mlp.down_proj"]))
    convert(off, delayed_keys(fp8_fused_mlp=False))
    assert [type(block.mlp).__name__ for block in partly.model.layers] == ["DelayedFloat8SwiGLU", "LlamaMLP"]
    assert [type(block.mlp).__name__ for block in off.model.layers] == ["LlamaMLP", "LlamaMLP"]
    model = tiny_llama()
    convert(model, delayed_keys(fp8_recipe="tensorwise"))
    assert not any(isinstance(m, DelayedFloat8SwiGLU) for m in model.modules())


def test_a_fused_model_trains_as_the_unfused_one() -> None:
    """Four micro-steps with SGD: the first with each tensor's own scale, the next from the history. The
    losses agree with the unfused layers' within 1e-3 (the fused MLP computes its activation in fp32, the
    unfused ones round it to bf16, which moves some float8 casts by a step); so do the histories of the inputs
    and weights within 5%, and of the output gradients, which float8 products compute, within 10%."""
    fused, unfused = tiny_llama(), tiny_llama()
    histories = [convert(fused, delayed_keys()).history, convert(unfused, delayed_keys(fp8_fused_mlp=False)).history]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (fused, unfused)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        ids = torch.randint(0, 96, (2, 32), generator=generator)
        losses = []
        for model, optimizer in zip((fused, unfused), optimizers, strict=True):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-3)
    fused_history, unfused_history = histories
    torch.testing.assert_close(fused_history[:, :2], unfused_history[:, :2], rtol=0.05, atol=0)
    torch.testing.assert_close(fused_history[:, 2], unfused_history[:, 2], rtol=0.1, atol=0)  # float8 gradients


INTERPRETED = """
import torch
import torch.nn.functional as F

from ktrain.testing.triton_interpreter import converted_as_interpreted
from ktrain_fp8.delayed import E4M3, E5M2
from ktrain_fp8.swiglu_triton import swiglu_backward_float8, swiglu_forward_float8


def converted(values, scale, dtype):
    limit = torch.finfo(dtype).max
    return converted_as_interpreted((values * scale).clamp(-limit, limit), dtype).float()


torch.manual_seed(0)
grad_h = (torch.randn(70, 300) * 1e-3).bfloat16()
gate, up = (torch.randn(70, 300) * 3).bfloat16(), torch.randn(70, 300).bfloat16()
scales = torch.tensor([57344.0 / 0.01, 57344.0 / 0.004, 448.0 / 8])  # the hidden activation saturates
got = swiglu_backward_float8(grad_h, gate, up, scales)
a, b = gate.float().requires_grad_(), up.float().requires_grad_()
hidden = F.silu(a) * b
d_gate, d_up = torch.autograd.grad(hidden, (a, b), grad_h.float())
want = [converted(d_gate, scales[0], E5M2), converted(d_up, scales[1], E5M2), converted(hidden, scales[2], E4M3)]
maxima = torch.stack([d_gate.abs().amax(), d_up.abs().amax()])
forward = swiglu_forward_float8(gate, up, scales[2:])
torch.save([[t.float() for t in got], want, maxima, [t.float() for t in forward], hidden.abs().amax()], "results.pt")
"""


def test_the_triton_kernel_writes_what_pytorch_computes_in_triton_s_interpreter(tmp_path: Path) -> None:
    """The backward's kernel run by Triton's interpreter on the CPU (``TRITON_INTERPRET=1``, set before Triton
    compiles anything, so in a process of its own) on 70 tokens x 300 features, six programs: the SiLU's
    gradients by autograd and the activation, scaled, saturated and converted to float8 the interpreter's way
    (which is not torch's: it rounds toward zero); the transposed copies padded to 80 tokens with zeros; the
    maxima folded in from every program. A few elements may differ where two exponentials round differently at
    a float8 boundary. The forward's kernel, on the same gate and up, six programs too: the activation as the
    backward writes it transposed, and its maximum."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", INTERPRETED], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got, want, maxima, forward, hidden_max = torch.load(tmp_path / "results.pt", weights_only=True)
    grad_gate, grad_gate_t, grad_up, grad_up_t, hidden_t, got_maxima = got
    for rows, transposed, expected in ((grad_gate, grad_gate_t, want[0]), (grad_up, grad_up_t, want[1])):
        assert (rows != expected).sum() <= expected.numel() // 1000
        assert transposed.shape == (300, 80) and torch.equal(transposed[:, :70], rows.t())
        assert (transposed[:, 70:] == 0).all()
    assert (hidden_t[:, :70] != want[2].t()).sum() <= want[2].numel() // 1000 and (hidden_t[:, 70:] == 0).all()
    assert hidden_t.abs().max() == 448  # saturated, not infinite
    torch.testing.assert_close(got_maxima, maxima, rtol=1e-5, atol=0)
    hidden, got_hidden_max = forward
    assert (hidden != want[2]).sum() <= want[2].numel() // 1000 and hidden.abs().max() == 448
    torch.testing.assert_close(got_hidden_max, hidden_max, rtol=1e-5, atol=0)


def _hopper_assembly(kernel, signature: dict[str, str], constants: dict, warps: int) -> dict[str, str]:
    """``kernel`` compiled by Triton's ahead-of-time compiler for compute capability 9.0, no GPU needed: its
    assembly by kind (``cubin``, ``ptx``, ...)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = signature | dict.fromkeys(constants, "constexpr")
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm


def test_the_triton_kernel_compiles_for_hopper_without_a_gpu() -> None:
    """Triton's ahead-of-time compiler builds the backward's kernel for compute capability 9.0 on this machine,
    no GPU needed, and its conversions to e5m2 and e4m3 are the hardware's round-to-nearest (what the
    interpreter does not show)."""
    pytest.importorskip("triton")
    from ktrain_fp8.swiglu_triton import COLUMNS, ROWS, WARPS, _swiglu_backward_kernel

    signature = {name: "*bf16" for name in ("grad_h", "gate", "up")}
    signature |= {"rows": "i32", "width": "i32", "padded": "i32", "scales": "*fp32"}
    signature |= {name: "*fp8e5" for name in ("grad_gate", "grad_gate_t", "grad_up", "grad_up_t")}
    signature |= {"hidden_t": "*fp8e4nv", "amax": "*fp32"}
    constants = {"GRAD_LIMIT": 57344.0, "HIDDEN_LIMIT": 448.0, "ROWS": ROWS, "COLUMNS": COLUMNS}
    assembly = _hopper_assembly(_swiglu_backward_kernel, signature, constants, WARPS)
    assert assembly["cubin"]
    assert "cvt.rn.satfinite.e5m2x2.f32" in assembly["ptx"]
    assert "cvt.rn.satfinite.e4m3x2.f32" in assembly["ptx"]


def test_the_forward_s_triton_kernel_compiles_for_hopper_without_a_gpu() -> None:
    """The forward's kernel likewise, with its conversion to e4m3 the hardware's round-to-nearest."""
    pytest.importorskip("triton")
    from ktrain_fp8.swiglu_triton import BLOCK, BLOCK_WARPS, _swiglu_forward_kernel

    signature = {"gate": "*bf16", "up": "*bf16", "n": "i32", "scale": "*fp32", "hidden": "*fp8e4nv", "amax": "*fp32"}
    assembly = _hopper_assembly(_swiglu_forward_kernel, signature, {"LIMIT": 448.0, "BLOCK": BLOCK}, BLOCK_WARPS)
    assert assembly["cubin"] and "cvt.rn.satfinite.e4m3x2.f32" in assembly["ptx"]


def _cuda_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_capable(), reason="needs a GPU of compute capability 8.9 or later")
def test_the_triton_kernel_on_a_gpu_writes_what_pytorch_computes() -> None:
    """Compiled for the GPU, on the 1.5B shape's MLP (4,090 tokens, padded to 4,096, x 8,192 features): the
    float8 outputs of the PyTorch version (both round to nearest) but where two exponentials round differently
    at a float8 boundary, and the same maxima; the forward's kernel likewise."""
    from ktrain_fp8.swiglu import swiglu_backward_float8_reference, swiglu_forward_float8_reference
    from ktrain_fp8.swiglu_triton import swiglu_backward_float8, swiglu_forward_float8

    torch.manual_seed(0)
    grad_h, gate, up = (torch.randn(4090, 8192, device="cuda") * size for size in (1e-3, 3.0, 1.0))
    grad_h, gate, up = grad_h.bfloat16(), gate.bfloat16(), up.bfloat16()
    scales = torch.tensor([57344.0 / 0.01, 57344.0 / 0.004, 448.0 / 8], device="cuda")
    got = swiglu_backward_float8(grad_h, gate, up, scales)
    want = swiglu_backward_float8_reference(grad_h, gate, up, scales)
    for g, w in zip(got[:5], want[:5], strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert (g.float() != w.float()).sum() <= w.numel() // 1000
    torch.testing.assert_close(got[5], want[5], rtol=1e-5, atol=0)
    hidden, hidden_max = swiglu_forward_float8(gate, up, scales[2:])
    want_hidden, want_max = swiglu_forward_float8_reference(gate, up, scales[2:])
    assert hidden.dtype == E4M3 and (hidden.float() != want_hidden.float()).sum() <= hidden.numel() // 1000
    torch.testing.assert_close(hidden_max, want_max, rtol=1e-5, atol=0)


def test_activation_checkpointing_recomputes_the_fused_mlp_exactly() -> None:
    """With the blocks checkpointed (recomputed in the backward), three micro-steps give the losses, gradients and
    histories of the run that keeps its activations, bit for bit: the recomputation casts with its forward's
    scales and records the same maxima."""
    kept, recomputed = tiny_llama(), tiny_llama()
    histories = [convert(kept, delayed_keys()).history, convert(recomputed, delayed_keys()).history]
    recomputed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        ids = torch.randint(0, 96, (2, 32), generator=generator)
        results = []
        for model in (kept, recomputed):
            model.train()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            results.append((loss.item(), grads))
            model.zero_grad(set_to_none=True)
        (loss, grads), (again, regrads) = results
        assert loss == again and grads.keys() == regrads.keys() and len(grads) == 21
        assert all(torch.equal(grads[n], regrads[n]) for n in grads)
    assert torch.equal(histories[0], histories[1]) and histories[0][:, 2].count_nonzero() > 0

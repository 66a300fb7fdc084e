"""FSDP2: ``fully_shard`` on each unit (transformer blocks, or units chosen by size), then on the root.

Parameters stay fp32 in the shards (the master weights the optimizer steps on); under bf16/fp16 the
mixed-precision policy gathers them in the compute dtype and reduces gradients in fp32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from ktrain_fsdp.options import FsdpOptions
from ktrain_fsdp.quantized import share_quant_states, tensor_state


def mixed_precision(compute_dtype: torch.dtype) -> MixedPrecisionPolicy:
    """Compute-dtype parameters in forward and backward, fp32 gradient reductions, fp32 shards."""
    if compute_dtype == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)


def units(model: torch.nn.Module, options: FsdpOptions, classes: tuple[type, ...]) -> list[torch.nn.Module]:
    """The submodules that become FSDP units, innermost first (the root is sharded last, apart)."""
    if options.auto_wrap_policy == "TRANSFORMER_BASED_WRAP":
        return [m for m in model.modules() if isinstance(m, classes)]
    if options.auto_wrap_policy == "NO_WRAP":
        return []
    chosen: list[torch.nn.Module] = []
    covered: set[int] = set()

    def visit(module: torch.nn.Module) -> None:  # post-order: a unit holds what its sub-units do not
        for child in module.children():
            visit(child)
        if module is model or type(module).forward is torch.nn.Module.forward:  # the root; containers
            return
        own = sum(p.numel() for p in module.parameters() if id(p) not in covered)
        if own >= options.min_num_params:
            chosen.append(module)
            covered.update(id(p) for p in module.parameters())

    visit(model)
    return chosen


def apply_fsdp2(
    model: torch.nn.Module, run: Any, options: FsdpOptions, mesh: DeviceMesh, classes: tuple[type, ...]
) -> None:
    """Shard ``model`` in place over ``mesh``; under cpu_ram_efficient_loading, fill it from rank 0 (4-bit
    weights included: ``ktrain_fsdp.quantized``)."""
    efficient = options.cpu_ram_efficient_loading
    full = tensor_state(model) if efficient and run.rank == 0 else {}
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()} if efficient and run.rank == 0 else {}
    offload = CPUOffloadPolicy(pin_memory=run.device.type == "cuda") if options.offload_params else OffloadPolicy()
    settings = {
        "mesh": mesh,
        "reshard_after_forward": options.reshard_after_forward,
        "mp_policy": mixed_precision(run.compute_dtype),
        "offload_policy": offload,
    }
    if efficient:  # 4-bit layers: their quantization state is no parameter, so it is sent apart
        share_quant_states(model, run.rank, run.device)
    for unit in units(model, options, classes):
        fully_shard(unit, **settings)
    fully_shard(model, **settings)
    if efficient:
        if run.rank != 0:
            model.to_empty(device="cpu" if options.offload_params else run.device)
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        for name, buffer in model.named_buffers():  # non-persistent buffers (rotary tables) are in no state dict
            if run.rank == 0:
                buffer.copy_(buffers[name])
            dist.broadcast(buffer, src=0)

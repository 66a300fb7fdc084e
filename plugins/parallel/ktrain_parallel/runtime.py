"""The runtime object: tensor parallelism on the model, the split-sequence attention, the split step.

torch is imported inside the hooks, so that ``ktrain check`` stays light.

Order on every rank (the kernel's): ``wrap_model`` (adapters, kernels) -> ``parallelize`` (here: the
tensor-parallel plan, then the attention) -> ``shard`` (FSDP2 over ``dp_shard`` x ``cp``, HSDP with
``dp_replicate``; activation checkpointing and FSDP wrap the parallelized blocks).
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_parallel.checks import raise_shape_problems, sequence_ranks


class Parallel:
    """Owner of ``mesh:tp`` and/or ``mesh:cp``."""

    def __init__(self, config: Any):
        self.config = config
        self.tp = config.tensor_parallel_size
        self.ranks = sequence_ranks(config)

    @hookimpl
    def ktrain_parallelize(self, model: Any, run: Any) -> None:
        """Check the model's shape, apply the tensor-parallel plan, install the split-sequence attention."""
        from ktrain_parallel import attention

        raise_shape_problems(model.config.to_dict(), self.config, self.ranks)
        if self.tp > 1:
            from ktrain_parallel.plans import apply_tensor_parallel

            apply_tensor_parallel(model, run.device_mesh["tp"])
        attention.install(model)
        if run.is_main:
            how = "Ulysses all-to-all" if self.config.sequence_parallel_degree > 1 else "all-gathered K/V"
            parts = [f"tensor parallel {self.tp} (sequence-sharded norms)"] if self.tp > 1 else []
            if self.ranks > 1:
                parts.append(f"sequence split over {self.ranks} ranks ({how}, zigzag balanced)")
            print(f"parallel: {'; '.join(parts)}; attention: SDPA with document masks", flush=True)

    @hookimpl
    def ktrain_wrap_train_step(self, step: Any, run: Any) -> Any:
        """Give the model this rank's part of every micro-batch's sequence (whole rows under TP alone)."""
        from ktrain_parallel import attention
        from ktrain_parallel.sequence import split_batch

        state = attention.STATE
        state.mode = "ulysses" if self.config.sequence_parallel_degree > 1 else "gather"
        state.ranks, state.heads_k_stride = self.ranks, self.config.heads_k_stride
        rank = 0
        if self.ranks > 1:
            state.group = run.device_mesh["cp"].get_group()
            rank = run.device_mesh["cp"].get_local_rank()
        multiple = (2 * self.ranks if self.ranks > 1 else 1) * self.tp
        pad_id = run.pad_id

        def split_step(batch: dict[str, Any], num_items: float) -> Any:
            part, state.split = split_batch(batch, self.ranks, rank, multiple, pad_id)
            return step(part, num_items)

        return split_step

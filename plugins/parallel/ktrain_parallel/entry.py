"""Entry module of ktrain-plugin-parallel: its keys, checks before launch, the mesh dimensions it owns.

Imports nothing heavy. ``tensor_parallel_size`` (a kernel mesh key) > 1 makes the plugin claim
``mesh:tp``; ``context_parallel_size`` > 1 or ``sequence_parallel_degree`` > 1 makes it claim
``mesh:cp``: both split every row's sequence over the ``cp`` dimension, with all-gathered K/V
(context parallelism) or with all-to-all between sequence and head shards (Ulysses).
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_parallel.checks import check_model, check_plugins, sequence_ranks
from ktrain_parallel.keys import ALL_GATHER_FUNCS, ParallelKeys

KTRAIN_ROLES = ("mesh:tp", "mesh:cp")


@hookimpl
def ktrain_register_config(register) -> None:
    """Declare ``sequence_parallel_degree``, ``heads_k_stride`` and ``ring_attn_func``."""
    register(ParallelKeys)


@hookimpl
def ktrain_collect_mesh_dims(config: Any) -> dict[str, int] | None:
    """``sequence_parallel_degree`` sizes the kernel's ``cp`` dimension (Ulysses splits the sequence too)."""
    if config.sequence_parallel_degree > 1 and not config.is_set("context_parallel_size"):
        return {"cp": config.sequence_parallel_degree}
    return None


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """Sizes, combinations with other plugins, and the model's heads and vocabulary, before any rank starts."""
    sp, cp = config.sequence_parallel_degree, config.context_parallel_size
    if sp < 1:
        report.error("sequence_parallel_degree", f"must be 1 (off) or more ranks, not {sp}")
    if sp > 1 and config.is_set("context_parallel_size"):
        report.error(
            "sequence_parallel_degree",
            "and context_parallel_size both split the sequence; set one: context_parallel_size (K/V all-gathered, "
            "any head count) or sequence_parallel_degree (Ulysses all-to-all, heads divisible by it)",
        )
    if config.ring_attn_func in ("batch_ring", "batch_stripe"):
        report.error(
            "ring_attn_func",
            f"{config.ring_attn_func} is not implemented; ktrain's context parallelism all-gathers K/V with zigzag "
            f"load balancing: use {' or '.join(ALL_GATHER_FUNCS)}",
        )
    if config.heads_k_stride is not None and config.heads_k_stride < 1:
        report.error("heads_k_stride", f"must be a positive number of KV heads, not {config.heads_k_stride}")
    for name in ("heads_k_stride", "ring_attn_func"):
        if config.is_set(name) and cp <= 1:
            report.warn(name, "has no effect without context_parallel_size > 1")
    check_plugins(config, report)
    check_model(config, report, sequence_ranks(config))


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Claim ``mesh:tp`` for tensor parallelism and ``mesh:cp`` for context or sequence parallelism."""
    roles, keys = [], []
    if config.tensor_parallel_size > 1:
        roles.append("mesh:tp")
        keys.append("tensor_parallel_size")
    if sequence_ranks(config) > 1:
        roles.append("mesh:cp")
        keys.append("sequence_parallel_degree" if config.sequence_parallel_degree > 1 else "context_parallel_size")
    if not roles:
        return
    activate("ktrain_parallel.runtime:Parallel", roles=tuple(roles), keys=tuple(keys))


@hookimpl
def ktrain_collect_memory(mesh: Any) -> dict[str, Any] | None:
    """Tensor and context parallelism in one rank's memory model (``ktrain_parallel.memory``)."""
    from ktrain_parallel.memory import collect_memory

    return collect_memory(mesh)

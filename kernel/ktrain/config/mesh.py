"""The device mesh's sizes, checked in one place (torchtitan's ParallelDims rules), without torch.

Named dimensions, outermost first: ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``, then any a plugin
adds. The sizes multiply to the world size; one may be -1, meaning the ranks left over. When none is
-1, the data-parallel dimension of the run (``dp_shard`` under a sharding plugin, ``dp_replicate``
otherwise) takes the ranks left over unless its key was set.
"""

from __future__ import annotations

import math

import attrs

from ktrain.config.report import ConfigError, Report

KERNEL_DIMS = {
    "dp_replicate": "dp_replicate_size",
    "dp_shard": "dp_shard_size",
    "cp": "context_parallel_size",
    "tp": "tensor_parallel_size",
}


@attrs.frozen
class MeshPlan:
    """Resolved sizes of every mesh dimension for ``world_size`` ranks."""

    dims: dict[str, int]
    world_size: int

    @property
    def dp_size(self) -> int:
        """Ranks that see different data: replicas times shards."""
        return self.dims["dp_replicate"] * self.dims["dp_shard"]

    @property
    def gradient_ranks(self) -> int:
        """Ranks with the same parameters and different tokens (replicas x shards x context-parallel
        ranks, which split each row's sequence): a sharding plugin averages gradients over all of them."""
        return self.dp_size * self.dims["cp"]

    @property
    def copies(self) -> int:
        """Ranks that compute on the same tokens (tensor parallel, and any plugin dimension)."""
        return self.world_size // self.gradient_ranks

    def describe(self) -> str:
        return " x ".join(f"{name} {size}" for name, size in self.dims.items()) + f" = {self.world_size} ranks"


def check_sizes(sizes: dict[str, int], report: Report) -> None:
    """Report sizes that are neither positive nor -1, and more than one -1, naming their keys."""
    for dim, size in sizes.items():
        if size == 0 or size < -1:
            report.error(KERNEL_DIMS.get(dim, dim), f"must be a positive number of ranks or -1 (the rest), not {size}")
    rest = [KERNEL_DIMS.get(dim, dim) for dim, size in sizes.items() if size == -1]
    if len(rest) > 1:
        report.error(", ".join(rest), "only one mesh size may be -1")


def plan_mesh(
    sizes: dict[str, int], set_keys: set[str], world_size: int | None, sharded: bool, source: str = "config"
) -> MeshPlan:
    """Resolve ``sizes`` (dimension -> size, -1 for the rest) for ``world_size`` ranks.

    ``set_keys`` are the config keys the user wrote; ``sharded`` says a sharding plugin is active.
    ``world_size`` None means: as many ranks as the sizes ask for. Raises ``ConfigError`` naming keys.
    """
    report = Report(source)
    key_of = {dim: KERNEL_DIMS.get(dim, dim) for dim in sizes}
    check_sizes(sizes, report)
    if world_size is not None and world_size < 1:
        report.error("--world-size", f"must be a positive number of ranks, not {world_size}")
    if report.errors:
        raise ConfigError(report)
    rest = [dim for dim, size in sizes.items() if size == -1]
    fill = "dp_shard" if sharded else "dp_replicate"
    dims = dict(sizes)
    if not rest and key_of[fill] not in set_keys and world_size is not None:
        rest = [fill]
        dims[fill] = -1
    fixed = math.prod(size for size in dims.values() if size != -1)
    if world_size is None:
        world_size = fixed
        dims = {d: (1 if s == -1 else s) for d, s in dims.items()}
    elif rest:
        if world_size % fixed:
            report.error(
                key_of[rest[0]],
                f"the other mesh sizes multiply to {fixed}, which does not divide the {world_size} ranks of "
                f"this run; change the sizes or the number of ranks",
            )
            raise ConfigError(report)
        dims[rest[0]] = world_size // fixed
    elif fixed != world_size:
        written = " x ".join(f"{key_of[d]} {s}" for d, s in dims.items() if s != 1) or "all 1"
        report.error(
            ", ".join(key_of[d] for d in dims if dims[d] != 1) or key_of[fill],
            f"mesh sizes multiply to {fixed} ({written}) but the run has {world_size} ranks; make them "
            f"multiply to {world_size}, or set one of them to -1",
        )
        raise ConfigError(report)
    return MeshPlan(dims=dims, world_size=world_size)

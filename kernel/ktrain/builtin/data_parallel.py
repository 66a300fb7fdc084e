"""Default owner of ``sharding``: one process, or DDP over the replicas (and context-parallel ranks).

Plugins tune that DDP without taking the role: ``ktrain_collect_ddp_options`` gives constructor
keywords and a comm hook (gradient compression such as PowerSGD), merged here with each option's plugin
named.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from ktrain import hookimpl
from ktrain.engine import DataParallelEngine, Engine, param_groups
from ktrain.plugins import PluginError

KERNEL_SET = ("self", "module", "device_ids", "process_group")
"""``DistributedDataParallel`` arguments the kernel sets itself."""
HOOK_OPTIONS = ("comm_hook", "comm_state")
"""Options that are not constructor keywords: given to ``register_comm_hook(comm_state, comm_hook)``."""


def ddp_options(run: Any) -> dict[str, Any]:
    """Every plugin's answer to ``ktrain_collect_ddp_options``, merged.

    Raises ``PluginError`` naming both plugins when two give one option, and naming the plugin when it
    gives an option DDP does not take (or one the kernel sets), or a ``comm_state`` without its
    ``comm_hook``.
    """
    allowed = [n for n in inspect.signature(DistributedDataParallel.__init__).parameters if n not in KERNEL_SET]
    allowed += HOOK_OPTIONS
    given = run.plan.plugins.collect_mapping("ktrain_collect_ddp_options", "DDP option", run=run)
    for name, (_, info) in given.items():
        if name not in allowed:
            raise PluginError(
                f"plugin {info.describe()} gives the DDP option '{name}', which ktrain_collect_ddp_options "
                f"does not take; it takes: {', '.join(allowed)}"
            )
    if "comm_state" in given and given["comm_state"][1] != given.get("comm_hook", (None, None))[1]:
        raise PluginError(
            f"plugin {given['comm_state'][1].describe()} gives a DDP comm_state without its comm_hook; "
            "give both from one plugin"
        )
    return {name: value for name, (value, _) in given.items()}


class DataParallel:
    """``ktrain_shard`` for plain data parallelism: the model moved to the device, wrapped in DDP when world > 1."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_shard(self, model: Any, run: Any, build_optimizer: Any, build_lr_scheduler: Any) -> Engine:
        model.to(run.device)
        module = model
        if run.mesh.gradient_ranks > 1:  # replicas, and context-parallel ranks (same weights, other tokens)
            ids = [run.device.index] if run.device.type == "cuda" else None
            options = ddp_options(run)
            comm_hook, comm_state = options.pop("comm_hook", None), options.pop("comm_state", None)
            module = DistributedDataParallel(model, device_ids=ids, process_group=run.gradient_group, **options)
            if comm_hook is not None:
                module.register_comm_hook(comm_state, comm_hook)
        optimizer = build_optimizer(param_groups(model, self.config.weight_decay))
        return DataParallelEngine(module, model, optimizer, build_lr_scheduler(optimizer), self.config.max_grad_norm)

    @hookimpl(trylast=True)
    def ktrain_shard_frozen(self, module: Any, run: Any) -> Any:
        """A frozen module stays whole on every rank (no gradients: nothing for DDP to average), on the device."""
        return module.to(run.device)

"""The runtime object: PowerSGD as the comm hook of the kernel's DDP, its state saved with every checkpoint."""

from typing import Any

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from ktrain import hookimpl
from ktrain_powersgd.layout import AlignedPowerSGD


class PowerSGD:
    """Gives the kernel's DDP the PowerSGD hook; saves and restores its state (error feedback, warm start, step)."""

    def __init__(self, config: Any):
        self.config = config
        self.run: Any = None
        self.state: powersgd.PowerSGDState | None = None
        self.aligned: AlignedPowerSGD | None = None

    @hookimpl
    def ktrain_collect_ddp_options(self, run: Any) -> dict[str, Any]:
        """Called on every rank when the kernel wraps the model in DDP (more than one gradient rank)."""
        self.run = run
        self.state = powersgd.PowerSGDState(
            process_group=run.gradient_group,
            matrix_approximation_rank=self.config.powersgd_rank,
            start_powerSGD_iter=self.config.powersgd_start_step,
            random_seed=self.config.seed,
        )
        self.aligned = AlignedPowerSGD(self.state, run.model)
        return {"comm_hook": self.aligned.hook, "comm_state": self.state}

    @hookimpl
    def ktrain_collect_checkpoint_state(self, run: Any) -> dict[str, Any]:
        """This object's ``state_dict`` goes into each rank's file of every checkpoint."""
        return {"powersgd": self}

    @hookimpl
    def ktrain_on_train_start(self, run: Any, engine: Any) -> None:
        """Say what is compressed; refuse a run where another plugin's sharding leaves PowerSGD out."""
        if run.mesh.gradient_ranks > 1 and self.state is None:
            raise RuntimeError(
                "powersgd: the sharding plugin of this run does not use the kernel's DDP; remove powersgd"
            )
        if self.state is None:
            run.say("powersgd: one gradient rank, nothing to compress")
            return
        rank, start = self.config.powersgd_rank, self.state.start_powerSGD_iter + 1
        run.say(f"powersgd: rank-{rank} gradients over {run.mesh.gradient_ranks} ranks from step {start}")

    @hookimpl
    def ktrain_on_train_end(self, run: Any, engine: Any, metrics: dict[str, float]) -> None:
        """Say how much less was sent."""
        if self.state is not None and self.state.total_numel_after_compression:
            rate, before, after = self.state.compression_stats()
            run.say(f"powersgd: sent {after:,} of {before:,} gradient elements (x{rate:.1f} less)")

    def state_dict(self) -> dict[str, Any]:
        """Tensors, numbers and strings only (checkpoints are read back with ``weights_only=True``)."""
        if self.state is None:
            return {"gradient_ranks": 1}
        s = self.state
        name, keys, position, has_gauss, cached = s.rng.get_state()
        return {
            "gradient_ranks": self.run.mesh.gradient_ranks,
            "iter": s.iter,
            "parameters": self.aligned.per_parameter(),
            "rng": [str(name), torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(cached)],
            "numel": [s.total_numel_before_compression, s.total_numel_after_compression, s.next_stats_report],
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore the state; at another number of gradient ranks every rank starts PowerSGD afresh instead."""
        if self.state is None:  # one gradient rank: nothing is compressed
            return
        if saved["gradient_ranks"] != self.run.mesh.gradient_ranks:
            self.run.say(f"powersgd: saved over {saved['gradient_ranks']} ranks; compression starts afresh")
            return
        s = self.state
        s.iter = saved["iter"]
        self.aligned.restore(saved["parameters"])
        name, keys, position, has_gauss, cached = saved["rng"]
        s.rng.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
        s.total_numel_before_compression, s.total_numel_after_compression, s.next_stats_report = saved["numel"]

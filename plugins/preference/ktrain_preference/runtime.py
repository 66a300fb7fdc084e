"""The runtime object of a preference run: the reference model, the objective, and its metrics.

Registered by the entry module only when ``rl`` is written; it owns the role ``objective``. The
reference is the base with the adapter switched off when the model is a peft adapter (no copy), else a
frozen copy of the model as loaded, taken before any training step (so a resumed run has the same one) and
placed by the owner of ``sharding`` (``ktrain_shard_frozen``: sharded as the policy is under FSDP2 and ZeRO-3,
else whole on every rank; ``ktrain_preference.frozen_copy``).
ORPO and SimPO need none; under ``precompute_ref_log_probs`` there is none either: the reference's
log-probabilities are computed before the first step (``ktrain_preference.reference``).
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_preference.keys import REFERENCE_FREE


class Preference:
    """Owner of ``objective`` in preference runs (``rl: dpo``, ``ipo``, ``orpo``, ``simpo``, ``kto``)."""

    def __init__(self, config: Any):
        self.config = config
        self.copy: Any = None
        self.head = False
        self.objective: Any = None

    @hookimpl(trylast=True)
    def ktrain_wrap_model(self, model: Any, run: Any) -> None:
        """Keep a frozen copy of the loaded model as the reference, unless an adapter can be switched off (or the
        method needs no reference); give the model (and the copy) the chunked log-probability head."""
        from ktrain_preference.frozen_copy import frozen_copy
        from ktrain_preference.logps import add_logps_head

        live = self.config.rl not in REFERENCE_FREE and not self.config.precompute_ref_log_probs
        if live and not hasattr(model, "disable_adapter"):
            self.copy = frozen_copy(model)
            add_logps_head(self.copy)
        self.head = add_logps_head(model.get_base_model() if hasattr(model, "get_base_model") else model)
        if run.is_main and self.config.rl not in REFERENCE_FREE:
            if self.copy is not None:
                kind = "a frozen copy of the model as loaded"
            elif not live:
                kind = "precomputed before training (no reference model)"
            else:
                kind = "the base with the adapter switched off"
            print(f"preference: the reference is {kind}", flush=True)

    @hookimpl
    def ktrain_build_objective(self, run: Any, engine: Any) -> Any:
        from ktrain_preference.kto import UnpairedObjective
        from ktrain_preference.layout import shared_attention
        from ktrain_preference.objective import PairObjective, adapter_off, frozen

        reference = None
        live = self.config.rl not in REFERENCE_FREE and not self.config.precompute_ref_log_probs
        if live and self.copy is None:
            reference = adapter_off(run.model, self.head)
        elif live:
            reference = frozen(self._placed(run), self.head)
        if self.config.rl == "kto":
            self.objective = UnpairedObjective(self.config, reference, run.device, self.head)
        else:
            attention = shared_attention(run.model)
            self.objective = PairObjective(self.config, reference, run.device, self.head, attention)
            if run.is_main:
                how = "once for both answers" if attention else "once for each answer (two rows a pair)"
                print(f"preference: a pair's prompt is computed {how}", flush=True)
        if self.config.precompute_ref_log_probs:  # before any step: the model is still the reference
            from ktrain_preference.reference import precomputed

            self.objective.precomputed = precomputed(run, self.objective, run.model)
        return self.objective

    def _placed(self, run: Any) -> Any:
        """The frozen copy as the owner of ``sharding`` places it (``ktrain_shard_frozen``: sharded as the policy is,
        or None: whole on every rank), and what each rank holds of it, said once."""
        from ktrain.run import distributed
        from ktrain_preference.frozen_copy import held

        placed = run.hook.ktrain_shard_frozen(module=self.copy, run=run)
        self.copy = placed if placed is not None else self.copy.to(run.device)
        mine, total = held(self.copy)
        shares = distributed.all_reduce_sum([float(mine) if r == run.rank else 0.0 for r in range(run.world_size)])
        if run.is_main:
            ranks = ", ".join(f"{int(v):,}" for v in shares)
            how = "whole on every rank" if all(v == total for v in shares) else "sharded like the policy"
            print(f"preference: the reference is {how}: the ranks hold {ranks} of its {total:,} parameters",
                  flush=True)  # fmt: skip
        return self.copy

    @hookimpl
    def ktrain_collect_metrics(self, run: Any, step: int) -> dict[str, float]:
        """TRL's rewards/* and logps/* (and KTO's kl) of the rows trained since the last logged step."""
        return self.objective.metrics()

"""The plugin's config keys: ``fsdp_version``, ``fsdp_config`` (FSDP2 and FSDP1 spellings) and the older ``fsdp`` list.

Every key of ``fsdp_config`` defaults to None, meaning "not written": the resolved value (a default of
the chosen version, or a migrated FSDP1 value) is decided in ``ktrain_fsdp.options``, which also says
when a key has no effect.
"""

from __future__ import annotations

from typing import Literal

import attrs

from ktrain.config.keys import key

WRAP_POLICIES = Literal["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
STATE_DICT_TYPES = Literal["FULL_STATE_DICT", "SHARDED_STATE_DICT"]
SHARDING_STRATEGIES = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
LIST_FORM_ITEMS = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "offload", "auto_wrap")


@attrs.define(kw_only=True)
class FsdpConfig:
    """Keys of ``fsdp_config``: FSDP2's names, and FSDP1's with the ``fsdp_`` prefix."""

    # Axolotl's spellings of the top-level fsdp_version
    fsdp_version: int | None = key(None, "Axolotl's place for the top-level fsdp_version (read as it; write it there)")
    version: int | None = key(None, "Axolotl's other spelling of fsdp_config.fsdp_version")
    # FSDP2 (fsdp_version: 2)
    reshard_after_forward: bool | None = key(
        None, "FSDP2: free gathered weights after forward (true, the FULL_SHARD of FSDP1) or keep them (false)"
    )
    offload_params: bool | None = key(None, "keep sharded parameters, gradients and optimizer state in CPU memory")
    cpu_ram_efficient_loading: bool | None = key(
        None, "rank 0 reads the weights; the other ranks build the model on the meta device and receive them"
    )
    auto_wrap_policy: WRAP_POLICIES | None = key(
        None, "which submodules become FSDP units: transformer blocks (default), by size, or none (root only)"
    )
    transformer_layer_cls_to_wrap: str | list[str] | None = key(
        None, "class name(s) of the transformer block (default: the model's _no_split_modules)"
    )
    min_num_params: int | None = key(None, "SIZE_BASED_WRAP: parameters a unit holds at least")
    state_dict_type: STATE_DICT_TYPES | None = key(
        None, "checkpoints: SHARDED_STATE_DICT (DCP shards, default) or FULL_STATE_DICT (one safetensors model)"
    )
    activation_checkpointing: bool | None = key(None, "recompute each transformer block's activations in backward")
    activation_checkpointing_fraction: float | None = key(
        None, "FSDP2: the share of transformer blocks recomputed, spread evenly (default 1.0: every block)"
    )
    activation_checkpointing_scope: Literal["block", "mlp"] | None = key(
        None, "FSDP2: what is recomputed in each chosen block: the whole block (default) or only its MLP"
    )
    # FSDP1 (fsdp_version: 1)
    fsdp_sharding_strategy: SHARDING_STRATEGIES | None = key(None, "FSDP1: what is sharded (default FULL_SHARD)")
    sharding_strategy: SHARDING_STRATEGIES | None = key(
        None, "Axolotl's spelling of fsdp_sharding_strategy; under FSDP2, reshard_after_forward"
    )
    fsdp_reshard_after_forward: bool | None = key(None, "Axolotl's spelling of reshard_after_forward (FSDP2)")
    fsdp_offload_params: bool | None = key(None, "FSDP1 spelling of offload_params")
    fsdp_cpu_ram_efficient_loading: bool | None = key(None, "FSDP1 spelling of cpu_ram_efficient_loading")
    fsdp_auto_wrap_policy: WRAP_POLICIES | None = key(None, "FSDP1 spelling of auto_wrap_policy")
    fsdp_transformer_layer_cls_to_wrap: str | list[str] | None = key(
        None, "FSDP1 spelling of transformer_layer_cls_to_wrap"
    )
    fsdp_min_num_params: int | None = key(None, "FSDP1 spelling of min_num_params")
    fsdp_state_dict_type: STATE_DICT_TYPES | None = key(None, "FSDP1 spelling of state_dict_type")
    fsdp_activation_checkpointing: bool | None = key(None, "FSDP1 spelling of activation_checkpointing")
    fsdp_backward_prefetch: Literal["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"] | None = key(
        None, "FSDP1: when the next unit's all-gather is issued in backward (default BACKWARD_PRE)"
    )
    fsdp_forward_prefetch: bool | None = key(None, "FSDP1: issue the next unit's all-gather early in forward")
    fsdp_use_orig_params: bool | None = key(None, "FSDP1: expose the original parameters (default true)")
    fsdp_sync_module_states: bool | None = key(None, "FSDP1: broadcast rank 0's weights at wrap time (default true)")
    fsdp_limit_all_gathers: bool | None = key(None, "FSDP1: rate-limit all-gathers (default true)")


@attrs.define(kw_only=True)
class FsdpKeys:
    """Keys of ktrain-plugin-fsdp (top level)."""

    fsdp_version: int | None = key(
        None, "2: FSDP2 (fully_shard, recommended); 1: FSDP1 (FullyShardedDataParallel, the default when unset)"
    )
    fsdp_config: FsdpConfig | None = key(None, "FSDP settings (see ktrain-plugin-fsdp's README)")
    fsdp: list[str] | str | None = key(
        None, f"older list form of FSDP1 options: {', '.join(LIST_FORM_ITEMS)} (a list or a space-separated string)"
    )

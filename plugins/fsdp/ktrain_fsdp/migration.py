"""FSDP1 spellings and their FSDP2 equivalents: one table shared by ``ktrain check`` and ``ktrain migrate``.

The move from FSDP1 to FSDP2: the ``fsdp_`` prefix goes; ``fsdp_sharding_strategy`` becomes
``reshard_after_forward`` (FULL_SHARD: true, SHARD_GRAD_OP: false); HYBRID_SHARD becomes a replicate
dimension (``dp_replicate_size``); keys that tune FSDP1's flat parameters and its prefetching have no
FSDP2 meaning and are dropped. Axolotl also accepts ``fsdp_config`` keys with the ``fsdp_`` prefix taken off
(``sharding_strategy``) or put on (``fsdp_reshard_after_forward``); both are FSDP1 spellings here.
Imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

import attrs

RENAMED = {
    "fsdp_offload_params": "offload_params",
    "fsdp_cpu_ram_efficient_loading": "cpu_ram_efficient_loading",
    "fsdp_auto_wrap_policy": "auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap": "transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "min_num_params",
    "fsdp_state_dict_type": "state_dict_type",
    "fsdp_activation_checkpointing": "activation_checkpointing",
}

NO_FSDP2_MEANING = {
    "fsdp_backward_prefetch": "FSDP2 always prefetches the next block's all-gather in backward",
    "fsdp_forward_prefetch": "FSDP2 always overlaps the next block's all-gather with forward",
    "fsdp_use_orig_params": "FSDP2 always keeps the original parameters (one DTensor each)",
    "fsdp_sync_module_states": (
        "FSDP2 does not broadcast at wrap time: every rank builds the same weights (same seed and files), "
        "and cpu_ram_efficient_loading: true sends rank 0's"
    ),
    "fsdp_limit_all_gathers": "FSDP2 needs no all-gather rate limiter",
}

# FSDP2 keys written with FSDP1's prefix (Axolotl takes the prefix off)
PREFIXED = {"fsdp_reshard_after_forward": "reshard_after_forward"}

# The sharding strategy: FSDP1's spelling and Axolotl's unprefixed one
STRATEGY_KEYS = ("fsdp_sharding_strategy", "sharding_strategy")

# fsdp_sharding_strategy -> reshard_after_forward
RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True}

# Items of the older list form (``fsdp: [full_shard, auto_wrap]``) as FSDP1 keys.
LIST_FORM = {
    "full_shard": ("fsdp_sharding_strategy", "FULL_SHARD"),
    "shard_grad_op": ("fsdp_sharding_strategy", "SHARD_GRAD_OP"),
    "no_shard": ("fsdp_sharding_strategy", "NO_SHARD"),
    "hybrid_shard": ("fsdp_sharding_strategy", "HYBRID_SHARD"),
    "offload": ("fsdp_offload_params", True),
    "auto_wrap": ("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"),
}


def yaml_value(value: Any) -> str:
    """``value`` as it is written in YAML (true, FULL_SHARD, [A, B])."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    return str(value)


@attrs.frozen
class Change:
    """What one FSDP1 key becomes under FSDP2.

    ``fsdp_config`` holds the FSDP2 keys that replace it, ``top`` the top-level keys it needs,
    ``dropped`` why it is left out (it has no FSDP2 meaning), and ``error`` why it cannot be carried
    over (a value FSDP2 cannot express).
    """

    key: str
    value: Any
    fsdp_config: dict[str, Any] = attrs.Factory(dict)
    top: dict[str, Any] = attrs.Factory(dict)
    error: str | None = None
    dropped: str | None = None
    needs_replicas: bool = False

    def spelling(self) -> str:
        parts = [f"fsdp_config.{k}: {yaml_value(v)}" for k, v in self.fsdp_config.items()]
        parts += [f"{k}: {yaml_value(v)}" for k, v in self.top.items()]
        if self.needs_replicas:
            parts.append("dp_replicate_size: <replicas> (shards inside a replica, replicas across)")
        return " and ".join(f"`{p}`" for p in parts)

    def message(self) -> str:
        """The note ``ktrain check`` prints for this key under ``fsdp_version: 2``."""
        if self.error:
            return self.error
        if self.dropped:
            return (
                f"FSDP1 key with no FSDP2 meaning ({self.dropped}); ignored under fsdp_version: 2: "
                "remove it (`ktrain migrate` removes it)"
            )
        return f"FSDP1 spelling under fsdp_version: 2; FSDP2 writes {self.spelling()} (`ktrain migrate` rewrites it)"


def change_of(name: str, value: Any) -> Change:
    """The FSDP2 form of the FSDP1 key ``name`` (inside ``fsdp_config``) set to ``value``."""
    if name in RENAMED:
        return Change(name, value, fsdp_config={RENAMED[name]: value})
    if name in PREFIXED:
        return Change(name, value, fsdp_config={PREFIXED[name]: value})
    if name in NO_FSDP2_MEANING:
        return Change(name, value, dropped=NO_FSDP2_MEANING[name])
    if name in STRATEGY_KEYS:
        if value == "NO_SHARD":
            return Change(
                name,
                value,
                error="NO_SHARD has no FSDP2 meaning: for plain data parallelism (DDP) remove fsdp_version and "
                "fsdp_config; to shard, use reshard_after_forward: true (FULL_SHARD) or false (SHARD_GRAD_OP)",
            )
        return Change(
            name, value, fsdp_config={"reshard_after_forward": RESHARD[value]}, needs_replicas=value == "HYBRID_SHARD"
        )
    raise KeyError(name)


def is_fsdp1_key(name: str) -> bool:
    """Whether ``name`` (inside ``fsdp_config``) is an FSDP1 spelling."""
    return name in RENAMED or name in PREFIXED or name in NO_FSDP2_MEANING or name in STRATEGY_KEYS


def list_form(items: list[str] | str) -> tuple[dict[str, Any], list[str]]:
    """The FSDP1 keys the older ``fsdp:`` list stands for, and the items it does not know."""
    names = items.split() if isinstance(items, str) else list(items)
    keys: dict[str, Any] = {}
    unknown = []
    for item in names:
        if item in LIST_FORM:
            name, value = LIST_FORM[item]
            keys[name] = value
        else:
            unknown.append(item)
    return keys, unknown

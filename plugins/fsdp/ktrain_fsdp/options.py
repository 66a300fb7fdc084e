"""From the written keys to one resolved set of FSDP options, with every problem and note reported.

``resolve`` is called by ``ktrain_validate_config`` (its report is printed by ``ktrain check``) and
again on every rank (its report is dropped there: the launching process already stopped on errors).
Imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

import attrs

from ktrain_fsdp.keys import LIST_FORM_ITEMS, FsdpConfig
from ktrain_fsdp.migration import PREFIXED, RENAMED, RESHARD, change_of, is_fsdp1_key, list_form, yaml_value

AC_CHOICES = ("activation_checkpointing_fraction", "activation_checkpointing_scope")
FSDP2_NAMES = (*RENAMED.values(), "reshard_after_forward", *AC_CHOICES)
VERSION_KEYS = ("fsdp_version", "version")  # inside fsdp_config: Axolotl's places for the top-level key


@attrs.frozen
class FsdpOptions:
    """Resolved FSDP settings of a run (defaults filled in, FSDP1 spellings migrated)."""

    version: int
    sharding_strategy: str = "FULL_SHARD"
    reshard_after_forward: bool = True
    offload_params: bool = False
    cpu_ram_efficient_loading: bool = False
    auto_wrap_policy: str = "TRANSFORMER_BASED_WRAP"
    layer_classes: tuple[str, ...] = ()
    min_num_params: int | None = None
    state_dict_type: str = "SHARDED_STATE_DICT"
    activation_checkpointing: bool = False
    activation_checkpointing_fraction: float = 1.0
    activation_checkpointing_scope: str = "block"
    backward_prefetch: str = "BACKWARD_PRE"
    forward_prefetch: bool = False
    use_orig_params: bool = True
    sync_module_states: bool = True
    limit_all_gathers: bool = True


def enabled(config: Any) -> bool:
    """Whether the config asks for FSDP (any of the plugin's keys is written)."""
    return any(config.is_set(name) for name in ("fsdp_version", "fsdp_config", "fsdp"))


def _written(config: Any, report: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The keys of ``fsdp_config`` and of the ``fsdp:`` list, and the path each was written at."""
    section = config.fsdp_config
    keys: dict[str, Any] = {}
    paths: dict[str, str] = {}
    if section is not None:
        for f in attrs.fields(FsdpConfig):
            value = getattr(section, f.name)
            if value is not None:
                keys[f.name], paths[f.name] = value, f"fsdp_config.{f.name}"
    if config.fsdp is not None:
        listed, unknown = list_form(config.fsdp)
        for item in unknown:
            report.error("fsdp", f"unknown item {item!r}; the list form knows {', '.join(LIST_FORM_ITEMS)}")
        for name, value in listed.items():
            if name in keys and keys[name] != value:
                report.error(
                    "fsdp", f"means {name}: {yaml_value(value)} but fsdp_config.{name} is {yaml_value(keys[name])}"
                )
            elif name not in keys:
                keys[name], paths[name] = value, "fsdp"
    return keys, paths


def _replicas(config: Any) -> bool:
    return config.dp_replicate_size > 1 or config.dp_replicate_size == -1


def _fsdp2(config: Any, keys: dict[str, Any], paths: dict[str, str], report: Any) -> dict[str, Any]:
    """FSDP2 settings: its own keys, and FSDP1 keys migrated with a note (or an error) each."""
    settings = {name: keys[name] for name in FSDP2_NAMES if name in keys}
    origin = {name: name for name in settings}  # the key each setting was written as
    for name, value in keys.items():
        if not is_fsdp1_key(name):
            continue
        change = change_of(name, value)
        if change.error:
            report.error(paths[name], change.error)
            continue
        if change.dropped:
            report.warn(paths[name], change.message())
            continue
        clash = [new for new, v in change.fsdp_config.items() if new in settings and settings[new] != v]
        if clash:
            new, other = clash[0], origin[clash[0]]
            said = "is" if other == new else f"says {new}:"
            report.error(
                paths[name],
                f"says {new}: {yaml_value(change.fsdp_config[new])} but fsdp_config.{other} {said} "
                f"{yaml_value(settings[new])}; remove {name} (the FSDP1 spelling)",
            )
            continue
        settings.update(change.fsdp_config)
        origin.update(dict.fromkeys(change.fsdp_config, name))
        if change.needs_replicas and not _replicas(config):
            report.error(
                paths[name],
                "HYBRID_SHARD is a replicate dimension under FSDP2: remove it, set reshard_after_forward: true and "
                "dp_replicate_size to the number of replicas (dp_shard_size: the ranks inside one replica)",
            )
        else:
            report.warn(paths[name], change.message())
    return settings


def _fsdp1(config: Any, keys: dict[str, Any], paths: dict[str, str], report: Any) -> dict[str, Any]:
    """FSDP1 settings under their FSDP2 names; FSDP2 spellings are errors here."""
    for name in (*FSDP2_NAMES, *PREFIXED):
        if name in AC_CHOICES and name in keys:
            report.error(paths[name], "is FSDP2 only (FSDP1 recomputes every block whole); set fsdp_version: 2")
        elif name in keys:
            fsdp1 = "fsdp_sharding_strategy" if "reshard_after_forward" in name else f"fsdp_{name}"
            report.error(
                paths[name], f"is the FSDP2 spelling; under fsdp_version: 1 write {fsdp1}, or set fsdp_version: 2"
            )
    settings = {new: keys[old] for old, new in RENAMED.items() if old in keys}
    strategy = _fsdp1_strategy(keys, paths, report)
    settings["reshard_after_forward"] = RESHARD.get(strategy, True)
    if config.tensor_parallel_size != 1 or config.context_parallel_size != 1:
        report.error("fsdp_version", "FSDP1 does not combine with tensor or context parallelism; set fsdp_version: 2")
    if _replicas(config) and strategy != "HYBRID_SHARD":
        report.error(
            "dp_replicate_size",
            f"replicas under FSDP1 need fsdp_config.fsdp_sharding_strategy: HYBRID_SHARD (it is {strategy}); "
            "or set fsdp_version: 2, where dp_replicate_size x dp_shard_size is HSDP",
        )
    if strategy == "HYBRID_SHARD" and not _replicas(config):
        report.warn(
            _path(paths, "fsdp_sharding_strategy", "sharding_strategy"),
            "HYBRID_SHARD replicates across dp_replicate_size, which is 1: this shards like FULL_SHARD; "
            "set dp_replicate_size to the number of replicas",
        )
    if keys.get("fsdp_use_orig_params") is False and config.weight_decay:
        report.error(
            paths["fsdp_use_orig_params"],
            "false flattens parameters, so weight_decay cannot skip biases and norms; set it to true "
            "(or weight_decay: 0)",
        )
    if settings.get("cpu_ram_efficient_loading") and keys.get("fsdp_sync_module_states") is False:
        report.error(
            paths["fsdp_sync_module_states"],
            "cpu_ram_efficient_loading needs it true: rank 0's weights reach the other ranks at wrap time",
        )
    return {"sharding_strategy": strategy, **settings}


def _fsdp1_strategy(keys: dict[str, Any], paths: dict[str, str], report: Any) -> str:
    """FSDP1's sharding strategy from ``fsdp_sharding_strategy`` or Axolotl's unprefixed ``sharding_strategy``."""
    strategy = keys.get("fsdp_sharding_strategy")
    plain = keys.get("sharding_strategy")
    if plain is not None and strategy is not None and plain != strategy:
        report.error(
            paths["sharding_strategy"],
            f"is {plain} but fsdp_config.fsdp_sharding_strategy is {strategy}; keep one (fsdp_sharding_strategy)",
        )
    elif plain is not None:
        report.warn(
            paths["sharding_strategy"],
            f"Axolotl's spelling under fsdp_version: 1; FSDP1 writes `fsdp_config.fsdp_sharding_strategy: {plain}`",
        )
    return strategy or plain or "FULL_SHARD"


def _version(config: Any, keys: dict[str, Any], paths: dict[str, str], report: Any) -> tuple[Any, str]:
    """The FSDP version written, from the top level or (Axolotl's places) from inside ``fsdp_config``, and the
    path it was read from; the inner spellings leave ``keys``, each with a note, or an error where they differ."""
    top = config.fsdp_version
    inner = {name: keys.pop(name) for name in VERSION_KEYS if name in keys}
    first = None
    for name, value in inner.items():
        other, other_value = ("fsdp_version", top) if top is not None else (first and paths[first], inner.get(first))
        if other is not None and value != other_value:
            report.error(
                paths[name],
                f"is {value} but {other} is {other_value}; write the version once, as the top-level fsdp_version",
            )
        elif other is not None:
            report.warn(paths[name], f"repeats fsdp_version: {value}; remove it (the top-level key is the one read)")
        else:
            report.warn(
                paths[name],
                f"read as the top-level `fsdp_version: {value}` (Axolotl's place for it); write it at the top level",
            )
            first = name
    if top is not None or first is None:
        return top, "fsdp_version"
    return inner[first], paths[first]


def layer_key(options: FsdpOptions) -> str:
    """The key path of the block classes, in the spelling of the version in use."""
    return "fsdp_config." + ("fsdp_" if options.version == 1 else "") + "transformer_layer_cls_to_wrap"


def resolve(config: Any, report: Any) -> FsdpOptions:
    """The options of ``config``; problems and notes go to ``report`` (``error``/``warn`` with the key path)."""
    keys, paths = _written(config, report)
    version, version_path = _version(config, keys, paths, report)
    if version not in (None, 1, 2):
        report.error(version_path, f"must be 2 (FSDP2, recommended) or 1 (FSDP1), not {version}")
        version = 2
    if version is None:
        version = 1
        report.warn(
            "fsdp_version",
            "not set, so FSDP1 as in Axolotl; FSDP2 is recommended: set fsdp_version: 2 "
            "(`ktrain migrate CONFIG` rewrites the file)",
        )
    if version == 2:
        settings = _fsdp2(config, keys, paths, report)
        settings["sharding_strategy"] = (
            "HYBRID_SHARD"
            if _replicas(config)
            else ("FULL_SHARD" if settings.get("reshard_after_forward", True) else "SHARD_GRAD_OP")
        )
    else:
        settings = _fsdp1(config, keys, paths, report)
    layers = settings.pop("transformer_layer_cls_to_wrap", None)
    if isinstance(layers, str):
        layers = [name.strip() for name in layers.split(",") if name.strip()]
    fsdp1_only = keys if version == 1 else {}  # FSDP2 ignores these keys (noted in _fsdp2)
    options = FsdpOptions(
        version=version,
        layer_classes=tuple(layers or ()),
        backward_prefetch=fsdp1_only.get("fsdp_backward_prefetch", "BACKWARD_PRE"),
        forward_prefetch=fsdp1_only.get("fsdp_forward_prefetch", False),
        use_orig_params=fsdp1_only.get("fsdp_use_orig_params", True),
        sync_module_states=fsdp1_only.get("fsdp_sync_module_states", True),
        limit_all_gathers=fsdp1_only.get("fsdp_limit_all_gathers", True),
        **settings,
    )
    _check_common(config, options, keys, paths, report)
    return options


def _path(paths: dict[str, str], *names: str) -> str:
    return next((paths[n] for n in names if n in paths), f"fsdp_config.{names[0]}")


def _check_common(config: Any, options: FsdpOptions, keys: dict[str, Any], paths: dict[str, str], report: Any) -> None:
    if config.fp16:
        report.error(
            "fp16",
            "fp16 loss scaling decides per rank whether to skip a step, so shards could disagree; "
            "use bf16: true with FSDP",
        )
    wrap = options.auto_wrap_policy
    if wrap == "SIZE_BASED_WRAP" and not options.min_num_params:
        report.error(_path(paths, "auto_wrap_policy", "fsdp_auto_wrap_policy"), "SIZE_BASED_WRAP needs min_num_params")
    if options.min_num_params is not None and options.min_num_params < 1:
        report.error(_path(paths, "min_num_params", "fsdp_min_num_params"), "must be at least 1")
    if wrap != "SIZE_BASED_WRAP" and options.min_num_params is not None:
        report.warn(_path(paths, "min_num_params", "fsdp_min_num_params"), f"has no effect under {wrap}")
    if wrap != "TRANSFORMER_BASED_WRAP" and options.layer_classes:
        path = _path(paths, "transformer_layer_cls_to_wrap", "fsdp_transformer_layer_cls_to_wrap")
        report.warn(path, f"has no effect under {wrap}")
    if options.activation_checkpointing and config.gradient_checkpointing:
        report.error(
            _path(paths, "activation_checkpointing", "fsdp_activation_checkpointing"),
            "gradient_checkpointing is true as well: both recompute activations; keep one",
        )
    fraction = options.activation_checkpointing_fraction
    if "activation_checkpointing_fraction" in keys and not 0 < fraction <= 1:
        report.error(paths["activation_checkpointing_fraction"], f"must be above 0 and at most 1, not {fraction}")
    for name in AC_CHOICES:
        if name in keys and not options.activation_checkpointing:
            report.error(
                paths[name],
                "chooses what activation_checkpointing recomputes; set fsdp_config.activation_checkpointing: true",
            )
    if options.activation_checkpointing and wrap != "TRANSFORMER_BASED_WRAP":
        report.error(
            _path(paths, "activation_checkpointing", "fsdp_activation_checkpointing"),
            "checkpoints transformer blocks, so it needs auto_wrap_policy: TRANSFORMER_BASED_WRAP",
        )

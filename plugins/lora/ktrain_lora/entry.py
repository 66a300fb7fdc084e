"""Entry module of ktrain-plugin-lora: the adapter keys, their checks, and ``ktrain merge-lora``.

Imports nothing heavy: peft, bitsandbytes and torch are imported by the runtime object
(``ktrain_lora.runtime``), which is activated only when the config asks for an adapter, and by
``ktrain_lora.merge`` when the command runs.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_lora.checks import validate
from ktrain_lora.keys import LoraKeys, adapter_kind

KTRAIN_ROLES = ("export",)


@hookimpl
def ktrain_register_config(register) -> None:
    register(LoraKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """Adapter, quantization and sharding combinations (``ktrain_lora.checks``)."""
    validate(config, report)


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """The adapter takes part when ``adapter`` (or ``qlora: true``) is written."""
    if adapter_kind(config) is None:
        return
    keys = tuple(name for name in ("adapter", "qlora", "load_in_4bit", "load_in_8bit") if config.is_set(name))
    activate("ktrain_lora.runtime:Lora", roles=KTRAIN_ROLES, keys=keys)


@hookimpl
def ktrain_register_commands(register) -> None:
    register("merge-lora", "merge a run's adapter into its base: safetensors transformers loads", _configure, _merge)


def _configure(parser: Any) -> None:
    parser.add_argument("run_dir", help="output_dir of an adapter run")
    parser.add_argument("--checkpoint", help="merge this checkpoint's adapter instead of the final one (final/)")
    parser.add_argument("--output", help="folder to write (default: RUN_DIR/merged)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="dtype of the merged weights (default: bfloat16 for bf16 runs, float16 for fp16, else float32)",
    )


def _merge(args: Any) -> int:
    from ktrain_lora.merge import merge_cli

    return merge_cli(args.run_dir, args.checkpoint, args.output, args.dtype)


@hookimpl
def ktrain_collect_memory(config: Any) -> dict[str, Any] | None:
    """The adapter's part of one rank's memory model (``ktrain_lora.memory``): a frozen, maybe packed base."""
    from ktrain_lora.memory import collect_memory

    return collect_memory(config)

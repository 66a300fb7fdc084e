"""The ``ktrain`` command line.

Exit codes: 0 success; 1 training failed (a rank raised or died); 2 bad input (config, plugins,
output_dir), reported before any rank starts; 130 interrupted. ``--help``, ``check``, ``keys``,
``plugins`` and ``hooks`` import no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ktrain import __version__

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML run config")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key (nested: fsdp_config.offload_params=true; list items: datasets.0.path=x)",
    )


def _configure_run(p: argparse.ArgumentParser) -> None:
    _add_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start afresh in an output_dir of an earlier run")
    launch = p.add_argument_group("launch (passed to torch.distributed.run)")
    launch.add_argument("--nproc-per-node", type=int, help="ranks on this machine (default: what the mesh asks)")
    launch.add_argument("--nnodes", type=int, help="machines in the run (default: SLURM's/torchrun's variables, or 1)")
    launch.add_argument("--node-rank", type=int, help="this machine's index (default: as --nnodes, or 0)")
    launch.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous (several machines)")
    launch.add_argument("--rdzv-backend", default="c10d", help="rendezvous backend")
    launch.add_argument("--rdzv-id", help="id shared by the machines of one run (default: SLURM's job id, or ktrain)")
    launch.add_argument(
        "--rdzv-timeout", type=int, default=600, help="seconds the machines wait for each other at the rendezvous"
    )
    launch.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restart all ranks this many times after a failure, each time from the latest complete checkpoint",
    )


def _configure_check(p: argparse.ArgumentParser) -> None:
    _add_config_args(p)
    p.add_argument("--world-size", type=int, default=None, help="resolve the mesh for this many ranks")
    p.add_argument("--all", action="store_true", help="print every key, not only those set")
    p.add_argument("--slurm", action="store_true", help="also print the launch SLURM's/torchrun's variables give")
    p.add_argument("--gpu-memory", metavar="SIZE", help="also predict the peak memory per rank against SIZE (80GiB)")


def _configure_preprocess(p: argparse.ArgumentParser) -> None:
    _add_config_args(p)
    p.add_argument("--check-only", action="store_true", help="check the data and report; write nothing")


def _configure_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="output_dir of a finished run (or a model folder)")
    p.add_argument("prompt", help="the user message")
    p.add_argument("--max-new-tokens", type=int, default=64)


def _configure_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="output_dir of a run")
    p.add_argument("--checkpoint", help="checkpoint folder (default: the latest complete one)")
    p.add_argument("--output", help="folder to write (default: RUN_DIR/export-step-N)")


def _configure_bench(p: argparse.ArgumentParser) -> None:
    _add_config_args(p)
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--synthetic", action="store_true", help="random tokens even when the config has datasets")
    p.add_argument(
        "--lengths",
        metavar="MEDIAN:MAX",
        help="random-token samples of log-normal lengths (sigma 1) around MEDIAN, at most MAX tokens: packed under "
        "sample_packing; the peer gets them one a row, padded to the longest of its micro-batch",
    )
    p.add_argument(
        "--pairs",
        metavar="PROMPT:ANSWER",
        help="random-token preference pairs (rl configs): a prompt of PROMPT tokens, two answers of ANSWER",
    )
    p.add_argument(
        "--peer",
        choices=["hf", "trl", "axolotl", "torchtitan"],
        help="also time a peer, first, on the same rows: hf, the plain Hugging Face step; trl, TRL's DPOTrainer; "
        "axolotl, Axolotl itself on the same YAML (torchtitan is refused: its release needs a PyTorch nightly)",
    )
    p.add_argument(
        "--peer-micro-batch",
        type=int,
        metavar="N",
        help="with --lengths: the peer's micro batch in samples (default: micro_batch_size)",
    )
    p.add_argument(
        "--peer-variant",
        choices=["mixed", "bf16"],
        default="mixed",
        help="mixed: fp32 weights + autocast to the config's compute dtype (default); bf16: bf16 weights",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON to FILE")
    p.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="then profile 3 more steps: the top kernels by device time, or a Chrome trace (FILE.json[.gz]), to FILE",
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="time the step on N ranks of this machine (N GPUs, or CPU ranks; default: what the config's mesh sizes "
        "ask, else 1); without --peer, --profile, --lengths",
    )


def _configure_none(p: argparse.ArgumentParser) -> None:
    del p


def _run(args: argparse.Namespace) -> int:
    from ktrain.launcher import launch

    return launch(args)


def _bench(args: argparse.Namespace) -> int:
    from ktrain.bench.command import bench_cli

    return bench_cli(args)


def _check(args: argparse.Namespace) -> int:
    from ktrain.commands.describe import describe_plan
    from ktrain.config.plan import prepare

    world_size = args.world_size
    if args.slurm:
        from ktrain.config.cluster import describe_environment

        line, world_size = describe_environment(world_size)
        print(line)
    plan = prepare(args.config, args.overrides, world_size=world_size)
    print(describe_plan(plan, every_key=args.all))
    if args.gpu_memory:
        from ktrain.commands.plan import check_memory

        print(check_memory(plan, args.config, args.overrides, args.gpu_memory))
    return EXIT_OK


def _configure_plan(p: argparse.ArgumentParser) -> None:
    from ktrain.commands.plan import configure

    configure(p)


def _plan(args: argparse.Namespace) -> int:
    from ktrain.commands.plan import plan_cli

    return plan_cli(args)


def _preprocess(args: argparse.Namespace) -> int:
    from ktrain.data.preprocess import preprocess_cli

    return preprocess_cli(args.config, args.overrides, args.check_only)


def _keys(args: argparse.Namespace) -> int:
    from ktrain.commands.describe import describe_keys
    from ktrain.config.plan import load_plugins_and_config
    from ktrain.registry import collect

    plugins, config = load_plugins_and_config(None, [])
    names = {
        "optimizer": sorted(collect(plugins, "ktrain_register_optimizers", "optimizer").items),
        "lr_scheduler": sorted(collect(plugins, "ktrain_register_lr_schedulers", "lr scheduler").items),
    }
    print(describe_keys(config, names))
    return EXIT_OK


def _plugins(args: argparse.Namespace) -> int:
    from ktrain.commands.describe import describe_plugins
    from ktrain.config.activation import discover

    print(describe_plugins(discover()))
    return EXIT_OK


def _hooks(args: argparse.Namespace) -> int:
    from ktrain.commands.describe import describe_hooks

    print(describe_hooks())
    return EXIT_OK


def _generate(args: argparse.Namespace) -> int:
    from ktrain.commands.generate import generate_cli

    return generate_cli(args.run_dir, args.prompt, args.max_new_tokens)


def _export(args: argparse.Namespace) -> int:
    from ktrain.commands.export import export_cli

    return export_cli(args.run_dir, args.checkpoint, args.output)


def _slurm(args: argparse.Namespace) -> int:
    from ktrain.commands.slurm import slurm_cli

    return slurm_cli(args)


def _configure_slurm(p: argparse.ArgumentParser) -> None:
    from ktrain.commands.slurm import configure

    _add_config_args(p)
    configure(p)


def _env(args: argparse.Namespace) -> int:
    from ktrain.commands.env import describe_environment

    print(describe_environment())
    return EXIT_OK


Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]

COMMANDS: dict[str, Command] = {
    "run": ("train with a config (starts the ranks it needs)", _configure_run, _run),
    "bench": (
        "time a config's training step on one device (tokens/s, MFU, memory), --peer hf beside plain HF",
        _configure_bench,
        _bench,
    ),
    "check": ("validate a config and print what it resolves to; no GPU needed", _configure_check, _check),
    "plan": ("predict a config's peak memory per GPU, and the layouts that fit, fastest first", _configure_plan, _plan),
    "preprocess": (
        "tokenize the datasets once into the cache (dataset_prepared_path), or --check-only them",
        _configure_preprocess,
        _preprocess,
    ),
    "keys": ("list every config key, its owner and meaning", _configure_none, _keys),
    "plugins": ("list installed plugins: distribution, version, hooks, roles", _configure_none, _plugins),
    "hooks": ("list the hooks plugins can implement", _configure_none, _hooks),
    "generate": ("answer a prompt with a trained model", _configure_generate, _generate),
    "export": ("write a checkpoint as HF safetensors", _configure_export, _export),
    "env": ("print versions, devices and settings for a bug report", _configure_none, _env),
    "slurm": ("write (and --submit) the sbatch script of a run over SLURM nodes", _configure_slurm, _slurm),
}


def _plugin_commands() -> dict[str, Command]:
    from ktrain.config.activation import discover

    found: dict[str, Command] = {}

    def register(name: str, help: str, configure: Callable, run: Callable, *, plugin: Any) -> None:
        if name in COMMANDS or name in found:
            raise SystemExit(f"ktrain: plugin {plugin.describe()} registers the command '{name}', which exists")
        found[name] = (f"{help} [{plugin.distribution}]", configure, run)

    discover().call_with_callback("ktrain_register_commands", register=register)
    return found


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    """The argument parser with the kernel's commands and every plugin's."""
    commands = {**COMMANDS, **_plugin_commands()}
    parser = argparse.ArgumentParser(
        prog="ktrain", description="Train large language models with a microkernel and plugins."
    )
    parser.add_argument("--version", action="version", version=f"ktrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, configure, _) in commands.items():
        configure(sub.add_parser(name, help=help, description=help))
    return parser, commands


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ktrain`` console script.

    Called as the program (no ``argv``), the process ends with ``ktrain.run.hard_exit.end_process`` once the
    command is done, without the interpreter's teardown; called with ``argv`` (tests, scripts), it returns.
    """
    code = _main(argv)
    if argv is None:
        from ktrain.run.hard_exit import end_process

        end_process(code, finalize_multiprocessing=True)
    return code


def _main(argv: Sequence[str] | None) -> int:
    from ktrain.config.report import ConfigError
    from ktrain.plugins import PluginError

    with contextlib.suppress(io.UnsupportedOperation, AttributeError):  # stderr is no file when captured in-process
        faulthandler.enable()  # a crash in native code (SIGSEGV, SIGABRT) prints the Python stack that led to it

    try:
        parser, commands = build_parser()
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return EXIT_BAD_INPUT
        return commands[args.command][2](args)
    except ConfigError as e:
        print(f"ktrain: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PluginError as e:
        print(f"ktrain: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `ktrain hooks | head`
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt:
        print("ktrain: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

"""``ktrain run``: check everything, prepare the run directory, then start the ranks the mesh needs.

Each rank's output is routed (``ktrain.run.console``): ktrain's lines reach the terminal, the libraries'
output and an error's traceback go to the rank's log, ``output_dir/logs/rank-N.log``, which the line
naming a failure names too.

One rank runs in this process. More start through ``torch.distributed.run`` (the elastic launcher,
called in process), forked from a fork server that imported the libraries once (``ktrain.run.forked``):
when a rank fails, the agent stops the others, and the first failure is shown.
With ``--max-restarts N`` (one rank too then runs under the agent) the agent starts every rank again,
up to N times, and they resume from the latest complete checkpoint. Before they start, this process
tokenizes the datasets into their cache (``ktrain.data.preprocess.before_ranks``), so no rank waits in a
collective while another tokenizes. The agent passes SIGINT, SIGTERM and SIGUSR1 on to the ranks
(``ktrain.run.stop``) and waits ``STOP_TIMEOUT_S`` for a pre-empted step and its checkpoint. Several
machines pass ``--nnodes``, ``--node-rank``, ``--rdzv-endpoint`` (and ``--rdzv-id``, ``--rdzv-timeout``);
the first machine's launcher owns the run directory, the others join it (``join_run_dir``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from ktrain.commands.plan import say_memory
from ktrain.config import cluster, fast_defaults
from ktrain.config.plan import Plan, prepare
from ktrain.config.report import ConfigError
from ktrain.run.directory import Before, prepare_run_dir
from ktrain.run.host_gc import imports_uncollected
from ktrain.run.resume_check import keep_global_batch

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _plan(args: argparse.Namespace) -> Plan:
    quiet = "TORCH_CPP_LOG_LEVEL" not in os.environ  # torch's C++ warnings (a lost peer's socket) stay off the terminal
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    with imports_uncollected():
        import torch

    if quiet:  # read when torch loads; the ranks' own logs keep the warnings
        del os.environ["TORCH_CPP_LOG_LEVEL"]

    device = "cuda" if torch.cuda.is_available() else "cpu"  # what the ranks will use
    capability = (
        min(torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())) if device == "cuda" else None
    )
    requested = args.nproc_per_node * args.nnodes if args.nproc_per_node else None
    plan = prepare(args.config, args.overrides, world_size=requested, device=device, capability=capability)
    if requested is None and plan.mesh.world_size == 1:
        gpus = torch.cuda.device_count()
        if gpus > 1:
            plan = prepare(
                args.config, args.overrides, world_size=gpus * args.nnodes, device=device, capability=capability
            )
    if plan.mesh.world_size % args.nnodes:
        raise ConfigError.single(
            "--nnodes", f"the mesh has {plan.mesh.world_size} ranks, which {args.nnodes} machines cannot share evenly"
        )
    return plan


def launch(args: argparse.Namespace) -> int:
    """Run the config of ``args``; return the exit code."""
    cluster.apply(args)  # launch options a flag left unset, from SLURM's or torchrun's variables
    plan = _plan(args)
    kept = keep_global_batch(plan, args.resume, args.overwrite)
    if kept is not None:  # resumed on another number of ranks: the checkpoint's global batch, by accumulation
        args.overrides = [*args.overrides, f"gradient_accumulation_steps={kept[0]}"]
        plan = _plan(args)
        print(f"ktrain: {kept[1]}", flush=True)
    for problem in plan.warnings:
        print(f"ktrain: warning: {problem}", file=sys.stderr)
    for choice in fast_defaults.applied(plan.config):
        print(f"ktrain: {choice.line()}", flush=True)
    say_memory(plan, args)  # the predicted peak per rank, on GPUs
    before = Before(plan)
    run_dir, lock = prepare_run_dir(plan, args.resume, args.overwrite, args.node_rank)
    print(f"ktrain: {plan.mesh.describe()}; run directory {run_dir}", flush=True)
    preload = tuple(act.obj.partition(":")[0] for act in plan.plugins.activations if isinstance(act.obj, str))
    try:
        if plan.mesh.world_size == 1 and args.nnodes == 1 and not args.max_restarts:
            code = _run_here(run_dir, args.resume, preload)
        else:
            from ktrain.run.forked import start_server, stop_server

            nproc = plan.mesh.world_size // args.nnodes
            start_server(nproc, preload)  # its imports overlap the tokenizing below
            try:
                code = _data_before_ranks(run_dir, plan.mesh.world_size)
                if code == EXIT_OK:
                    worker = ["ktrain.run.worker", str(run_dir), *(["--resume"] if args.resume else [])]
                    code = run_ranks(nproc, args, worker, run_dir, preload)
            finally:
                stop_server()
        if code == EXIT_BAD_INPUT and not args.node_rank:  # the first machine's launcher owns the folder
            before.restore()
        elif code > 128:
            _say_interrupted(code - 128, run_dir)
        return code
    finally:
        lock.close()


def _data_before_ranks(run_dir: Path, world_size: int) -> int:
    """This machine's tokenizing pass before its ranks start (``ktrain.data.preprocess.before_ranks``); bad data
    is one line and exit 2 here, before any rank."""
    with imports_uncollected():
        import transformers.models.auto.tokenization_auto  # noqa: F401  (the tokenizer's machinery)

        from ktrain.data.preprocess import before_ranks
    from ktrain.run import outcome

    try:
        before_ranks(run_dir, world_size)
    except outcome.bad_input_types() as e:
        print(f"ktrain: {outcome.one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def _say_interrupted(signum: int, run_dir: Path) -> None:
    """The one line of a run stopped by a signal: which, and where it can continue from."""
    from ktrain.run.checkpoints import checkpoint_root, complete_checkpoints

    found = complete_checkpoints(checkpoint_root(run_dir))
    then = f"--resume continues from {found[-1].name}" if found else "no checkpoint was saved"
    print(f"ktrain: stopped by {signal.Signals(signum).name}; every rank stopped; {then}", file=sys.stderr, flush=True)


def _run_here(run_dir: Path, resume: bool, preload: tuple[str, ...]) -> int:
    """The run's one rank in this process, its output routed as a rank's (``ktrain.run.console``), with the
    modules a forked rank has imported (``preload``: the runtime modules of the run's plugins) imported first.

    Bad input it finds is one line (exit 2), a signal stops it (130, 143), an error is one line on the
    terminal and its traceback in the rank's log (exit 1).
    """
    from ktrain.run import console, outcome, stop
    from ktrain.run.forked import import_rank_modules

    with console.routed(run_dir, 0) as log:
        import_rank_modules(preload)
        from ktrain.run.trainer import rank_main

        try:
            with stop.handled():
                rank_main(run_dir, resume)
        except stop.Interrupted as e:
            return e.exit_code
        except outcome.bad_input_types() as e:
            print(f"ktrain: {outcome.one_line(e)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except Exception as e:
            traceback.print_exc()  # a library's writer as far as the routing goes: to the log
            error = " ".join(f"{type(e).__name__}: {e}".split())
            print(f"ktrain: the run failed.\n  error: {error}\n  its output and traceback: {log}", file=sys.stderr)
            return EXIT_FAILED
    return EXIT_OK


STOPPED = (-signal.SIGTERM, 128 + signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGUSR1)
"""Exit codes of a rank stopped by a signal: killed by the agent's SIGTERM, or stopped cleanly (``ktrain.run.stop``)."""
FORWARDED = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""Signals the agent passes on to the ranks: torch's own and SIGUSR1, SLURM's warning before the time limit."""
STOP_TIMEOUT_S = int(os.environ.get("KTRAIN_STOP_TIMEOUT_S", "120"))
"""How long the agent lets ranks told to stop finish their step and save it before it kills them."""


def _cause(failures: dict) -> tuple[int, Any]:
    """The failure that ended the run, as (rank, failure).

    Ranks the agent stopped (SIGTERM) are consequences. A rank that died without raising (killed, or
    exited) left no error file and comes first: its peers' errors ("connection reset by peer") follow
    from it, though they may be recorded earlier. Then the earliest error wins.
    """
    live = {rank: f for rank, f in failures.items() if f.exitcode not in STOPPED} or failures
    silent = {rank: f for rank, f in live.items() if not os.path.isfile(f.error_file)}
    return min((silent or live).items(), key=lambda item: (item[1].timestamp, item[0]))


def _no_message(exitcode: int) -> str:
    if exitcode < 0:
        return f"none: killed by {signal.Signals(-exitcode).name}"
    return f"none: the rank exited with code {exitcode} without raising"


def quiet_agent() -> None:
    """The elastic agent's and torchrun's own log (their warnings when they stop ranks) goes to no terminal:
    ktrain says what happened in its own line. ``LOGLEVEL`` (torch elastic's variable) set by the user keeps it."""
    import logging

    if "LOGLEVEL" in os.environ:
        return
    for name in list(logging.Logger.manager.loggerDict):  # each module's logger has its own level set
        if name.startswith(("torch.distributed.elastic", "torch.distributed.run")):
            logging.getLogger(name).setLevel(logging.ERROR + 1)


def _start_forked(parsed: argparse.Namespace, worker: list[str], preload: tuple[str, ...]) -> None:
    """What ``torchrun`` does with ``parsed``, the ranks running ``MODULE.main(ARGS)`` (``worker``) forked from
    a fork server that imported ``preload`` (``ktrain.run.forked``) instead of each starting Python afresh."""
    import uuid

    with imports_uncollected():
        from torch.distributed.launcher.api import elastic_launch
        from torch.distributed.run import config_from_args

    from ktrain.run.forked import rank_entry, start_server, stop_server

    if parsed.standalone:  # as torchrun's own: a rendezvous on a free port of this machine
        parsed.rdzv_backend, parsed.rdzv_endpoint, parsed.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, _, _ = config_from_args(parsed)
    config.start_method = "forkserver"
    start_server(config.nproc_per_node, preload)  # unless ``launch`` started it already
    try:
        elastic_launch(config=config, entrypoint=rank_entry)(*worker)
    finally:
        stop_server()


def run_ranks(
    nproc: int,
    args: argparse.Namespace,
    worker: list[str],
    run_dir: Path | None = None,
    preload: tuple[str, ...] = (),
) -> int:
    """Start ``nproc`` ranks here running ``worker`` (``MODULE ARGS...``: the module's ``main(ARGS)``) under
    the elastic agent, as ``args`` (``nnodes``, ``max_restarts``, the rendezvous) say, forked from a process that
    imported ``preload`` too (``ktrain.run.forked``); when one fails, stop the others and name the first (and its
    log, where the ranks of the run in ``run_dir`` write their tracebacks)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import get_args_parser

    from ktrain.run import console, outcome

    argv = [
        "--nproc-per-node",
        str(nproc),
        "--nnodes",
        str(args.nnodes),
        "--max-restarts",
        str(args.max_restarts),
        "--monitor-interval",
        "0.2",
        "--signals-to-handle",
        FORWARDED,
        "--shutdown-timeout",
        str(STOP_TIMEOUT_S),
    ]
    if args.rdzv_endpoint:
        argv += [
            "--rdzv-backend",
            args.rdzv_backend,
            "--rdzv-endpoint",
            args.rdzv_endpoint,
            "--rdzv-id",
            args.rdzv_id,
            "--node-rank",
            str(args.node_rank),
            "--rdzv-conf",
            f"join_timeout={args.rdzv_timeout}",
        ]
    else:
        argv += ["--standalone"]
    quiet_agent()
    # The ranks' error files, read below; a rank that has not ended (its agent stopped it too late) cannot
    # make the launcher fail on removing its folder.
    with tempfile.TemporaryDirectory(prefix="ktrain-agent-", ignore_cleanup_errors=True) as agent_files:
        argv += ["--log-dir", agent_files, "-m", *worker]
        try:
            _start_forked(get_args_parser().parse_args(argv), worker, preload)
        except SignalException as e:  # SIGINT/SIGTERM to the launcher: the agent passed it on and the ranks stopped
            return 128 + int(e.sigval)
        except RendezvousError as e:  # another machine is gone (it held the rendezvous) or never came
            error = " ".join(str(e).split())
            print(
                f"ktrain: the rendezvous at {args.rdzv_endpoint} failed: another machine of the run stopped or "
                f"cannot be reached; this machine's ranks were stopped.\n  first error: {type(e).__name__}: {error}",
                file=sys.stderr,
            )
            return EXIT_FAILED
        except ChildFailedError as e:
            rank, failure = _cause(e.failures)
            if outcome.is_bad_input(failure):
                print(f"ktrain: {failure.message['message']}", file=sys.stderr)
                return EXIT_BAD_INPUT
            if failure.exitcode in STOPPED[1:]:  # the ranks, not the launcher, were sent the signal
                return failure.exitcode
            message = failure.message if os.path.isfile(failure.error_file) else _no_message(failure.exitcode)
            if isinstance(message, dict):
                message = message.get("message", message)
            print(
                f"ktrain: rank {rank} failed (exit code {failure.exitcode}); the other ranks were stopped.\n"
                f"  first error: {str(message).strip().splitlines()[-1]}",
                file=sys.stderr,
            )
            if run_dir is not None and console.log_path(run_dir, rank).is_file():
                print(f"  its output and traceback: {console.log_path(run_dir, rank)}", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK

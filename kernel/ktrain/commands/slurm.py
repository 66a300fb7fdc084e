"""``ktrain slurm CONFIG --nodes N --gpus-per-node G``: the sbatch script a user would write for a run, written.

The script asks for one task a node (``ktrain run`` starts the node's ranks itself and reads the rest from
SLURM's variables: ``ktrain.config.cluster``), starts it on every node with ``srun``, and makes the job
survive its time limit and preemption: ``--requeue``, SIGUSR1 to every node's ``ktrain run`` two minutes
before the limit (the ranks finish their step, save a checkpoint and exit with 138), then
``scontrol requeue`` puts the job back in the queue, and ``auto_resume_from_checkpoints`` continues from the
checkpoint when it starts again. The config is checked first, as ``ktrain check`` does.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from ktrain.config.report import ConfigError
from ktrain.run.stop import SAVING

WARN_BEFORE_S = 120
"""Seconds before the time limit at which SLURM sends SIGUSR1: enough for a step and a checkpoint."""
REQUEUE_EXIT_CODES = tuple(128 + signum for signum in SAVING)
"""``ktrain run``'s exit codes after SIGTERM or SIGUSR1 stopped every rank with the step's checkpoint saved
(143, 138): the script requeues the job on them."""


def configure(p: argparse.ArgumentParser) -> None:
    """The options of ``ktrain slurm`` beside the config and its ``--set`` overrides (which cli.py adds, as for every
    command taking a config; the overrides go into the check and into the script's ``ktrain run``)."""
    p.add_argument("--nodes", type=int, required=True, help="nodes of the job")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs of each node (0 for CPU nodes)")
    p.add_argument("--nproc-per-node", type=int, help="ranks on each node (default: --gpus-per-node)")
    p.add_argument("--cpus-per-task", type=int, help="CPUs of each node's task (its ranks share them)")
    p.add_argument("--partition", help="SLURM partition")
    p.add_argument("--time", help="time limit (SLURM's format, e.g. 24:00:00)")
    p.add_argument("--account", help="account to charge")
    p.add_argument("--job-name", help="job name (default: the config's file name)")
    p.add_argument("--script", type=Path, help="where to write the script (default: ./NAME.sbatch)")
    p.add_argument("--submit", action="store_true", help="then submit it with sbatch")


def _positive(value: int | None, flag: str, low: int = 1) -> None:
    if value is not None and value < low:
        raise ConfigError.single(flag, f"is {value}; give a whole number >= {low}", source="the command")


def render(args: argparse.Namespace, config: Path, script: Path, workdir: Path) -> str:
    """The sbatch script for ``args`` (``configure``'s options), the run's ``config``, written to ``script``,
    running in ``workdir`` (where relative paths of the config resolve, as for ``ktrain run`` there)."""
    nproc = args.nproc_per_node or args.gpus_per_node or None
    run = ["ktrain", "run", str(config), "--set", "auto_resume_from_checkpoints=true"]
    for override in args.overrides:
        run += ["--set", override]
    if nproc:
        run += ["--nproc-per-node", str(nproc)]
    options: list[tuple[str, object, str]] = [  # (option, value or None to leave it out, the comment above it)
        ("job-name", args.job_name or config.stem, ""),
        ("nodes", args.nodes, ""),
        ("ntasks-per-node", 1, "one task a node: ktrain run starts the node's ranks itself"),
        ("gpus-per-node", args.gpus_per_node or None, ""),
        ("cpus-per-task", args.cpus_per_task, ""),
        ("partition", args.partition, ""),
        ("account", args.account, ""),
        ("time", args.time, ""),
        ("chdir", workdir, ""),
        ("output", script.parent / "%x-%j.out", "a requeued job adds to its log"),
        ("open-mode", "append", ""),
        ("requeue", "", "SLURM may put the job back in the queue (preemption, a failed node)"),
        ("signal", f"USR1@{WARN_BEFORE_S}", "SIGUSR1 to every node's ktrain run before the time limit: save, stop"),
    ]
    lines = ["#!/bin/bash", f"# Written by ktrain slurm; submit with: sbatch {shlex.quote(str(script))}"]
    for name, value, comment in options:
        if value is None:
            continue
        lines += [f"# {comment}"] if comment else []
        lines.append(f"#SBATCH --{name}" + (f"={value}" if value != "" else ""))
    lines.append("")
    if sys.prefix != sys.base_prefix:  # ktrain lives in a virtual environment: the nodes use it too
        lines += [f". {shlex.quote(str(Path(sys.prefix) / 'bin' / 'activate'))}", ""]
    lines += [
        "# One ktrain run a node; it reads the nodes, this node's index and the rendezvous host from SLURM.",
        "# auto_resume_from_checkpoints: a requeued job continues from the latest complete checkpoint.",
        f"srun --kill-on-bad-exit=1 {shlex.join(run)}",
        "code=$?",
        "# stopped by SIGTERM or SIGUSR1 (the time limit is near), the step's checkpoint saved: back in the queue",
        f"case $code in {'|'.join(map(str, REQUEUE_EXIT_CODES))})",
        '    scontrol requeue "$SLURM_JOB_ID" ;;',
        "esac",
        "exit $code",
        "",
    ]
    return "\n".join(lines)


def slurm_cli(args: argparse.Namespace) -> int:
    """The ``ktrain slurm`` command: check the config, write the script, print where; with ``--submit``, sbatch it."""
    from ktrain.config.plan import prepare
    from ktrain.run.files import atomic_write_text

    _positive(args.nodes, "--nodes")
    _positive(args.gpus_per_node, "--gpus-per-node", low=0)
    _positive(args.nproc_per_node, "--nproc-per-node")
    _positive(args.cpus_per_task, "--cpus-per-task")
    config = Path(args.config).expanduser().absolute()
    nproc = args.nproc_per_node or args.gpus_per_node
    plan = prepare(config, args.overrides, world_size=args.nodes * nproc if nproc else None)
    if plan.mesh.world_size % args.nodes:
        raise ConfigError.single(
            "--nodes", f"the mesh has {plan.mesh.world_size} ranks, which {args.nodes} nodes cannot share evenly"
        )
    sbatch = shutil.which("sbatch")
    if args.submit and sbatch is None:
        raise ConfigError.single(
            "--submit", "sbatch is not on PATH: run this on a SLURM login node, or leave --submit out", "the command"
        )
    script = (args.script or Path(f"{args.job_name or config.stem}.sbatch")).expanduser().absolute()
    if not script.parent.is_dir():
        raise ConfigError.single("--script", f"{script.parent} is not a folder; create it first", "the command")
    atomic_write_text(script, render(args, config, script, Path.cwd()))
    script.chmod(0o755)
    print(f"ktrain: wrote {script} ({plan.mesh.describe()} on {args.nodes} node(s))")
    if not args.submit:
        print(f"  submit it with: sbatch {shlex.quote(str(script))}")
        return 0
    done = subprocess.run([sbatch, str(script)], capture_output=True, text=True)
    if done.returncode:
        print(f"ktrain: sbatch refused {script}: {' '.join(done.stderr.split())}", file=sys.stderr)
        return 2
    print(done.stdout.strip())
    return 0

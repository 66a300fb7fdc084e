"""Where ``ktrain run`` runs when a scheduler started it: the launch read from SLURM's or torchrun's variables.

Inside a SLURM allocation (a batch script or an ``srun`` step) SLURM sets ``SLURM_*`` variables: the number
of nodes, this node's index, the node list (its first host is the rendezvous host), the GPUs of the node
and the job id (the rendezvous id). Kubernetes operators that run torchrun jobs (Kubeflow Trainer,
PyTorchJob) set torchrun's own variables: ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_NPROC_PER_NODE``,
``PET_MASTER_ADDR``/``PET_MASTER_PORT`` or ``PET_RDZV_ENDPOINT``, and the older ``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` (one a pod). ``read`` turns them into the launch options
``ktrain run`` would otherwise take as flags; a flag given on the command line wins over what was read.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping

import attrs

from ktrain.config.report import ConfigError

RDZV_PORT_BASE = 29400
"""SLURM names no port: the rendezvous listens on ``RDZV_PORT_BASE + job id % 1000`` (``MASTER_PORT`` wins), so
two jobs whose first node is the same do not meet on one port."""

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(hostlist: str) -> list[str]:
    """The hosts of a SLURM host list, in order: ``node[01-03,07]`` is node01, node02, node03, node07;
    ``a1,b[2-3]`` is a1, b2, b3; several bracket groups (``r[1-2]-n[1-2]``) expand left to right."""
    hosts: list[str] = []
    for item in _split_top_level(hostlist):
        hosts += _expand_one(item, hostlist)
    return hosts


def _split_top_level(hostlist: str) -> list[str]:
    """The comma-separated items of ``hostlist``, commas inside brackets kept in their item."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(hostlist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"host list {hostlist!r}: brackets do not nest")
        if char == "," and depth == 0:
            items.append(hostlist[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list {hostlist!r}: a bracket is not closed")
    items.append(hostlist[start:])
    if not all(items):
        raise ValueError(f"host list {hostlist!r}: an empty host name")
    return items


def _expand_one(item: str, hostlist: str) -> list[str]:
    """The hosts of one item: its first bracket group expanded, the rest of the item expanded recursively."""
    opening = item.find("[")
    if opening < 0:
        return [item]
    closing = item.index("]", opening)
    prefix, ranges, rest = item[:opening], item[opening + 1 : closing], item[closing + 1 :]
    numbers: list[str] = []
    for part in ranges.split(","):
        match = _RANGE.match(part)
        if not match:
            raise ValueError(f"host list {hostlist!r}: {part!r} is not a number or a range of numbers")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"host list {hostlist!r}: the range {part!r} goes down")
        numbers += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    tails = _expand_one(rest, hostlist) if rest else [""]
    return [prefix + number + tail for number in numbers for tail in tails]


@attrs.frozen
class Cluster:
    """The launch a scheduler's variables describe: ``None`` where they say nothing (the default applies)."""

    scheduler: str
    """Who set the variables, as printed: ``SLURM job 123``, ``torchrun variables (PET_*)``, ..."""
    nnodes: int | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    nproc_per_node: int | None = None

    def describe(self) -> str:
        """One line: what was read and what it gives."""
        parts = [f"{self.nnodes or 1} node(s), this is node {self.node_rank or 0}"]
        if self.rdzv_endpoint:
            parts.append(f"rendezvous {self.rdzv_endpoint}" + (f" (id {self.rdzv_id})" if self.rdzv_id else ""))
        if self.nproc_per_node:
            parts.append(f"{self.nproc_per_node} rank(s) a node")
        return f"{self.scheduler}: {', '.join(parts)}"


def read(env: Mapping[str, str]) -> Cluster | None:
    """The launch ``env`` describes, or None outside SLURM and torchrun-style jobs.

    Raises ``ConfigError`` naming the variable when one holds what ``ktrain run`` cannot use, or when SLURM
    started the command in a way that cannot train: outside ``srun`` on a job of several nodes, or with
    several tasks on a node (``ktrain run`` starts the node's ranks itself).
    """
    if "SLURM_JOB_ID" in env and "SLURM_NODEID" in env:  # on a node of an allocation, not on a login node
        return _slurm(env)
    if any(name in env for name in ("PET_NNODES", "PET_NODE_RANK", "PET_RDZV_ENDPOINT", "PET_MASTER_ADDR")):
        return _torchrun(env)
    if "MASTER_ADDR" in env and "WORLD_SIZE" in env:
        return _pytorchjob(env)
    return None


def _int(env: Mapping[str, str], name: str, low: int = 0) -> int:
    value = env[name].strip()
    if ":" in value and name == "PET_NNODES":
        raise ConfigError.single(
            name,
            f"is {value!r}, an elastic range of nodes; ktrain runs a fixed number: give the job as many "
            "minimum as maximum nodes (minReplicas = maxReplicas)",
            source="the environment",
        )
    if not value.isdigit() or int(value) < low:
        raise ConfigError.single(name, f"is {value!r}, not a whole number >= {low}", source="the environment")
    return int(value)


def _slurm(env: Mapping[str, str]) -> Cluster:
    job = env["SLURM_JOB_ID"]
    in_step = "SLURM_STEP_ID" in env
    nnodes = _int(env, "SLURM_STEP_NUM_NODES" if in_step and "SLURM_STEP_NUM_NODES" in env else "SLURM_NNODES", 1)
    if not in_step and nnodes > 1:
        raise ConfigError.single(
            "SLURM_NNODES",
            f"ktrain run is in the batch script of a {nnodes}-node job, outside srun: start it on every node "
            "with `srun --ntasks-per-node=1 ktrain run ...` (`ktrain slurm` writes such a script)",
            source="the environment",
        )
    if in_step and "SLURM_STEP_NUM_TASKS" in env:
        tasks = _int(env, "SLURM_STEP_NUM_TASKS", 1)
        if tasks != nnodes:
            raise ConfigError.single(
                "SLURM_STEP_NUM_TASKS",
                f"srun started {tasks} tasks on {nnodes} node(s); ktrain run starts each node's ranks itself: "
                "run one task a node (`srun --ntasks-per-node=1`)",
                source="the environment",
            )
    gpus = _int(env, "SLURM_GPUS_ON_NODE") if env.get("SLURM_GPUS_ON_NODE") else None
    cluster = Cluster(f"SLURM job {job}", nnodes, _int(env, "SLURM_NODEID"), nproc_per_node=gpus or None)
    if nnodes == 1:
        return cluster
    port = _int(env, "MASTER_PORT", 1) if "MASTER_PORT" in env else RDZV_PORT_BASE + _int(env, "SLURM_JOB_ID") % 1000
    return attrs.evolve(cluster, rdzv_endpoint=f"{_first_host(env)}:{port}", rdzv_id=job)


def _first_host(env: Mapping[str, str]) -> str:
    """The first host of the step's node list (of the job's outside a step): the rendezvous host."""
    name = next((n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if n in env), None)
    if name is None:
        raise ConfigError.single(
            "SLURM_JOB_NODELIST", "is not set, though SLURM_JOB_ID is: run ktrain in the job (srun)", "the environment"
        )
    try:
        return expand_hostlist(env[name])[0]
    except ValueError as e:
        raise ConfigError.single(name, str(e), source="the environment") from None


def _torchrun(env: Mapping[str, str]) -> Cluster:
    nnodes = _int(env, "PET_NNODES", 1) if "PET_NNODES" in env else None
    if env.get("PET_RDZV_ENDPOINT"):
        endpoint: str | None = env["PET_RDZV_ENDPOINT"]
    elif "PET_MASTER_ADDR" in env:
        endpoint = f"{env['PET_MASTER_ADDR']}:{_int(env, 'PET_MASTER_PORT', 1) if 'PET_MASTER_PORT' in env else 29500}"
    else:
        endpoint = None
    nproc = env.get("PET_NPROC_PER_NODE", "")
    several = (nnodes or 1) > 1
    return Cluster(
        scheduler="torchrun variables (PET_*)",
        nnodes=nnodes,
        node_rank=_int(env, "PET_NODE_RANK") if "PET_NODE_RANK" in env else None,
        rdzv_endpoint=endpoint if several else None,
        rdzv_id=env.get("PET_RDZV_ID") if several else None,
        nproc_per_node=_int(env, "PET_NPROC_PER_NODE", 1) if nproc.isdigit() else None,  # "auto", "gpu": the default
    )


def _pytorchjob(env: Mapping[str, str]) -> Cluster:
    """PyTorchJob without torchrun's variables: ``WORLD_SIZE`` pods, this one ``RANK``, one ``ktrain run`` a pod."""
    nnodes = _int(env, "WORLD_SIZE", 1)
    port = _int(env, "MASTER_PORT", 1) if "MASTER_PORT" in env else 29500
    return Cluster(
        scheduler="MASTER_ADDR, WORLD_SIZE and RANK (one pod a node)",
        nnodes=nnodes,
        node_rank=_int(env, "RANK") if "RANK" in env else None,
        rdzv_endpoint=f"{env['MASTER_ADDR']}:{port}" if nnodes > 1 else None,
    )


LAUNCH_DEFAULTS = {"nnodes": 1, "node_rank": 0, "rdzv_endpoint": None, "rdzv_id": "ktrain", "nproc_per_node": None}
"""The launch options ``ktrain run`` fills from a ``Cluster``, and their values when neither a flag nor a variable
gives one."""


def fill(args: argparse.Namespace, cluster: Cluster | None) -> None:
    """Set each launch option of ``args`` left unset on the command line (None) from ``cluster``, else its default."""
    for name, default in LAUNCH_DEFAULTS.items():
        if getattr(args, name, None) is None:
            derived = getattr(cluster, name) if cluster is not None else None
            setattr(args, name, default if derived is None else derived)


def apply(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Cluster | None:
    """``ktrain run``'s launch options: ``fill`` ``args`` from what ``env`` describes, and print it in one line."""
    cluster = read(env)
    fill(args, cluster)
    if cluster is not None:
        print(f"ktrain: {cluster.describe()}", flush=True)
    return cluster


def describe_environment(world_size: int | None, env: Mapping[str, str] = os.environ) -> tuple[str, int | None]:
    """``ktrain check --slurm``: the line saying what ``env`` gives ``ktrain run``, and the world size to check the
    mesh for (``world_size`` when given; else the nodes times the ranks a node, when both are known)."""
    cluster = read(env)
    if cluster is None:
        return "launch: no SLURM or torchrun variables set; ktrain run starts one node's ranks", world_size
    if world_size is None and cluster.nproc_per_node:
        world_size = cluster.nproc_per_node * (cluster.nnodes or 1)
    return f"launch: {cluster.describe()}", world_size

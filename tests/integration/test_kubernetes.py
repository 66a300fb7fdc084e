"""Two pods of a Kubernetes torchrun job (Kubeflow Trainer, PyTorchJob) on this machine: each ``ktrain run`` with
no launch flag, only the variables the operator sets (``PET_NNODES``, ``PET_NODE_RANK``, ``PET_NPROC_PER_NODE``,
``PET_MASTER_ADDR``, ``PET_MASTER_PORT``), forms one 2-rank run with the other through the rendezvous they name.
Each pod has its own ``output_dir``, as pods without a shared volume do."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from ktrain.testing import dataset, model_dir, read_metrics, write_config


def test_two_pods_meet_through_the_operators_variables(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 32)
    config = write_config(tmp_path, max_steps=2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pod = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
    pods = [
        subprocess.Popen(
            [sys.executable, "-m", "ktrain.cli", "run", str(config), "--set", f"output_dir={tmp_path / f'pod{i}'}"],
            env={**os.environ, "OMP_NUM_THREADS": "1", **pod, "PET_NODE_RANK": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in pods]
    for i, (p, out) in enumerate(zip(pods, outputs, strict=True)):
        assert p.returncode == 0, out
        assert f"ktrain: torchrun variables (PET_*): 2 node(s), this is node {i}, rendezvous 127.0.0.1:{port}" in out
    trained = [d for d in (tmp_path / "pod0", tmp_path / "pod1") if (d / "metrics.jsonl").is_file()]
    assert len(trained) == 1 and sorted(read_metrics(trained[0])) == [1, 2]  # rank 0's pod logs the run
    assert "2 ranks" in outputs[0]

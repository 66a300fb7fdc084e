"""The launch ``ktrain run`` reads from a scheduler's variables (``ktrain.config.cluster``), with the variables SLURM
and Kubernetes operators set, and the sbatch script ``ktrain slurm`` writes."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from ktrain.cli import main
from ktrain.config.cluster import LAUNCH_DEFAULTS, Cluster, expand_hostlist, fill, read
from ktrain.config.report import ConfigError
from ktrain.testing import dataset, model_dir, write_config

SRUN_STEP = {  # what SLURM 22.05 sets in the task of `srun --ntasks-per-node=1` on node 1 of a 2-node job
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURMD_NODENAME": "gpu08",
}
BATCH_SCRIPT = {  # the batch script of a 1-node job, no GPU asked for
    "SLURM_JOB_ID": "17",
    "SLURM_NNODES": "1",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_JOB_NODELIST": "cpu01",
    "SLURM_NTASKS": "1",
    "SLURM_CPUS_ON_NODE": "2",
}


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node01", ["node01"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("r[1-2]-n[09-10],x", ["r1-n09", "r1-n10", "r2-n09", "r2-n10", "x"]),
    ],
)
def test_hostlist_expands_as_slurm_writes_it(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist", ["n[1-", "n[a]", "n[3-1]", "a,,b", "n[1-2]]"])
def test_a_bad_hostlist_is_refused_with_its_text(hostlist: str) -> None:
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(hostlist)


def test_srun_step_gives_nodes_rank_rendezvous_and_gpus() -> None:
    assert read(SRUN_STEP) == Cluster(
        scheduler="SLURM job 4242",
        nnodes=2,
        node_rank=1,
        rdzv_endpoint="gpu07:29642",  # first host; port 29400 + job id % 1000
        rdzv_id="4242",
        nproc_per_node=8,
    )
    assert read({**SRUN_STEP, "MASTER_PORT": "6000"}).rdzv_endpoint == "gpu07:6000"


def test_a_one_node_batch_script_is_one_node_with_the_default_ranks() -> None:
    assert read(BATCH_SCRIPT) == Cluster(scheduler="SLURM job 17", nnodes=1, node_rank=0)


def test_outside_an_allocation_nothing_is_read() -> None:
    assert read({}) is None
    login = {k: v for k, v in SRUN_STEP.items() if k not in ("SLURM_NODEID", "SLURM_PROCID")}
    assert read(login) is None  # salloc's shell on a login node: not a node of the job


@pytest.mark.parametrize(
    "env, variable, says",
    [
        ({**BATCH_SCRIPT, "SLURM_NNODES": "2"}, "SLURM_NNODES", "outside srun"),
        ({**SRUN_STEP, "SLURM_STEP_NUM_TASKS": "16"}, "SLURM_STEP_NUM_TASKS", "one task a node"),
        ({**SRUN_STEP, "SLURM_NODEID": "x"}, "SLURM_NODEID", "not a whole number"),
        ({**SRUN_STEP, "SLURM_STEP_NODELIST": "gpu[07-"}, "SLURM_STEP_NODELIST", "not closed"),
        ({"PET_NNODES": "1:4", "PET_NODE_RANK": "0"}, "PET_NNODES", "elastic range"),
    ],
)
def test_what_cannot_train_is_refused_naming_the_variable(env: dict, variable: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"{variable}: .*{says}"):
        read(env)


def test_kubeflow_trainer_variables() -> None:
    env = {  # Kubeflow Trainer's torch runtime, pod 1 of 2
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "4",
        "PET_MASTER_ADDR": "job-node-0-0.job",
        "PET_MASTER_PORT": "29400",
    }
    assert read(env) == Cluster("torchrun variables (PET_*)", 2, 1, "job-node-0-0.job:29400", None, 4)
    assert read({**env, "PET_NPROC_PER_NODE": "auto"}).nproc_per_node is None
    elastic = {"PET_NNODES": "2", "PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_RDZV_ID": "j"}
    assert read(elastic) == Cluster("torchrun variables (PET_*)", 2, None, "job-worker-0:23456", "j")


def test_pytorchjob_master_and_worker_variables() -> None:
    env = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
    assert read(env) == Cluster(
        "MASTER_ADDR, WORLD_SIZE and RANK (one pod a node)", 3, 2, "job-master-0:23456", None, None
    )


def test_flags_win_and_defaults_fill_the_rest() -> None:
    given = argparse.Namespace(nnodes=None, node_rank=0, rdzv_endpoint=None, rdzv_id=None, nproc_per_node=2)
    fill(given, read(SRUN_STEP))
    assert vars(given) == {
        "nnodes": 2,
        "node_rank": 0,
        "rdzv_endpoint": "gpu07:29642",
        "rdzv_id": "4242",
        "nproc_per_node": 2,
    }
    bare = argparse.Namespace(nnodes=None, node_rank=None, rdzv_endpoint=None, rdzv_id=None, nproc_per_node=None)
    fill(bare, None)
    assert vars(bare) == LAUNCH_DEFAULTS


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster")
    model_dir(root)
    dataset(root, 16)
    return write_config(root, max_steps=2)


def test_check_slurm_prints_the_launch(
    config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    for name, value in SRUN_STEP.items():
        monkeypatch.setenv(name, value)
    assert main(["check", str(config), "--slurm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("launch: SLURM job 4242: 2 node(s), this is node 1, rendezvous gpu07:29642 (id 4242), 8 ")
    assert "= 16 ranks" in out  # the mesh checked for 2 nodes x 8 GPUs


def test_slurm_writes_the_script_users_write(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "job.sbatch"
    argv = ["slurm", str(config), "--nodes", "2", "--gpus-per-node", "4", "--partition", "gpu", "--time", "2:00:00"]
    assert main([*argv, "--account", "proj", "--script", str(script), "--set", "max_steps=3"]) == 0
    assert f"wrote {script}" in capsys.readouterr().out
    text = script.read_text()
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --time=2:00:00",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR1@120",
        f"srun --kill-on-bad-exit=1 ktrain run {config} --set auto_resume_from_checkpoints=true --set max_steps=3 "
        "--nproc-per-node 4",
        "case $code in 143|138)",
        '    scontrol requeue "$SLURM_JOB_ID" ;;',
    ):
        assert line + "\n" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_slurm_refuses_a_bad_config_and_writes_nothing(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    script = tmp_path / "job.sbatch"
    argv = ["slurm", str(config), "--nodes", "2", "--gpus-per-node", "1", "--script", str(script)]
    assert main([*argv, "--set", "micro_batch_sise=2"]) == 2
    assert "micro_batch_sise" in capsys.readouterr().err
    assert main([*argv[:3], "0", *argv[4:]]) == 2
    assert "--nodes: is 0" in capsys.readouterr().err
    assert not script.exists()


def test_env_prints_the_settings_rendezvous_and_network_problems_need(monkeypatch: pytest.MonkeyPatch) -> None:
    from ktrain.commands.env import describe_environment

    for name, value in {"GLOO_SOCKET_IFNAME": "eth1", "MASTER_PORT": "6000", "PET_NNODES": "2"}.items():
        monkeypatch.setenv(name, value)
    settings = describe_environment().split("settings:\n")[1].split("\n\n")[0]
    assert {"  GLOO_SOCKET_IFNAME=eth1", "  MASTER_PORT=6000", "  PET_NNODES=2"} <= set(settings.splitlines())

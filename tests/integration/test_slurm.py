"""``ktrain slurm``'s script against a real SLURM: a one-node cluster of this machine (munged, slurmctld and slurmd
with their own slurm.conf, ports and state folders in the test's folder) runs a 2-rank job on the tiny model,
warned before its time limit, requeued and resumed.

Needs Debian's slurm-wlm and munge (.ci/run installs them where apt-get is available) and root: slurmd starts
each job's processes as the job's user.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ktrain.testing import dataset, model_dir, read_metrics, write_config
from ktrain.testing.runs import ktrain

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")
MISSING = [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).is_file()]
pytestmark = [
    pytest.mark.skipif(
        bool(MISSING), reason=f"SLURM is not installed ({', '.join(MISSING)} missing): apt-get install slurm-wlm munge"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmd starts jobs as their user: it runs as root only"),
]


def _tool(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
ClusterName=ktraintest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket,cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _logs(root: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(root.glob("log/*")))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A one-node SLURM cluster of this machine; yields its folder and the environment its commands need."""
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("munge", "state", "spool", "log"):
        (root / folder).mkdir(mode=0o700)
    (root / "munge" / "munge.key").write_bytes(os.urandom(1024))
    (root / "munge" / "munge.key").chmod(0o600)
    (root / "plugstack.conf").write_text("")
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(root=root, ctld_port=_free_port(), slurmd_port=_free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge = root / "munge"
    subprocess.run(
        [_tool("munged"), "--force", f"--key-file={munge}/munge.key", f"--socket={munge}/socket",
         f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/seed", f"--log-file={root}/log/munged.log"],
        check=True, env=env,
    )  # fmt: skip
    subprocess.run([_tool("slurmctld"), "-i"], check=True, env=env)
    subprocess.run([_tool("slurmd"), "-N", "localhost"], check=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while "idle" not in subprocess.run([_tool("sinfo"), "-h", "-o", "%t"], capture_output=True, text=True,
                                           env=env).stdout:  # fmt: skip
            assert time.monotonic() < deadline, f"the SLURM node never became idle\n{_logs(root)}"
            time.sleep(0.5)
        yield root, env
    finally:
        for pid_file in (root / "slurmd.pid", root / "slurmctld.pid", munge / "munged.pid"):
            if pid_file.is_file():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)


def _wait(job: str, env: dict[str, str], root: Path, timeout: float = 240) -> dict[str, str]:
    """The job's fields (``scontrol show job``) once it has ended."""
    deadline = time.monotonic() + timeout
    while True:
        shown = subprocess.run([_tool("scontrol"), "show", "job", job], capture_output=True, text=True, env=env)
        fields = dict(re.findall(r"(\w+)=(\S*)", shown.stdout))
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return fields
        assert time.monotonic() < deadline, f"job {job} did not end: {shown.stdout}\n{_logs(root)}"
        time.sleep(1)


def test_the_script_trains_and_a_warned_job_requeues_and_resumes(
    slurm: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """The script ``ktrain slurm --submit`` wrote runs 2 ranks; SIGUSR1 to its step (what ``--signal=USR1@120``
    sends before the time limit) stops them with a checkpoint, the script requeues the job, and the job started
    again resumes from the checkpoint and finishes."""
    root, env = slurm
    model_dir(tmp_path)
    dataset(tmp_path, 64)
    config = write_config(tmp_path, max_steps=40, logging_steps=1, save_steps=1000)
    submitted = ktrain(
        "slurm", str(config), "--nodes", "1", "--gpus-per-node", "0", "--nproc-per-node", "2",
        "--cpus-per-task", "2", "--job-name", "train", "--script", str(tmp_path / "train.sbatch"), "--submit",
        env={"SLURM_CONF": env["SLURM_CONF"]},
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = re.search(r"Submitted batch job (\d+)", submitted.stdout).group(1)
    log = tmp_path / f"train-{job}.out"
    deadline = time.monotonic() + 240
    while not (log.is_file() and "step 1/40" in log.read_text()):
        assert time.monotonic() < deadline, f"job {job} logged no step\n{_logs(root)}"
        time.sleep(0.2)
    subprocess.run([_tool("scancel"), "--signal=USR1", job], env=env, check=True)
    fields = _wait(job, env, root)
    text = log.read_text()
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", f"{fields}\n{text}\n{_logs(root)}"
    assert fields["Restarts"] == "1", text
    assert f"ktrain: SLURM job {job}: 1 node(s), this is node 0" in text
    assert "ktrain: stopped by SIGUSR1" in text and "resumed from" in text, text
    assert sorted(read_metrics(tmp_path / "out")) == list(range(1, 41))


def test_a_script_sbatch_refuses_is_one_line_and_exit_code_2(
    slurm: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    _, env = slurm
    model_dir(tmp_path)
    dataset(tmp_path, 8)
    config = write_config(tmp_path, max_steps=2)
    refused = ktrain(
        "slurm", str(config), "--nodes", "1", "--gpus-per-node", "0", "--partition", "nosuch",
        "--script", str(tmp_path / "train.sbatch"), "--submit", env={"SLURM_CONF": env["SLURM_CONF"]},
    )  # fmt: skip
    assert refused.returncode == 2
    assert (
        refused.stderr.startswith(f"ktrain: sbatch refused {tmp_path / 'train.sbatch'}: ")
        and "partition" in refused.stderr
    )
    assert "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 1

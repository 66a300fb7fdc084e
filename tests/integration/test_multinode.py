"""Several machines on loopback: two ``ktrain run --nnodes 2 --node-rank {0,1} --rdzv-endpoint 127.0.0.1:PORT``
launchers (gloo, one output_dir as on a shared filesystem; two ranks each under DDP, one each under FSDP2 and
ZeRO-3) form one run whose losses equal one process's; killing one machine ends the other within a bounded
time, naming the failure; a long tokenization never trips the collectives' timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ktrain.testing import dataset, ktrain, model_dir, read_metrics, write_config
from tests.kit import REPO

STEPS = 3
RTOL = 1e-5  # fp32: the same global batch of 8 rows, its gradients summed in another order
# sharding -> (ranks a machine, keys): the global batch stays 8 rows (micro-batches of 2 on 4 ranks, of 4 on 2)
SHARDINGS = {
    "ddp": (2, {"micro_batch_size": 2}),
    "fsdp2": (1, {"fsdp_version": 2}),
    "zero3": (1, {"deepspeed": str(REPO / "tests" / "fixtures" / "deepspeed" / "zero3.json")}),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("multinode")
    model_dir(root, weights=True, attention_dropout=0.0)  # ZeRO-3 draws random weights its own way: load saved ones
    dataset(root, 200)
    return root


@pytest.fixture(scope="module")
def one_process(root: Path) -> dict[int, float]:
    """Losses of one process taking the global batch of 8 rows as 2 micro-batches of 4."""
    config = write_config(
        root,
        "one.yaml",
        random_init_weights=False,
        max_steps=STEPS,
        gradient_accumulation_steps=2,
        output_dir=str(root / "one"),
    )
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr
    return read_metrics(root / "one")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _machines(config: Path, log: Path, env: dict[str, str] | None = None, ranks: int = 1) -> list[subprocess.Popen]:
    """Both machines' launchers, ``ranks`` ranks each, their output in ``LOG.node-N``."""
    port = _free_port()
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "KTRAIN_PG_TIMEOUT_S": "60", **(env or {})}
    started = []
    for node in (0, 1):
        args = ["run", str(config), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", str(ranks)]
        args += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "loopback", "--rdzv-timeout", "120"]
        with open(f"{log}.node-{node}", "w") as out:
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ktrain.cli", *args],
                    stdout=out,
                    stderr=out,
                    env=full_env,
                )
            )
    return started


@pytest.mark.parametrize("sharding", SHARDINGS)
def test_two_machines_form_one_run_equal_to_one_process(
    root: Path, one_process: dict[int, float], sharding: str
) -> None:
    out, (ranks, keys) = root / sharding, SHARDINGS[sharding]
    config = write_config(
        root, f"{sharding}.yaml", random_init_weights=False, max_steps=STEPS, output_dir=str(out), **keys
    )
    codes = [p.wait(timeout=300) for p in _machines(config, root / sharding, ranks=ranks)]
    logs = [Path(f"{root / sharding}.node-{node}").read_text() for node in (0, 1)]
    assert codes == [0, 0], logs
    assert f"= {2 * ranks} ranks" in logs[0]
    losses = read_metrics(out)
    assert losses.keys() == one_process.keys() == set(range(1, STEPS + 1))
    for step, loss in one_process.items():
        assert losses[step] == pytest.approx(loss, rel=RTOL), (step, logs)
    assert (out / "final" / "model.safetensors").is_file()


def test_a_machine_killed_ends_the_other_naming_the_failure(root: Path) -> None:
    """The data take seconds to tokenize (32,000 rows), longer than the collectives' timeout (4 s): each
    machine tokenizes before its ranks start (one builds, the other finds the cache), so the run trains; then
    the second machine is killed and the first ends, naming the failure."""
    slow = root / "slow"
    slow.mkdir()
    (slow / "train.jsonl").write_text((root / "train.jsonl").read_text(encoding="utf-8") * 160, encoding="utf-8")
    data = [{"path": str(slow / "train.jsonl"), "type": "chat_template"}]
    config = write_config(root, "killed.yaml", datasets=data, max_steps=10_000, output_dir=str(root / "killed"))
    first, second = _machines(config, root / "killed", env={"KTRAIN_PG_TIMEOUT_S": "4"})
    deadline = time.monotonic() + 180
    while not (root / "killed" / "metrics.jsonl").is_file():  # both machines train
        alive = first.poll() is None and second.poll() is None
        assert alive and time.monotonic() < deadline, Path(f"{root / 'killed'}.node-0").read_text()[-3000:]
        time.sleep(0.1)
    machine = psutil.Process(second.pid)
    for process in [*machine.children(recursive=True), machine]:  # the machine is gone: its launcher and rank at once
        process.kill()
    killed = time.monotonic()
    code = first.wait(timeout=120)
    text = Path(f"{root / 'killed'}.node-0").read_text()
    assert code == 1, text[-3000:]
    assert time.monotonic() - killed < 60, text[-3000:]
    assert "failed" in text and "first error:" in text, text[-3000:]  # a rank's error, or the rendezvous's
    assert "Traceback" not in text and "TCPStore" not in text, text[-3000:]
    logs = text + Path(f"{root / 'killed'}.node-1").read_text()
    assert logs.count("ktrain: tokenizing the datasets into") == 1, logs  # one machine built, the other read


def test_the_first_machine_keeps_what_a_machine_that_joined_first_wrote(root: Path) -> None:
    """The second machine's launcher may reach the shared output_dir first: the first machine's then starts
    afresh in it without removing the joiner's lock or the run files it reads (they are replaced atomically)."""
    from ktrain.config.plan import prepare
    from ktrain.run.directory import join_run_dir, prepare_run_dir

    config = write_config(root, "joined.yaml", output_dir=str(root / "joined"))
    plan = prepare(config, world_size=2)
    joiner = join_run_dir(root / "joined", plan, node_rank=1)
    before = {p.name: p.stat().st_ino for p in (root / "joined").iterdir()}
    try:
        _, first = prepare_run_dir(plan, resume=False, overwrite=False, node_rank=0)
        first.close()
    finally:
        joiner.close()
    after = {p.name: p.stat().st_ino for p in (root / "joined").iterdir()}
    assert after[".ktrain.node-1.lock"] == before[".ktrain.node-1.lock"], (before, after)
    assert {"run.json", "config.yaml", "config.resolved.yaml"} <= after.keys()

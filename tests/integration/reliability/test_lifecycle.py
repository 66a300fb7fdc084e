"""A run's start and end as the user meets them: Ctrl-C and SIGTERM, bad input found on a rank, a resume that
would change the data, a run directory a failed start left, the exact match of a resumed run, the progress
bar, and the free space the first checkpoint of a LoRA run needs."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ktrain.run.checkpoints import verify
from ktrain.testing import dataset, model_dir, read_metrics, write_config
from tests.integration.reliability.kit import run
from tests.kit import QUICKSTART

TWO = ("--nproc-per-node", "2")
LONG = dict(max_steps=100_000, save_steps=2, save_total_limit=2, logging_steps=10)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    model_dir(tmp_path)
    dataset(tmp_path, 32)
    return tmp_path


def _tree(path: Path) -> dict[str, bytes] | None:
    """Every file under ``path`` with its bytes (None when ``path`` does not exist)."""
    if not path.exists():
        return None
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("ranks", "signum"), [(2, signal.SIGINT), (2, signal.SIGTERM), (1, signal.SIGINT)])
def test_a_signal_to_the_process_group_stops_every_rank_cleanly(root: Path, ranks: int, signum: int) -> None:
    """SIGINT or SIGTERM to the launcher's process group (as a terminal or a scheduler sends it) while the ranks
    train and save: exit 130 or 143, one line, no traceback, no staging folder left, the checkpoints whole, nothing
    left in the temporary folder."""
    config = write_config(root, **LONG)
    out = root / "out"
    log = root / "run.log"
    args = ("run", str(config), *(TWO if ranks == 2 else ()))
    tmp = _temporary_folder()
    process = _start_in_own_group(args, log, {"TMPDIR": str(tmp)})
    deadline = time.monotonic() + 240
    while _latest_saved(out) < 4:  # any step from 4 on: a fast run rotates step 4 away (save_total_limit) at once
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    os.killpg(process.pid, signum)
    code = process.wait(timeout=90)
    text = log.read_text()
    assert code == 128 + signum, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and "SignalException" not in text, text
    assert text.count(f"ktrain: stopped by {signal.Signals(signum).name}") == 1, text[-3000:]
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert not [n for n in names if n.startswith(".tmp")], names
    assert all(verify(out / "checkpoints" / n) == [] for n in names)
    assert f"--resume continues from {names[-1]}" in text
    left_files = _left_in(tmp)
    assert not left_files, f"left in the temporary folder: {left_files}"


def _temporary_folder(long: bool = False) -> Path:
    """A new folder for a run's ``TMPDIR``; unless ``long``, short enough for a socket's path in it (108 bytes at
    most), as the one the fork server's socket goes to is."""
    return Path(tempfile.mkdtemp(prefix="kt-" + "x" * 90 * long))


def _left_in(tmp: Path) -> list[str]:
    """What a run left in its temporary folder ``tmp`` (torch's compile cache, kept on purpose, aside); removes
    ``tmp``."""
    left = [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")]
    shutil.rmtree(tmp)
    return left


def _latest_saved(out: Path) -> int:
    """The highest step whose checkpoint folder is in ``out`` (0 without one); staging folders are not counted."""
    names = [p.name for p in (out / "checkpoints").glob("step-*")] if (out / "checkpoints").is_dir() else []
    return max((int(n.removeprefix("step-")) for n in names if n.removeprefix("step-").isdigit()), default=0)


def _start_in_own_group(args: tuple[str, ...], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``ktrain ARGS`` as the leader of its own process group, as a shell starts a command (``env`` added to the
    environment)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KTRAIN_PG_TIMEOUT_S": "10", **(env or {})}
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ktrain.cli", *args], stdout=out, stderr=out, env=env, start_new_session=True
        )


@pytest.mark.parametrize("ranks", [1, 2])
def test_bad_data_found_on_a_rank_is_one_line_and_exit_2(root: Path, ranks: int) -> None:
    """A dataset whose rows are no chat: found when a rank reads it. Exit 2, the key named, no traceback, and the
    run directory as it was (here: not there)."""
    (root / "train.jsonl").write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(8)))
    config = write_config(root)
    code, log = run("run", str(config), *(TWO if ranks == 2 else ()), log=root / "bad.log")
    assert code == 2, log[-3000:]
    assert "datasets[0]" in log and "Traceback" not in log and "failed (exit code" not in log, log[-3000:]
    assert not (root / "out").exists()


@pytest.mark.parametrize(("data", "tmpdir"), [("good", "short"), ("bad", "short"), ("good", "long")])
def test_no_process_of_a_two_rank_run_outlives_its_launcher(root: Path, data: str, tmpdir: str) -> None:
    """Once the launcher of a two-rank run has exited, no process it started for the run is left: not the fork
    server, which imports while the launcher tokenizes and holds the run's output open (a caller reading that to
    its end, a script or a test, would wait for it), whether the ranks ran or bad data stopped the run first; and
    nothing is left in the temporary folder (``TMPDIR``): not the agent's folder of the ranks' error files, not
    multiprocessing's folder of the fork server's socket (torch's compile cache, kept on purpose, may be there).
    A temporary folder too long for that socket's path (a cluster's per-job folder can be) does not stop the run."""
    if data == "bad":
        (root / "train.jsonl").write_text("{not json\n")
    config = write_config(root, max_steps=2)
    tmp = _temporary_folder(long=tmpdir == "long")
    process = _start_in_own_group(("run", str(config), *TWO), root / "run.log", {"TMPDIR": str(tmp)})
    code = process.wait(timeout=300)
    left = _processes_started_by(process.pid)
    deadline = time.monotonic() + TRACKER_EXIT_S  # the tracker exits once the launcher's end closed its pipe
    while any(RESOURCE_TRACKER in c for c in left) and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [c for c in left if RESOURCE_TRACKER not in c] + _processes_started_by(process.pid, RESOURCE_TRACKER)
    text = (root / "run.log").read_text()
    assert code == (0 if data == "good" else 2), text[-3000:]
    assert not left, f"left running after the launcher exited: {left}"
    left_files = _left_in(tmp)
    assert not left_files, f"left in the temporary folder: {left_files}"


RESOURCE_TRACKER = "multiprocessing.resource_tracker"
"""In the command line of multiprocessing's resource tracker, the launcher's helper that ends itself when it reads
the end of its pipe, that is once the launcher has exited; it holds no model and ends within moments."""
TRACKER_EXIT_S = 5.0


def _processes_started_by(launcher: int, named: str = "") -> list[str]:
    """The command lines (those holding ``named``) of the live processes whose environment names ``launcher`` as
    the run's agent (``KTRAIN_AGENT_PID``): the fork server, the ranks forked from it, the resource tracker."""
    found = []
    for folder in Path("/proc").glob("[0-9]*"):
        try:
            if f"KTRAIN_AGENT_PID={launcher}".encode() in (folder / "environ").read_bytes().split(b"\0"):
                found.append((folder / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return [c for c in found if named in c]


def test_too_few_rows_for_a_global_batch_is_bad_input(root: Path) -> None:
    """Found on the rank once the data is read: exit 2 naming ``datasets``, no traceback."""
    dataset(root, 3)
    config = write_config(root, max_steps=None, num_epochs=1)
    code, log = run("run", str(config), log=root / "few.log")
    assert code == 2 and "datasets:" in log and "fewer than one global batch" in log, log[-3000:]
    assert "Traceback" not in log


def test_a_resume_that_would_change_the_data_is_refused_before_any_rank(root: Path) -> None:
    """``--resume --set micro_batch_size=8`` (and sequence_len): exit 2, every key named, before a rank starts
    (nothing tokenized), the run directory as it was."""
    config = write_config(root, max_steps=2, save_steps=2)
    code, log = run("run", str(config), log=root / "first.log")
    assert code == 0, log[-3000:]
    before = _tree(root / "out")
    args = ("--set", "micro_batch_size=8", "--set", "sequence_len=32")
    code, log = run("run", str(config), "--resume", *args, log=root / "changed.log")
    assert code == 2 and "Traceback" not in log, log[-3000:]
    assert "micro_batch_size: 8 here, 4 in the run being resumed" in log and "sequence_len: 32 here, 64" in log
    assert "tokeniz" not in log and "ranks; run directory" not in log
    assert _tree(root / "out") == before


def test_a_directory_a_failed_start_left_is_reused(root: Path) -> None:
    """A start that crashed before its first checkpoint: ``--resume`` is refused before a rank starts, a plain run
    reuses the folder saying so in one line; a folder whose lock is held names the pid that holds it."""
    config = write_config(root, max_steps=2, save_steps=2)
    code, log = run("run", str(config), log=root / "crash.log", env={"KTRAIN_FAULT": "forward:1:0:raise"})
    assert code == 1 and (root / "out" / "run.json").is_file(), log[-3000:]
    code, log = run("run", str(config), "--resume", log=root / "resume.log")
    assert code == 2 and "no complete checkpoint" in log and "ranks; run directory" not in log, log[-3000:]

    with open(root / "out" / ".ktrain.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.seek(0)
        held.truncate()
        held.write(str(os.getpid()))
        held.flush()
        code, log = run("run", str(config), log=root / "held.log")
    assert code == 2 and f"is in use by pid {os.getpid()}" in log and "Traceback" not in log, log[-3000:]

    code, log = run("run", str(config), log=root / "reuse.log")
    assert code == 0, log[-3000:]
    assert log.count("holds no checkpoint and no model of an earlier start; starting afresh in it") == 1


def test_a_resumed_run_scores_no_step_0_exact_match(root: Path) -> None:
    """The exact match before training belongs to step 0 of a fresh run: a resume logs none mid-file."""
    questions = root / "questions.jsonl"
    questions.write_text("".join((QUICKSTART / "data" / "train.jsonl").read_text().splitlines(True)[:2]))
    config = write_config(root, max_steps=2, save_steps=2, exact_match_eval=str(questions))
    assert run("run", str(config), log=root / "first.log")[0] == 0
    code, log = run("run", str(config), "--resume", "--set", "max_steps=4", log=root / "resumed.log")
    assert code == 0, log[-3000:]
    assert sorted(read_metrics(root / "out", "exact_match")) == [0, 2, 4]
    steps = [json.loads(line)["step"] for line in (root / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)


def test_the_progress_bar_redraws_every_second_with_an_eta(root: Path) -> None:
    """On a terminal, with a step logged every 1000 steps: the bar shows steps between the logged ones, and an
    ETA, within the first seconds of training."""
    config = write_config(root, max_steps=400, logging_steps=1000, save_strategy="no")
    main, child = pty.openpty()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "ktrain.cli", "run", str(config)], stdout=child, stderr=child, env=env
    )
    os.close(child)
    seen = b""
    while process.poll() is None or select.select([main], [], [], 0)[0]:
        if select.select([main], [], [], 1)[0]:
            try:
                seen += os.read(main, 65536)
            except OSError:
                break
    os.close(main)
    assert process.wait() == 0, seen.decode(errors="replace")[-3000:]
    bars = [part for part in seen.decode(errors="replace").split("\r") if part.startswith("[")]
    shown = {int(part.split("step ")[1].split("/")[0]) for part in bars}
    assert any(0 < step < 400 for step in shown), bars
    assert any("eta 00:" in part for part in bars if " 400/400" not in part), bars


def test_printed_lines_have_an_eta_from_the_first_logged_step_after_the_first(root: Path) -> None:
    """Off a terminal (a log file, a CI job) a line is printed per logged step: the first one after the first
    step already says when the run ends."""
    config = write_config(root, max_steps=6, logging_steps=3, save_strategy="no")
    code, log = run("run", str(config), log=root / "lines.log")
    assert code == 0, log[-3000:]
    line = next(line for line in log.splitlines() if line.startswith("step 3/6"))
    assert "eta 00:" in line, line


def test_the_first_checkpoint_of_a_lora_run_needs_the_adapter_not_the_base(root: Path) -> None:
    """A real LoRA run (ktrain-plugin-lora): the free space asked for its first checkpoint covers what the
    checkpoint holds and is far below the base model's size, which no LoRA checkpoint holds."""
    pytest.importorskip("ktrain_lora")
    from ktrain import hookimpl
    from ktrain.config.plan import prepare
    from ktrain.run.checkpoints import first_checkpoint_bytes
    from ktrain.run.directory import prepare_run_dir
    from ktrain.run.trainer import rank_main

    seen: dict[str, int] = {}

    class Measure:
        @hookimpl
        def ktrain_on_checkpoint_saved(self, run, step, path) -> None:
            seen["need"] = first_checkpoint_bytes(run.model)
            seen["holds"] = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            seen["base"] = sum(p.numel() * p.element_size() for p in run.model.parameters())

    config = write_config(root, max_steps=1, save_steps=1, adapter="lora", lora_r=2, lora_alpha=4)
    run_dir, lock = prepare_run_dir(prepare(config), resume=False, overwrite=False)
    try:
        rank_main(run_dir, resume=False, extra_plugins=(("measure", Measure()),))
    finally:
        lock.close()
    assert seen["holds"] <= seen["need"] < seen["base"], seen

"""Datasets named by a Hugging Face Hub id: shown by ``check``, loaded with `datasets` at preprocess, and
refused before any rank starts, in one line, when they cannot be loaded.

This machine may have no route to the Hub, so nothing here needs one: offline mode is set, or the endpoint
is an address that does not answer HTTPS, and a dataset "already downloaded" is written into a temporary
Hugging Face cache in the layout `datasets` gives a Hub download (``org___name/default/0.0.0/HASH``), from
which ``load_dataset("org/name")`` loads it offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ktrain.cli import EXIT_BAD_INPUT, EXIT_OK, main
from ktrain.testing import dataset, ktrain, model_dir, write_config

HUB_ID = "ktrain-tests/tiny-chat"
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
QUICK = 15.0  # seconds: a refusal is a start-up and a check, not the library's minutes of retries


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A tiny model, 16 chat rows and a config whose one dataset is ``HUB_ID``; an empty HF_HOME in ``hf``."""
    model_dir(tmp_path)
    dataset(tmp_path, 16)
    write_config(tmp_path, datasets=[{"path": HUB_ID, "type": "chat_template"}])
    (tmp_path / "hf").mkdir()
    return tmp_path


def env(root: Path, **more: str) -> dict[str, str]:
    """The environment of a run: HF_HOME in ``root/hf``, offline mode unset unless ``more`` sets it."""
    base = {k: v for k, v in os.environ.items() if k not in OFFLINE_VARIABLES and k != "HF_ENDPOINT"}
    return {**base, "HF_HOME": str(root / "hf"), **more}


def refused(root: Path, environment: dict[str, str]) -> str:
    """Run ``ktrain run`` and return its one problem line; it must be refused quickly, before the run directory."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ktrain.cli", "run", str(root / "run.yaml")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    took = time.monotonic() - started
    assert done.returncode == EXIT_BAD_INPUT, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert took < QUICK, took
    assert not (root / "out").exists()  # refused before the run directory and any rank
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    return line


def cache_as_the_hub_would(hf_home: Path, repo_id: str, rows: Path) -> None:
    """Write ``rows`` (jsonl) into ``hf_home``'s datasets cache where a download of ``repo_id`` would leave it:
    the json builder's Arrow files under ``namespace___name/default/0.0.0/HASH``."""
    from datasets.packaged_modules.json.json import Json

    cache = hf_home / "datasets"
    namespace, name = repo_id.split("/")
    builder = Json(
        cache_dir=str(cache), dataset_name=name, config_id="default", data_files={"train": str(rows)}, hash="0" * 40
    )
    builder.download_and_prepare()
    (cache / name).rename(cache / f"{namespace}___{name}")  # the builder names the folder without the namespace


def test_check_shows_a_hub_dataset_as_loaded_at_preprocess(root: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["check", str(root / "run.yaml")])
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err
    assert f"  datasets[0].path: {HUB_ID} (from the Hub at preprocess)" in out
    assert "warning" not in out + err and "Traceback" not in out + err


def test_offline_run_refuses_a_hub_dataset_that_is_not_cached(root: Path) -> None:
    line = refused(root, env(root, HF_HUB_OFFLINE="1"))
    assert line.startswith(f"  - datasets[0].path: {HUB_ID} is a Hugging Face Hub id, the Hub cannot be reached")
    assert "(HF_HUB_OFFLINE=1 is set)" in line
    assert f"not in the local Hugging Face cache ({root / 'hf' / 'datasets'})" in line


def test_a_run_with_no_route_to_the_hub_is_refused_quickly(root: Path) -> None:
    """No offline variable: the endpoint (an address that answers no HTTPS here, or none at all) is probed."""
    line = refused(root, env(root, HF_ENDPOINT="https://10.255.255.1"))
    assert line.startswith(f"  - datasets[0].path: {HUB_ID} is a Hugging Face Hub id, the Hub cannot be reached")
    assert "(no answer from https://10.255.255.1 within 2.5 s)" in line


def test_without_the_datasets_library_a_hub_dataset_names_the_install_command(root: Path) -> None:
    hidden = "import sys; sys.modules['datasets'] = None; from ktrain.cli import main; sys.exit(main(sys.argv[1:]))"
    run = [sys.executable, "-c", hidden, "run", str(root / "run.yaml")]  # `datasets` cannot be imported there
    done = subprocess.run(run, capture_output=True, text=True, env=env(root), timeout=300)
    assert done.returncode == EXIT_BAD_INPUT, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    install = '`pip install "ktrain-llm[hub]"`'
    expected = f"  - datasets[0].path: {HUB_ID} is a Hugging Face Hub id, loaded with the `datasets` library: {install}"
    assert expected in done.stderr.splitlines()
    assert not (root / "out").exists()
    done = subprocess.run([*run[:3], "check", run[-1]], capture_output=True, text=True, env=env(root), timeout=300)
    assert done.returncode == EXIT_OK, done.stderr
    assert f"{HUB_ID} (from the Hub at preprocess; needs {install})" in done.stdout


def test_a_cached_hub_dataset_trains_offline_with_the_rows_of_its_files(root: Path) -> None:
    cache_as_the_hub_would(root / "hf", HUB_ID, root / "train.jsonl")
    offline = env(root, HF_HUB_OFFLINE="1")
    read = (
        "import json\n"
        "from ktrain.config.keys import DatasetEntry\n"
        "from ktrain.data.reading import iter_rows\n"
        f"rows = iter_rows(DatasetEntry(path={HUB_ID!r}), 'datasets[0]')\n"
        "print(json.dumps([[r.fields, r.place] for r in rows]))\n"
    )
    done = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, env=offline, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout.splitlines()[-1])
    written = [json.loads(line) for line in (root / "train.jsonl").read_text().splitlines()]
    assert [fields for fields, _ in rows] == written
    assert rows[3][1] == f"{HUB_ID} (train) row 3"
    done = ktrain("run", str(root / "run.yaml"), env=offline)
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert "datasets[0] (chat_template): 16 samples, 16 kept" in done.stdout
    assert (root / "out" / "final").is_dir()

"""``KtrainProject``: a folder to train in for real, with configs written from YAML and ``ktrain`` run as a user would.

Every run is a fresh ``ktrain`` process (several ranks through ``--nproc-per-node``, gloo on a CPU),
so a plugin is tested exactly as it runs for its users. A plugin written inside a test becomes
visible to those processes with ``install_plugin``: its module and a ``.dist-info`` folder with the
entry point, in a folder put on their ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from ktrain import ENTRY_POINT_GROUP


def read_metrics(run_dir: Path, key: str = "loss") -> dict[int, float]:
    """step -> value of ``key`` in ``run_dir/metrics.jsonl`` (the steps where it was logged)."""
    out = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if key in record:
            out[record["step"]] = record[key]
    return out


def install_entry_point(site: Path, distribution: str, version: str, name: str, module: str) -> None:
    """Make ``module`` the entry point ``name`` of ``distribution`` for processes with ``site`` on PYTHONPATH."""
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {module}\n", encoding="utf-8")


class KtrainProject:
    """A folder holding a tiny model and dataset, where configs are written and ``ktrain`` runs.

    ``env`` is added to the environment of every ``ktrain`` process (the hook recorder and
    ``install_plugin`` add to it).
    """

    def __init__(self, root: Path, model_dir: Path, dataset: Path):
        self.root = Path(root)
        self.model_dir = Path(model_dir)
        self.dataset = Path(dataset)
        self.site = self.root / "site-packages"
        self.env: dict[str, str] = {"OMP_NUM_THREADS": "1"}

    def default_keys(self, name: str) -> dict[str, Any]:
        """The keys of every config this project writes, before the test's own."""
        return {
            "base_model": str(self.model_dir),
            "random_init_weights": True,
            "datasets": [{"path": str(self.dataset), "type": "chat_template"}],
            "sequence_len": 64,
            "micro_batch_size": 4,
            "learning_rate": 3.0e-3,
            "max_steps": 4,
            "output_dir": str(self.root / "runs" / name),
            "seed": 7,
        }

    def config(self, yaml_text: str = "", *, name: str = "run", **keys: Any) -> Path:
        """Write ``NAME.yaml``: the default keys, then those of ``yaml_text``, then ``keys``; return its path.

        The run directory is ``runs/NAME`` unless ``output_dir`` is given.
        """
        written = yaml.safe_load(yaml_text) or {}
        if not isinstance(written, dict):
            raise ValueError(f"the YAML of a config must be a mapping of keys, not {type(written).__name__}")
        data = {**self.default_keys(name), **written, **keys}
        path = self.root / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path

    def python(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """Run ``python ARGS`` in a fresh process in the project's folder, with its environment and plugins."""
        env = {**os.environ, **self.env}
        if self.site.is_dir():
            env["PYTHONPATH"] = os.pathsep.join([str(self.site), *filter(None, [env.get("PYTHONPATH")])])
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, cwd=self.root, timeout=timeout
        )

    def ktrain(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """Run ``ktrain ARGS`` in a fresh process; return it (``returncode``, ``stdout``, ``stderr``)."""
        return self.python("-m", "ktrain.cli", *args, timeout=timeout)

    def train(self, config: Path, *args: str, nproc: int = 1) -> Path:
        """``ktrain run CONFIG ARGS`` on ``nproc`` ranks, in the project's folder; return the run directory.

        Fails the test, showing the end of the run's output, when the run does not exit with 0.
        """
        done = self.ktrain("run", str(config), "--nproc-per-node", str(nproc), *args)
        if done.returncode != 0:
            raise AssertionError(
                f"`ktrain run {config.name} --nproc-per-node {nproc} {' '.join(args)}` exited with "
                f"{done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return self.root / yaml.safe_load(config.read_text(encoding="utf-8"))["output_dir"]

    def plan(
        self,
        yaml_text: str = "",
        *,
        plugins: Iterable[tuple[str, Any]] = (),
        world_size: int | None = None,
        **keys: Any,
    ) -> Any:
        """Check a config in this process, as ``ktrain check`` does, and return the plan.

        ``plugins`` are ``(name, module)`` pairs registered as if installed. The plan holds the
        structured ``config``, the ``plugins`` with their activations and roles, and the ``mesh``.
        Raises the ``ConfigError`` or ``PluginError`` that ``ktrain check`` would print.
        """
        from ktrain.config.plan import prepare

        return prepare(self.config(yaml_text, name="plan", **keys), world_size=world_size, extra_plugins=plugins)

    def install_plugin(
        self, name: str, source: str, *, distribution: str | None = None, version: str = "0.0.0"
    ) -> None:
        """Install the entry module ``source`` as plugin ``name`` for the ``ktrain`` processes of this project.

        Its module is ``NAME.py`` in the project's site folder and its distribution
        ``ktrain-plugin-NAME`` (or ``distribution``); no pip, nothing outside the project changes.
        """
        self.site.mkdir(parents=True, exist_ok=True)
        (self.site / f"{name}.py").write_text(source, encoding="utf-8")
        install_entry_point(self.site, distribution or f"ktrain-plugin-{name}", version, name, name)

"""``ktrain new-plugin NAME`` renders a package that is ruff clean, installs with pip, and passes its own tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ktrain.testing import KtrainProject

pytest_plugins = ["ktrain.testing"]


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})}, timeout=600
    )
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_rendered_plugin_installs_and_passes_its_tests(tmp_path: Path, ktrain_project: KtrainProject) -> None:
    made = ktrain_project.ktrain("new-plugin", "step-log", "--output", str(tmp_path / "step-log"))
    assert made.returncode == 0, made.stderr
    package = tmp_path / "step-log"
    assert sorted(str(p.relative_to(package)) for p in package.rglob("*") if p.is_file()) == [
        "README.md",
        "ktrain_step_log/__init__.py",
        "ktrain_step_log/entry.py",
        "ktrain_step_log/keys.py",
        "ktrain_step_log/runtime.py",
        "pyproject.toml",
        "tests/test_step_log_plugin.py",
    ]
    assert "{{" not in "".join(p.read_text() for p in package.rglob("*") if p.is_file())
    _run("-m", "ruff", "check", ".", cwd=package)
    _run("-m", "ruff", "format", "--check", ".", cwd=package)
    site = tmp_path / "site"
    _run("-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), ".", cwd=package)
    env = {"PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    listed = _run("-m", "ktrain.cli", "plugins", cwd=tmp_path, env=env).stdout
    assert "step_log: ktrain-plugin-step-log 0.1.0 (ktrain_step_log.entry)" in listed
    tests = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=package, env=env).stdout
    assert "4 passed" in tests, tests


def test_a_bad_name_or_an_existing_folder_is_refused(tmp_path: Path, ktrain_project: KtrainProject) -> None:
    bad = ktrain_project.ktrain("new-plugin", "My Plugin", "--output", str(tmp_path / "x"))
    assert bad.returncode == 2 and "'My Plugin' is not a plugin name" in bad.stderr
    assert not (tmp_path / "x").exists()
    (tmp_path / "taken").mkdir()
    taken = ktrain_project.ktrain("new-plugin", "ok", "--output", str(tmp_path / "taken"))
    assert taken.returncode == 2 and f"{tmp_path / 'taken'} exists" in taken.stderr

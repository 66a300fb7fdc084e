"""docs/writing-plugins.md, run block by block in an empty folder: its plugin installs, trains and passes the suite.

A block after ``<!-- file: PATH -->`` is written to PATH; a ``bash`` block is run line by line (a
trailing ``# exits with N`` gives the expected exit code, else 0); a ``text`` block lists lines that the
output of the ``bash`` block before it must contain. ``pip install -e DIR`` is run as
``pip install --target SITE DIR`` with SITE on the PYTHONPATH of the later commands, so that the test
leaves the environment it runs in as it found it. Every block of the page must be one of these. A file
block whose PATH starts with ``contrib/`` (the second tutorial's plugin) must be that file of this
repository, verbatim.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "writing-plugins.md"
BLOCK = re.compile(r"(?:<!-- file: (?P<file>\S+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.DOTALL)
EXIT = re.compile(r"\s+#\s*exits with (\d+)$")


def blocks() -> list[tuple[str | None, str, str]]:
    """(file, language, text) of every fenced block of the page, in order."""
    return [(m["file"], m["lang"], m["body"]) for m in BLOCK.finditer(DOC.read_text(encoding="utf-8"))]


def _command(line: str, site: Path) -> tuple[str, int]:
    expected = 0
    found = EXIT.search(line)
    if found:
        expected, line = int(found.group(1)), line[: found.start()]
    words = shlex.split(line)
    if words[:3] == ["pip", "install", "-e"]:
        words = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        words += ["--target", str(site), *shlex.split(line)[3:]]
        line = shlex.join(words)
    return line, expected


def test_every_block_is_run_or_checked() -> None:
    for file, lang, body in blocks():
        assert (file is not None) == (lang in ("python", "toml", "yaml")), f"a {lang} block needs a file marker"
        assert lang in ("python", "toml", "yaml", "bash", "text"), f"no way to run a {lang!r} block: {body[:60]}"


def test_files_of_the_repository_are_shown_as_they_are() -> None:
    shown = {file: body for file, _, body in blocks() if file is not None and file.startswith("contrib/")}
    assert "contrib/powersgd/ktrain_powersgd/runtime.py" in shown, sorted(shown)
    for file, body in shown.items():
        assert (ROOT / file).is_file(), f"docs/writing-plugins.md shows {file}, which does not exist"
        assert body == (ROOT / file).read_text(encoding="utf-8"), f"docs/writing-plugins.md shows {file} otherwise"
    package = ROOT / "contrib" / "powersgd" / "ktrain_powersgd"
    for path in sorted(package.glob("*.py")):
        assert str(path.relative_to(ROOT)) in shown, f"the second tutorial does not show {path.relative_to(ROOT)}"


def test_the_tutorial_runs(tmp_path: Path) -> None:
    site = tmp_path / ".site"
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1",
    }
    output = ""
    for file, lang, body in blocks():
        if file is not None:
            (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / file).write_text(body, encoding="utf-8")
        elif lang == "bash":
            output = ""
            for line in filter(None, (raw.strip() for raw in body.splitlines())):
                command, expected = _command(line, site)
                done = subprocess.run(
                    command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
                )
                output += done.stdout + done.stderr
                assert done.returncode == expected, f"`{line}` exited with {done.returncode}:\n{output[-4000:]}"
        else:
            for line in filter(str.strip, body.splitlines()):
                assert line in output, f"the output lacks {line!r}:\n{output[-4000:]}"

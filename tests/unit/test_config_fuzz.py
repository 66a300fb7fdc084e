"""Property tests: whatever the file holds, ``ktrain check`` answers 0 or 2 and never a traceback.

Documents are built from the real key names, near misses of them and random text, with random values
nested at random; others are random text or bytes as the whole file, or a good config with random
``--set`` overrides. When the answer is 2, the message must point somewhere: a ``  - path: message``
line or the file's name.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ktrain.cli import EXIT_BAD_INPUT, EXIT_OK, main
from ktrain.config.keys import KERNEL_SECTIONS, PLUGIN_KEYS, DatasetEntry

KEYS = sorted(
    {f.name for cls in (*KERNEL_SECTIONS, DatasetEntry) for f in attrs.fields(cls)}
    | {k for keys in PLUGIN_KEYS.values() for k in keys}
)

# 50 examples a property, each a whole `ktrain check` (plugins discovered, the config structured and checked):
# 150 took about 26 s, most of the minute tests/unit may take; CI runs these six properties on every push.
FUZZ = settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@st.composite
def near_miss(draw: st.DrawFn) -> str:
    """A real key with one character dropped, doubled, swapped or replaced."""
    name = draw(st.sampled_from(KEYS))
    i = draw(st.integers(0, len(name) - 1))
    how = draw(st.sampled_from(["drop", "double", "swap", "replace", "case"]))
    if how == "drop":
        return name[:i] + name[i + 1 :]
    if how == "double":
        return name[:i] + name[i] + name[i:]
    if how == "swap" and i + 1 < len(name):
        return name[:i] + name[i + 1] + name[i] + name[i + 2 :]
    if how == "case":
        return name.upper()
    return name[:i] + draw(st.sampled_from("abcxyz_-.0 ")) + name[i + 1 :]


keys = st.one_of(st.sampled_from(KEYS), near_miss(), st.text(max_size=12), st.integers(-3, 3), st.booleans())
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-2, 4),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["true", "auto", "-1", "2e-5", "offload", "cosine", "chat_template", "eager", "steps", "."]),
    st.sampled_from(KEYS),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
documents = st.dictionaries(keys, values, max_size=8)

PROBLEM_LINE = re.compile(r"^  - \S.*: .+", re.MULTILINE)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture
def workdir(fuzz_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder the config files are written to, and the working directory (relative paths land here)."""
    monkeypatch.chdir(fuzz_dir)
    return fuzz_dir


@pytest.fixture(scope="module")
def good(tiny_model_dir: Path, tiny_chat_jsonl: Path, fuzz_dir: Path) -> dict:
    """A config that passes, to perturb."""
    return {
        "base_model": str(tiny_model_dir),
        "datasets": [{"path": str(tiny_chat_jsonl), "type": "chat_template"}],
        "output_dir": str(fuzz_dir / "out"),
    }


def check(path: Path, *args: str) -> tuple[int, str]:
    """Run ``ktrain check`` in process; return its exit code and stderr, asserting it answered properly."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["check", str(path), *args])
    text = err.getvalue()
    assert code in (EXIT_OK, EXIT_BAD_INPUT), text
    assert "Traceback" not in text
    if code == EXIT_BAD_INPUT:
        assert PROBLEM_LINE.search(text) or str(path) in text, text
    return code, text


@FUZZ
@given(doc=documents)
def test_random_documents(doc: dict, workdir: Path) -> None:
    path = workdir / "doc.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    check(path)


@FUZZ
@given(changes=st.dictionaries(keys, values, min_size=1, max_size=3), world_size=st.none() | st.integers(-1, 9))
def test_random_changes_to_a_good_config(changes: dict, world_size: int | None, good: dict, workdir: Path) -> None:
    path = workdir / "changed.yaml"
    path.write_text(yaml.safe_dump({**good, **changes}, allow_unicode=True), encoding="utf-8")
    check(path, *(() if world_size is None else ("--world-size", str(world_size))))


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_random_bytes_as_the_file(raw: bytes, workdir: Path) -> None:
    path = workdir / "raw.yaml"
    path.write_bytes(raw)
    check(path)


yaml_ish_lines = st.lists(
    st.one_of(
        st.builds(lambda k, v: f"{k}: {v}", st.sampled_from(KEYS) | near_miss(), st.text(max_size=10)),
        st.sampled_from(["- a", "  - b: 1", "? x", ": y", "&a x: *a", "{", "[", "!!str", "--- ", "...", "\t", "#"]),
        st.text(max_size=15),
    ),
    max_size=10,
)


@FUZZ
@given(lines=yaml_ish_lines)
def test_yaml_ish_text(lines: list[str], workdir: Path) -> None:
    path = workdir / "lines.yaml"
    path.write_text("\n".join(lines), encoding="utf-8")
    check(path)


@FUZZ
@given(
    overrides=st.lists(
        st.one_of(
            st.text(max_size=20),
            st.builds(
                lambda k, rest, v: f"{k}{rest}={v}",
                st.sampled_from([*KEYS, "datasets.0", "datasets.1", "datasets.-1"]),
                st.sampled_from(["", ".path", ".type", ".0", ".x.y", ".."]),
                st.text(max_size=10).map(json.dumps) | st.text(max_size=10),
            ),
        ),
        max_size=3,
    )
)
def test_random_overrides(overrides: list[str], good: dict, workdir: Path) -> None:
    path = workdir / "base.yaml"
    path.write_text(yaml.safe_dump(good), encoding="utf-8")
    check(path, *(f"--set={value}" for value in overrides))


HOSTILE = {  # fragment appended to a good config -> what the message must name
    "duplicate": ("seed: 1\nseed: 2\n", "duplicate key 'seed'"),
    "python tag": ("seed: !!python/object/apply:pathlib.Path.touch [{marker}]\n", "python/object/apply"),
    "custom tag": ("seed: !secret 3\n", "!secret"),
    "binary tag": ("seed: !!binary aGVsbG8=\n", "seed"),
    "bad utf-8": ("seed: '\udcff'\n", "utf-8"),
}


@FUZZ
@given(kind=st.sampled_from(sorted(HOSTILE)), where=st.integers(0, 3), command=st.sampled_from(["check", "run"]))
def test_hostile_fragments(kind: str, where: int, command: str, good: dict, workdir: Path) -> None:
    """A duplicate key, a YAML tag (one that would run code), or bytes that are not UTF-8, between the keys of
    a good config: exit 2 naming the file and the problem, no traceback, nothing run, and for ``ktrain run`` no
    output_dir and no process group."""
    import torch.distributed as dist

    marker = workdir / "tag-ran"
    fragment, says = HOSTILE[kind]
    lines = yaml.safe_dump(good).splitlines(keepends=True)
    tops = [i for i, line in enumerate(lines) if not line.startswith((" ", "-"))] + [len(lines)]
    lines.insert(tops[where % len(tops)], fragment.format(marker=json.dumps(str(marker))))
    path = workdir / "hostile.yaml"
    path.write_bytes("".join(lines).encode("utf-8", "surrogateescape"))
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main([command, str(path)])
    text = err.getvalue()
    assert code == EXIT_BAD_INPUT, text
    assert "Traceback" not in text and str(path) in text and says.lower() in text.lower(), text
    assert not marker.exists() and not dist.is_initialized() and not Path(good["output_dir"]).exists()

"""Item j: no file a user hands ktrain can run code. Every Python source under kernel/, plugins/ and
contrib/ is parsed and its calls checked:

- ``torch.load`` passes ``weights_only=True`` (a literal);
- no ``pickle``/``marshal``/``dill`` loading, ``pickle.Unpickler`` or ``numpy.load(allow_pickle=True)``;
- PyYAML's ``yaml.load``/``load_all`` only with a ``SafeLoader`` (or a class of the same file derived from
  it), and never ``unsafe_load``, ``full_load``, ``FullLoader``, ``UnsafeLoader`` or ``yaml.Loader``;
- no ``extractall`` or ``shutil.unpack_archive`` without ``filter=`` (zipfile has none: none at all);
- ``trust_remote_code`` is never passed as a literal ``True`` and the kernel's key defaults to False.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attrs
import pytest

from ktrain.config.keys import ModelKeys
from tests.kit import REPO

ROOTS = ("kernel", "plugins", "contrib")
UNSAFE_YAML = {"unsafe_load", "unsafe_load_all", "full_load", "full_load_all", "FullLoader", "UnsafeLoader"}
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "dill", "cloudpickle"}


def sources() -> list[Path]:
    return sorted(
        p
        for root in ROOTS
        for p in (REPO / root).rglob("*.py")
        if ".egg-info" not in str(p) and "build" not in p.relative_to(REPO).parts
    )


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _safe_loaders(tree: ast.Module) -> set[str]:
    """Names of SafeLoader and of the classes of this file derived from it."""
    safe = {"SafeLoader", "yaml.SafeLoader", "CSafeLoader", "yaml.CSafeLoader"}
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    grew = True
    while grew:
        grew = False
        for cls in classes:
            if cls.name not in safe and any(_dotted(base) in safe for base in cls.bases):
                safe.add(cls.name)
                grew = True
    return safe


def _imports_pyyaml(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == "yaml" for a in n.names) for n in tree.body)


def problems(path: Path) -> list[str]:
    """Every unsafe call in the source file ``path``, as ``file:line: what``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    safe_loaders, pyyaml = _safe_loaders(tree), _imports_pyyaml(tree)
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _dotted(node).startswith("yaml.") and node.attr in UNSAFE_YAML:
            found.append(f"{where}:{node.lineno}: yaml.{node.attr}")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        if name == "torch.load" and not _is_true(_keyword(node, "weights_only")):
            found.append(f"{where}:{node.lineno}: torch.load without weights_only=True")
        if "." in name and name.split(".")[0] in PICKLE_MODULES and last in {"load", "loads", "Unpickler"}:
            found.append(f"{where}:{node.lineno}: {name}")
        if name in {"np.load", "numpy.load"} and _is_true(_keyword(node, "allow_pickle")):
            found.append(f"{where}:{node.lineno}: {name}(allow_pickle=True)")
        if pyyaml and name in {"yaml.load", "yaml.load_all"}:
            loader = _keyword(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            if loader is None or _dotted(loader) not in safe_loaders:
                found.append(f"{where}:{node.lineno}: {name} without a SafeLoader")
        if name == "yaml.Loader" or (pyyaml and _dotted(_keyword(node, "Loader") or ast.Pass()) == "yaml.Loader"):
            found.append(f"{where}:{node.lineno}: yaml.Loader")
        if last in {"extractall", "unpack_archive"} and _keyword(node, "filter") is None:
            found.append(f"{where}:{node.lineno}: {last} without filter=")
        if _is_true(_keyword(node, "trust_remote_code")):
            found.append(f"{where}:{node.lineno}: trust_remote_code=True")
    return found


def test_the_scan_covers_the_sources() -> None:
    files = {str(p.relative_to(REPO)) for p in sources()}
    assert {"kernel/ktrain/run/checkpoints.py", "plugins/fsdp/ktrain_fsdp/checkpoint.py"} <= files
    assert any(f.startswith("contrib/") for f in files)


@pytest.mark.parametrize(
    "code",
    [
        "import torch\ntorch.load('x')",
        "import torch\ntorch.load('x', weights_only=False)",
        "import pickle\npickle.loads(b'')",
        "import yaml\nyaml.load('a: 1', Loader=yaml.Loader)",
        "import yaml\nyaml.load('a: 1')",
        "import yaml\nyaml.full_load('a: 1')",
        "import tarfile\ntarfile.open('a.tgz').extractall('out')",
        "import transformers\ntransformers.AutoConfig.from_pretrained('m', trust_remote_code=True)",
    ],
)
def test_each_rule_catches_its_unsafe_call(code: str, tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(code)
    assert problems(sample), code


def test_no_source_loads_untrusted_data_unsafely() -> None:
    found = [problem for path in sources() for problem in problems(path)]
    assert not found, "\n".join(found)


def test_trust_remote_code_is_off_unless_the_config_sets_it() -> None:
    assert attrs.fields(ModelKeys).trust_remote_code.default is False

"""A lazily activated object (``activate("module:Class", roles=...)``) that answers a role's hook without
claiming the role is refused at the config phase, from its module's source, without importing the module.

The plugins' modules are written to ``tmp_path`` and put on ``sys.path``; one test installs a fake
distribution there (its .dist-info with an entry point) and runs the real ``ktrain check`` in process.
"""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import pytest

from ktrain import hookimpl
from ktrain.cli import EXIT_BAD_INPUT, main
from ktrain.config.activation import activate
from ktrain.config.plan import load_plugins_and_config
from ktrain.plugins import PluginError

SHARD = "def ktrain_shard(self, model, run, build_optimizer, build_lr_scheduler):\n    return None"
OPTIMIZER = "def ktrain_build_optimizer(self, params, run):\n    return None"
OBJECTIVE = "def ktrain_build_objective(self, run, engine):\n    return None"


def write(root: Path, files: dict[str, str]) -> None:
    """Write ``files`` (path relative to ``root`` -> source, dedented) under ``root``."""
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")


def method(source: str, marker: str = "@hookimpl") -> str:
    """A method's source at class level, marked as a hook implementation."""
    return textwrap.indent(f"{marker}\n{source}" if marker else source, "    ")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder on ``sys.path``; the modules imported from it are forgotten after the test."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    before = set(sys.modules)
    yield root
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", "") and sys.modules[name].__file__.startswith(str(root)):
            del sys.modules[name]


def lazy(name: str, target: str, roles: tuple[str, ...]) -> types.ModuleType:
    """An entry module registered in process that activates ``target`` lazily, claiming ``roles``."""
    module = types.ModuleType(name)

    def ktrain_activate(config, activate):
        activate(target, roles=roles)

    module.ktrain_activate = hookimpl(ktrain_activate)
    return module


def refusal(config: Path, target: str, roles: tuple[str, ...], *, with_defaults: bool) -> str | None:
    """The message activating ``target`` for ``config`` is refused with, None where it is accepted."""
    plugins, loaded = load_plugins_and_config(config, [], [("lazy", lazy("lazy", target, roles))])
    try:
        activate(plugins, loaded, with_defaults=with_defaults)
    except PluginError as e:
        return str(e)
    return None


RUNTIME = f"""\
import torch  # a runtime module: the config phase must not import it

from ktrain import hookimpl


class Sharder:
    def __init__(self, config):
        self.config = config

{method(SHARD)}
"""


@pytest.mark.parametrize("roles", [(), ("sharding",)])
def test_check_refuses_a_lazy_target_answering_a_role_hook_it_does_not_claim(site, tiny_config, capsys, roles) -> None:
    write(
        site,
        {
            "lazy_shard_entry.py": f"""\
                from ktrain import hookimpl


                @hookimpl
                def ktrain_activate(config, activate):
                    activate("lazy_shard_runtime:Sharder", roles={roles!r})
                """,
            "lazy_shard_runtime.py": RUNTIME,
            "ktrain_plugin_lazy_shard-0.1.dist-info/METADATA": "Metadata-Version: 2.1\n"
            "Name: ktrain-plugin-lazy-shard\nVersion: 0.1\n",
            "ktrain_plugin_lazy_shard-0.1.dist-info/entry_points.txt": "[ktrain]\nlazy_shard = lazy_shard_entry\n",
        },
    )
    code = main(["check", str(tiny_config())])
    captured = capsys.readouterr()
    assert "lazy_shard_runtime" not in sys.modules  # read, not imported (it imports torch)
    if roles:
        assert code == 0, captured.err
        assert "sharding: 'lazy_shard' (ktrain-plugin-lazy-shard 0.1)" in captured.out
        return
    assert code == EXIT_BAD_INPUT
    assert captured.err.strip() == (
        "ktrain: plugin 'lazy_shard' (ktrain-plugin-lazy-shard 0.1) implements ktrain_shard on its runtime object "
        "Sharder without claiming the role 'sharding': pass roles=('sharding', ...) to activate(), or remove the hook"
    )


LAYOUTS = {
    "a base class in a sibling module": (
        {
            "base.py": f"from ktrain import hookimpl\n\n\nclass Base:\n{method(OPTIMIZER)}\n",
            "runtime.py": "from .base import Base\n\n\nclass Runtime(Base):\n    def __init__(self, config):\n"
            "        pass\n",
        },
        "runtime:Runtime",
        ("optimizer", "Runtime", "ktrain_build_optimizer"),
    ),
    "a base named through its module": (
        {
            "base.py": f"import ktrain\n\n\nclass Base:\n{method(SHARD, '@ktrain.hookimpl(tryfirst=True)')}\n",
            "runtime.py": "import {pkg}.base as b\n\nAlias = b.Base\n\n\nclass Runtime(Alias):\n"
            "    def __init__(self, config):\n        pass\n",
        },
        "runtime:Runtime",
        ("sharding", "Runtime", "ktrain_shard"),
    ),
    "a factory importing its class inside": (
        {
            "impl.py": f"from ktrain import hookimpl as impl\n\n\nclass Objective:\n"
            f"    def __init__(self, config):\n        pass\n\n{method(OBJECTIVE, '@impl')}\n",
            "factories.py": "def build(config):\n    from {pkg}.impl import Objective\n\n"
            "    return Objective(config)\n",
        },
        "factories:build",
        ("objective", "Objective", "ktrain_build_objective"),
    ),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_source_reading_refuses_what_the_built_object_is_refused_for(site, tiny_config, layout) -> None:
    files, target, (role, class_name, hook) = LAYOUTS[layout]
    pkg = f"lazy_layout_{list(LAYOUTS).index(layout)}"
    write(site, {f"{pkg}/__init__.py": "", **{f"{pkg}/{n}": s.replace("{pkg}", pkg) for n, s in files.items()}})
    target = f"{pkg}.{target}"
    config = tiny_config()
    read = refusal(config, target, (), with_defaults=False)
    assert not [m for m in sys.modules if m.startswith(f"{pkg}.")]  # the config phase imported nothing of it
    assert read is not None and f"implements {hook} on its runtime object {class_name} " in read
    assert f"without claiming the role '{role}'" in read
    assert refusal(config, target, (role,), with_defaults=False) is None
    assert refusal(config, target, (), with_defaults=True) == read  # the run's check, on the built object


def test_methods_that_are_no_hook_implementations_are_not_refused(site, tiny_config) -> None:
    write(
        site,
        {
            "lazy_plain/__init__.py": "",
            "lazy_plain/base.py": f"from ktrain import hookimpl\n\n\nclass Base:\n{method(SHARD)}\n",
            "lazy_plain/runtime.py": f"from .base import Base\n\n\nclass Unmarked:\n{method(SHARD, '')}\n\n\n"
            f"class Overriding(Base):\n{method(SHARD, '')}\n",
        },
    )
    for name in ("Unmarked", "Overriding"):
        assert refusal(tiny_config(), f"lazy_plain.runtime:{name}", (), with_defaults=False) is None

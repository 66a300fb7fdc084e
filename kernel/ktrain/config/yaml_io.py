"""Reading YAML the way users mean it.

PyYAML follows YAML 1.1, where ``2e-5`` (no dot) is a string; users mean a number, so floats are
resolved as YAML 1.2 does. Duplicate keys, which PyYAML silently resolves to the last one, are errors.
Each top-level key remembers its line, so ``ktrain check`` can say where a value came from.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ktrain.config.report import ConfigError

_FLOAT_12 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats and an error on duplicate keys."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            what = f"a key must be a plain value, not {type(key).__name__} {key!r}"
            raise yaml.constructor.ConstructorError(None, None, what, key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_scalar(text: str) -> Any:
    """Parse one ``--set`` value as YAML (``true``, ``2e-5``, ``[a, b]``), the way the file would."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError:
        return text


def load_yaml(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Return the mapping in ``path`` and the line (1-based) of each top-level key.

    Raises ``ConfigError`` naming the file (and line) when it is missing, unreadable, malformed or not
    a mapping.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError.single("", f"config file {source} does not exist", source) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError.single("", f"cannot read config file {source}: {e}", source) from None
    try:
        node = yaml.compose(text, Loader=_Loader)
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        what = getattr(e, "problem", None) or str(e)
        raise ConfigError.single("", f"{source} is not valid YAML{where}: {what}", source) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError.single(
            "", f"{source} must hold a mapping of keys (key: value), not a {type(data).__name__}", source
        )
    lines = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            lines[str(key_node.value)] = key_node.start_mark.line + 1
    return data, lines


def dump_yaml(data: dict[str, Any]) -> str:
    """Write a config mapping as YAML, keys in the given order."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)

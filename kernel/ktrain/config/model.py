"""The structured config of one run: flat attribute access to every key, and where each came from."""

from __future__ import annotations

from typing import Any

import attrs

from ktrain.config.yaml_io import dump_yaml


@attrs.define
class Config:
    """Every section, structured; ``config.micro_batch_size`` reads a key whatever section owns it.

    ``present`` holds the keys the user set (in the file or with ``--set``) to a value; ``unset`` those
    written as null (an empty value), which hold their default and are not present; ``origins`` says where
    each value came from; ``owners`` which plugin owns each key.
    """

    sections: dict[type, Any]
    owners: dict[str, str]
    present: frozenset[str]
    origins: dict[str, str]
    source: str
    unset: frozenset[str] = frozenset()
    _values: dict[str, Any] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._values = {f.name: getattr(obj, f.name) for obj in self.sections.values() for f in attrs.fields(type(obj))}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"config has no key {name!r}") from None

    def section(self, cls: type) -> Any:
        """The structured section of class ``cls``."""
        return self.sections[cls]

    def is_set(self, key: str) -> bool:
        """Whether the user set ``key`` (rather than it holding its default)."""
        return key in self.present

    def to_dict(self) -> dict[str, Any]:
        """Every key with its value, plain YAML types, in section order."""
        out: dict[str, Any] = {}
        for obj in self.sections.values():
            out.update(attrs.asdict(obj, recurse=True))
        return out

    def to_yaml(self, only_present: bool = False) -> str:
        data = self.to_dict()
        if only_present:
            data = {k: v for k, v in data.items() if k in self.present}
        return dump_yaml(data)

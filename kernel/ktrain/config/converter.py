"""A cattrs converter that never turns one type into another.

cattrs' default converter calls ``int("8")`` and ``bool("false")`` (which is True); users then train
with a value they did not write. Here a string is never a number or a bool, a bool is never a number,
and an int is accepted where a float is expected (``learning_rate: 1`` means 1.0).
"""

from __future__ import annotations

import contextlib
import difflib
import math
import types
import typing
from collections.abc import Iterator
from typing import Any

import attrs
import attrs.validators
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn

from ktrain.config.report import Report

_NAMES = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}


def _strict(kind: type):
    def structure(value: Any, _type: type) -> Any:
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            raise TypeError(f"expected {_NAMES[kind]}, got {type(value).__name__} {value!r}")
        if kind is float and not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value!r}")
        return value

    return structure


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if tp in _NAMES:
        return _NAMES[tp]
    origin = typing.get_origin(tp)
    return f"a {origin.__name__ if origin else getattr(tp, '__name__', str(tp))}"


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _union_hook(conv: cattrs.Converter):
    def structure(value: Any, tp: Any) -> Any:
        members = typing.get_args(tp)
        if value is None and type(None) in members:
            return None
        real = [m for m in members if m is not type(None)]
        if len(real) == 1:  # Optional[X]: X's own error is the precise one
            return conv.structure(value, real[0])
        for member in real:
            try:
                return conv.structure(value, member)
            except Exception:
                continue
        wanted = " or ".join(_type_name(m) for m in members)
        raise TypeError(f"expected {wanted}, got {type(value).__name__} {value!r}")

    return structure


def _kind_check(value: Any, wanted: type) -> None:
    if not isinstance(value, wanted):
        kind = "a list (- item)" if wanted is list else "a mapping (key: value)"
        raise TypeError(f"expected {kind}, got {type(value).__name__} {value!r}")


def _list_hook(conv: cattrs.Converter):
    """Structure a list item by item, with the index of every bad item; a string is not a list."""

    def structure(value: Any, tp: Any) -> list:
        _kind_check(value, list)
        (item_type,) = typing.get_args(tp) or (Any,)
        items, errors = [], []
        for i, item in enumerate(value):
            try:
                items.append(conv.structure(item, item_type))
            except Exception as e:
                e.__notes__ = [*getattr(e, "__notes__", []), IterableValidationNote(f"index {i}", i, item_type)]
                errors.append(e)
        if errors:
            raise IterableValidationError(f"while structuring {tp}", errors, tp)
        return items

    return structure


def _dict_hook(conv: cattrs.Converter):
    def structure(value: Any, tp: Any) -> dict:
        _kind_check(value, dict)
        key_type, value_type = typing.get_args(tp) or (Any, Any)
        return {conv.structure(k, key_type): conv.structure(v, value_type) for k, v in value.items()}

    return structure


def written(value: dict) -> dict:
    """The keys of a mapping that hold a value: a null (an empty value in YAML) means "not set"."""
    return {k: v for k, v in value.items() if v is not None}


@contextlib.contextmanager
def _validators_off() -> Iterator[None]:
    """attrs validators off while a class is built (nested classes too), restored after."""
    before = attrs.validators.get_disabled()
    attrs.validators.set_disabled(True)
    try:
        yield
    finally:
        attrs.validators.set_disabled(before)


def _validate(obj: Any, cl: type, skip: set[str]) -> list[Exception]:
    """Run the attrs validator of every field not in ``skip``: one error per failing field, under its key's name.

    attrs runs validators in ``__init__``, where a failure names no field cattrs can report; here each
    failure becomes ``key: message`` like every other problem.
    """
    errors: list[Exception] = []
    for f in attrs.fields(cl):
        if f.validator is None or f.name in skip:
            continue
        try:
            f.validator(obj, f, getattr(obj, f.name))
        except (ValueError, TypeError) as e:
            text = str(e.args[0]) if e.args else str(e)
            text = text.removeprefix(f"'{f.name}' ")
            error = ValueError(text)
            error.__notes__ = [
                AttributeValidationNote(f"Structuring class {cl.__qualname__} @ attribute {f.name}", f.name, f.type)
            ]
            errors.append(error)
    return errors


def _attrs_hook_factory(conv: cattrs.Converter):
    def factory(cl: type):
        inner = make_dict_structure_fn(cl, conv, _cattrs_forbid_extra_keys=True)

        def structure(value: Any, _tp: Any) -> Any:
            _kind_check(value, dict)
            value = written(value)
            failed: list[Exception] = []
            bad: set[str] = set()
            with _validators_off():
                try:
                    obj = inner(value, cl)
                except ClassValidationError as e:  # validate the other keys too: every problem at once
                    failed = list(e.exceptions)
                    bad = {note.name for _, note in e.group_exceptions()[0]}
                    try:
                        obj = inner({k: v for k, v in value.items() if k not in bad}, cl)
                    except Exception:
                        raise e from None
            failed += _validate(obj, cl, skip=bad)
            if failed:
                raise ClassValidationError(f"While structuring {cl.__name__}", failed, cl)
            return obj

        return structure

    return factory


def make_converter() -> cattrs.Converter:
    """Return the strict converter used for every config section."""
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for kind in (bool, int, float, str):
        conv.register_structure_hook(kind, _strict(kind))
    conv.register_structure_hook(Any, lambda v, _: v)
    conv.register_structure_hook_func(_is_union, _union_hook(conv))
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is list, _list_hook(conv))
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is dict, _dict_hook(conv))
    conv.register_structure_hook_factory(attrs.has, _attrs_hook_factory(conv))
    return conv


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return "required key missing"
    text = str(exc)
    if isinstance(exc, ValueError) and "not in literal" in text:
        return f"must be one of {text.split('not in literal', 1)[1].strip()}"
    if "Unable to structure" in text or "No matching" in text:
        return f"has the wrong type ({text})"
    return text


def _suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def report_errors(exc: BaseException, path: str, cls: type | None, report: Report) -> None:
    """Walk a cattrs error tree and add one problem per leaf, each with its key path."""
    if isinstance(exc, ForbiddenExtraKeysError):
        fields = [f.name for f in attrs.fields(exc.cl)] if attrs.has(exc.cl) else []
        for extra in sorted(exc.extra_fields, key=str):
            report.error(
                f"{path}.{extra}" if path else str(extra),
                f"unknown key{_suggest(str(extra), fields)} (known here: {', '.join(fields)})",
            )
        return
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        if isinstance(exc, ClassValidationError):
            excs, notes = exc.group_exceptions()
            for sub, note in excs:
                sub_path = f"{path}.{note.name}" if path else note.name
                report_errors(sub, sub_path, getattr(note, "type", None), report)
            for sub in notes if isinstance(notes, list) else []:
                report_errors(sub, path, None, report)
        else:
            excs, _ = exc.group_exceptions()
            for sub, note in excs:
                report_errors(sub, f"{path}[{note.index}]", None, report)
        return
    if isinstance(getattr(exc, "exceptions", None), (list, tuple)):
        for sub in exc.exceptions:
            report_errors(sub, path, cls, report)
        return
    report.error(path, _describe(exc))

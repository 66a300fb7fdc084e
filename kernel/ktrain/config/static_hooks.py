"""The hooks a lazy activation's object will implement, read from its module's source without importing it.

A plugin may pass ``activate()`` the ``"module:attribute"`` of the class (or factory) that builds its runtime
object; the config phase imports no runtime module (they import torch), so it reads the source with ``ast``:

- a class: its methods named ``ktrain_*`` marked with ``hookimpl``, and those of its base classes found in
  the same package (the target's top-level package) or in the kernel's, through the module's imports
  (``from .base import Base``, ``import pkg.base as base`` then ``base.Base``, relative or absolute), a
  name bound again (``Alias = Base``) and a package's ``__init__`` that imports the class;
- a factory function: the classes of its ``return ClassName(...)`` statements, the class defined in the
  module or imported by it, at its top or inside the function (``from pkg.runtime import Runtime``).

What the source does not spell out is not seen, and is checked when the run builds the object: a base
class of another package (torch, transformers), a method added at run time or assigned (``ktrain_shard =
shard``), a factory returning anything but a call of a class it names, a module that is no ``.py`` file.
No module is imported: packages are located through their ``__path__`` as the import system would.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator

_DEPTH = 12
"""How many names, bases and imports one reading follows before it gives up (a cycle, or a deep chain)."""

_KERNEL_PACKAGE = "ktrain"


def implemented_hooks(target: str) -> list[tuple[str, str]]:
    """``(class name, hook)`` for each ``ktrain_*`` hook the object built by ``target`` implements.

    ``target`` is ``"module:attribute"``; the list is empty when the source says nothing (see the module).
    """
    module_name, _, attr = target.partition(":")
    module = _load(module_name)
    if module is None or not attr:
        return []
    reader = _Reader(packages={module_name.partition(".")[0], _KERNEL_PACKAGE})
    try:
        found = reader.lookup(module, attr, depth=0)
        if found is None:
            return []
        where, node = found
        is_class = isinstance(node, ast.ClassDef)
        classes = [(where, node)] if is_class else list(reader.returned_classes(where, node))
        hooks: list[tuple[str, str]] = []
        for where, cls in classes:
            hooks += [(cls.name, hook) for hook in reader.class_hooks(where, cls, depth=0)]
    except (RecursionError, StopIteration, AttributeError, TypeError, ValueError):
        return []  # a source this reading does not follow: the run checks the object it builds
    return hooks


class _Module:
    """A module's name, the package its relative imports start from, and its parsed source."""

    def __init__(self, name: str, package: str, tree: ast.Module) -> None:
        self.name = name
        self.package = package
        self.tree = tree

    @functools.cached_property
    def markers(self) -> set[str]:
        """The names this module binds to a ``hookimpl`` marker (``from ktrain import hookimpl as impl``...)."""
        names = {"hookimpl"}
        for stmt in _statements(self.tree.body):
            if isinstance(stmt, ast.ImportFrom):
                names.update(a.asname or a.name for a in stmt.names if a.name == "hookimpl")
            elif isinstance(stmt, ast.Assign) and _is_marker(stmt.value, names):
                names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        return names


def _is_marker(expr: ast.expr, names: set[str]) -> bool:
    """Whether ``expr`` is a ``hookimpl`` marker, called (``hookimpl(tryfirst=True)``) or not."""
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Name | ast.Attribute) and _last_name(func) == "HookimplMarker":
            return True
        expr = func
    if isinstance(expr, ast.Name):
        return expr.id in names
    return isinstance(expr, ast.Attribute) and expr.attr == "hookimpl"


def _last_name(expr: ast.Name | ast.Attribute) -> str:
    return expr.id if isinstance(expr, ast.Name) else expr.attr


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a module's (or function's) scope, those under ``if``/``try``/``with`` included."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for inner in getattr(stmt, block, ()):
                    yield from _statements(inner.body if isinstance(inner, ast.ExceptHandler) else [inner])


class _Reader:
    """Follows names through the modules of ``packages`` (top-level package names), never importing one."""

    def __init__(self, packages: set[str]) -> None:
        self.packages = packages

    def module(self, name: str) -> _Module | None:
        return _load(name) if name.partition(".")[0] in self.packages else None

    def lookup(
        self, module: _Module, name: str, *, depth: int, scope: list[ast.stmt] = ()
    ) -> tuple[_Module, ast.ClassDef | ast.FunctionDef] | None:
        """The class or function ``name`` is bound to in ``scope`` (a function's body), else in ``module``."""
        if depth > _DEPTH:
            return None
        binding = _binding(list(scope), name) if scope else None
        if binding is None:
            binding = _binding(list(_statements(module.tree.body)), name)
        if binding is None:
            return None
        if isinstance(binding, ast.ClassDef | ast.FunctionDef):
            return module, binding
        if isinstance(binding, ast.ImportFrom):
            source = _absolute(module, binding)
            imported = next(a.name for a in binding.names if (a.asname or a.name) == name)
            other = self.module(source)
            found = self.lookup(other, imported, depth=depth + 1) if other is not None else None
            return found
        if isinstance(binding, ast.expr):
            return self.resolve(module, binding, depth=depth + 1, scope=scope)
        return None

    def resolve(
        self, module: _Module, expr: ast.expr, *, depth: int, scope: list[ast.stmt] = ()
    ) -> tuple[_Module, ast.ClassDef | ast.FunctionDef] | None:
        """The class or function an expression names: ``Name``, or ``module.Name`` through an import."""
        if isinstance(expr, ast.Name):
            return self.lookup(module, expr.id, depth=depth, scope=scope)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name | ast.Attribute):
            other = self.module_named(module, expr.value, scope)
            return self.lookup(other, expr.attr, depth=depth + 1) if other is not None else None
        return None

    def module_named(self, module: _Module, expr: ast.Name | ast.Attribute, scope: list[ast.stmt]) -> _Module | None:
        """The module an expression names through ``import a.b [as c]`` or ``from a import b``."""
        dotted = []
        while isinstance(expr, ast.Attribute):
            dotted.insert(0, expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        binding = _binding(list(scope), expr.id) if scope else None
        if binding is None:
            binding = _binding(list(_statements(module.tree.body)), expr.id)
        if isinstance(binding, ast.Import):
            alias = next(a for a in binding.names if (a.asname or a.name.partition(".")[0]) == expr.id)
            base = alias.name if alias.asname else expr.id
        elif isinstance(binding, ast.ImportFrom):
            alias = next(a for a in binding.names if (a.asname or a.name) == expr.id)
            base = f"{_absolute(module, binding)}.{alias.name}"
        else:
            return None
        return self.module(".".join([base, *dotted]))

    def class_hooks(self, module: _Module, cls: ast.ClassDef, *, depth: int) -> list[str]:
        """The hooks an instance of ``cls`` answers: its marked ``ktrain_*`` methods, then its bases' not overridden."""
        if depth > _DEPTH:
            return []
        hooks: list[str] = []
        defined: set[str] = set()
        for stmt in cls.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                defined.add(stmt.name)
                if stmt.name.startswith("ktrain_") and any(_is_marker(d, module.markers) for d in stmt.decorator_list):
                    hooks.append(stmt.name)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                defined.update(t.id for t in targets if isinstance(t, ast.Name))
        for base in cls.bases:
            found = self.resolve(module, base, depth=depth + 1)
            if found is not None and isinstance(found[1], ast.ClassDef):
                inherited = self.class_hooks(*found, depth=depth + 1)
                hooks += [h for h in inherited if h not in defined and h not in hooks]
        return hooks

    def returned_classes(self, module: _Module, function: ast.FunctionDef) -> Iterator[tuple[_Module, ast.ClassDef]]:
        """The classes a factory's ``return ClassName(...)`` statements build (imports inside it followed)."""
        body = list(_own_statements(function))
        for stmt in body:
            if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Call):
                found = self.resolve(module, stmt.value.func, depth=1, scope=body)
                if found is not None and isinstance(found[1], ast.ClassDef):
                    yield found


def _own_statements(function: ast.FunctionDef) -> Iterator[ast.stmt]:
    """Every statement of ``function``, nested blocks included, those of functions and classes inside it not."""
    stack = list(reversed(function.body))
    while stack:
        stmt = stack.pop()
        yield stmt
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        inner = [child for child in ast.iter_child_nodes(stmt) if isinstance(child, ast.stmt)]
        inner += [s for h in getattr(stmt, "handlers", ()) for s in h.body]
        stack += reversed(inner)


def _binding(statements: list[ast.stmt], name: str) -> ast.AST | None:
    """The last statement binding ``name``: a definition, an import, or an assignment's value (an expression)."""
    found: ast.AST | None = None
    for stmt in statements:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            found = stmt.value
        elif _defines(stmt, name):
            found = stmt
    return found


def _defines(stmt: ast.stmt, name: str) -> bool:
    """Whether ``stmt`` binds ``name`` by a ``class``, a ``def`` or an import."""
    if isinstance(stmt, ast.ClassDef | ast.FunctionDef):
        return stmt.name == name
    if isinstance(stmt, ast.ImportFrom):
        return any((a.asname or a.name) == name for a in stmt.names)
    if isinstance(stmt, ast.Import):
        return any((a.asname or a.name.partition(".")[0]) == name for a in stmt.names)
    return False


def _absolute(module: _Module, stmt: ast.ImportFrom) -> str:
    """The module ``from ... import`` reads, its leading dots resolved against ``module``'s package."""
    if not stmt.level:
        return stmt.module or ""
    parts = module.package.split(".")
    base = parts[: len(parts) - stmt.level + 1]
    return ".".join([*base, *([stmt.module] if stmt.module else [])])


def _load(name: str) -> _Module | None:
    """Parse the source of the module ``name`` (not imported); None where it is not a ``.py`` file found."""
    path = _source_path(name)
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    tree = _parse(path, stat.st_mtime_ns, stat.st_size)
    if tree is None:
        return None
    package = name if os.path.basename(path) == "__init__.py" else name.rpartition(".")[0]
    return _Module(name, package, tree)


@functools.lru_cache(maxsize=256)
def _parse(path: str, mtime_ns: int, size: int) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None  # the run's import reports it


def _source_path(name: str) -> str | None:
    """The ``.py`` file of module ``name``, found the way the import system would, importing nothing."""
    parts = name.split(".")
    spec = None
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        loaded = sys.modules.get(full)
        try:
            if loaded is not None:
                spec = getattr(loaded, "__spec__", None)
            elif i == 0:
                spec = importlib.util.find_spec(full)  # a top-level name: only the finders are asked
            else:
                locations = spec.submodule_search_locations if spec is not None else None
                spec = importlib.machinery.PathFinder.find_spec(full, list(locations)) if locations else None
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
    origin = spec.origin
    return origin if origin and origin.endswith(".py") and os.path.isfile(origin) else None

"""The import graph of the kernel, the plugins and the contrib examples: no circles, and a kernel top level that
shows what the kernel is.

The modules are read with ``ast``, not imported: every ``import`` and ``from ... import`` counts, those inside
functions and under ``TYPE_CHECKING`` too, since a circle through a deferred import is still two modules that
each need the other. A name imported from a package counts as an import of its submodule when one has that
name, else of the package's ``__init__``. Tests and benchmarks are left out: nothing imports them.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from tests.kit import REPO

LEFT_OUT = {"tests", "benchmarks"}
KERNEL_TOP_LEVEL = {
    "__init__",
    "hookspecs",  # the contract
    "plugins",
    "registry",
    "engine",
    "cli",
    "launcher",
    "config/",
    "run/",
    "data/",
    "builtin/",
    "testing/",
    "bench/",
    "memory/",  # the memory model of one rank (ktrain plan)
    "commands/",
}
"""The modules (``name``) and packages (``name/``) of kernel/ktrain/: adding one is a decision about what the
kernel is, taken here."""


def source_roots() -> list[Path]:
    """The folders the distributions install their packages from: kernel/, and each plugin and contrib example."""
    roots = [REPO / "kernel"]
    for group in ("plugins", "contrib"):
        roots += sorted(path.parent for path in (REPO / group).glob("*/pyproject.toml"))
    return roots


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of every source root outside tests and benchmarks."""
    found: dict[str, Path] = {}
    for root in source_roots():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if LEFT_OUT.intersection(parts):
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names ``node`` imports, with relative imports made absolute: ``A.B`` for ``from A import B``
    (the caller keeps its longest prefix that is a module: ``A.B`` or ``A``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        kept = package[: len(package) - (node.level - 1)]
        base = ".".join([*kept, base] if base else kept)
    return [f"{base}.{alias.name}" for alias in node.names]


def _known(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of ``known``'s modules, or None (a module of another project)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of this repository it imports."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported(node, module, path.name == "__init__.py"):
                    target = _known(name, known)
                    if target is not None and target != module:
                        edges.add(target)
        graph[module] = edges
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules each reachable from every other one (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def shortest_circle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A shortest import path from the group's first module back to itself, through the group only."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for successor in sorted(graph[node] & members):
            if successor == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if successor not in came_from:
                came_from[successor] = node
                queue.append(successor)
    raise AssertionError(f"no circle through {start} in {group}")


def test_the_graph_sees_imports_of_every_form() -> None:
    """Absolute, relative, deferred and package imports all become edges (a graph that saw none would pass)."""
    graph = import_graph()
    assert "ktrain.bench.rows" in graph["ktrain.bench.command"]  # absolute, at the top
    assert "ktrain.bench.peer" in graph["ktrain.bench.measure"]  # inside a function
    assert "ktrain" in graph["ktrain.bench.measure"]  # a name from the package's __init__
    assert {"ktrain_parallel.checks", "ktrain_parallel.keys"} <= graph["ktrain_parallel.entry"]
    assert not any(LEFT_OUT.intersection(name.split(".")) for name in graph)


def test_no_import_circles() -> None:
    """No module of the kernel, a plugin or a contrib example imports, through others, a module that imports it."""
    graph = import_graph()
    circles = [
        " -> ".join(shortest_circle(graph, group)) + f" (modules bound together by circles: {', '.join(group)})"
        for group in strongly_connected(graph)
    ]
    assert not circles, "import circles (move what both sides need into a module of its own):\n" + "\n".join(circles)


def test_the_kernel_top_level_holds_the_expected_modules() -> None:
    """kernel/ktrain/ holds the kernel's modules and packages named in ``KERNEL_TOP_LEVEL``, and nothing else."""
    top = REPO / "kernel" / "ktrain"
    found = {path.stem for path in top.glob("*.py")} | {
        f"{path.name}/" for path in top.iterdir() if (path / "__init__.py").is_file()
    }
    assert found == KERNEL_TOP_LEVEL, (
        f"kernel/ktrain/ differs from KERNEL_TOP_LEVEL: new {sorted(found - KERNEL_TOP_LEVEL)}, "
        f"gone {sorted(KERNEL_TOP_LEVEL - found)}; a module belongs in one of the kernel's packages or in a plugin"
    )


HEAVY = ("torch", "transformers", "deepspeed", "peft", "bitsandbytes", "triton", "liger_kernel")
"""Libraries that entry.py and keys.py never import at module level: every ktrain command imports them."""
RUN_MODULES = ("runtime", "sink", "tracker")
"""The module that holds a plugin's run-time part: ``runtime`` (the object ``ktrain_activate`` registers), or a
metric sink's ``sink`` or an experiment tracker's ``tracker``, which entry.py reaches only lazily."""


def plugin_packages() -> dict[str, Path]:
    """Package name -> folder, for every distribution under plugins/ and contrib/ except the template (its
    skeleton's layout is checked by rendering it, in contrib/template/tests)."""
    found = {}
    for root in source_roots():
        if root == REPO / "kernel" or root == REPO / "contrib" / "template":
            continue
        (package,) = [path for path in root.glob("ktrain_*") if (path / "__init__.py").is_file()]
        found[package.name] = package
    return found


def _module_level_imports(path: Path, module: str) -> list[str]:
    """The dotted names ``path`` imports when it is imported: statements outside functions and outside
    ``if TYPE_CHECKING:`` blocks."""
    names: list[str] = []
    pending: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"), filename=str(path))]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += _imported(node, module, path.name == "__init__.py")
        pending.extend(ast.iter_child_nodes(node))
    return names


def heavy_imports(package: str, start: str) -> list[str]:
    """``start -> ... -> library`` for every heavy library that importing module ``start`` loads, following the
    module-level imports within ``package`` (its ``__init__`` included)."""
    known = modules()
    chains: list[str] = []
    came_from: dict[str, str | None] = {start: None, package: start} if start != package else {start: None}
    queue = deque(came_from)
    while queue:
        module = queue.popleft()
        for name in _module_level_imports(known[module], module):
            top = name.split(".")[0]
            if top in HEAVY:
                chain, step = [top], module
                while step is not None:
                    chain.append(step)
                    step = came_from[step]
                chains.append(" -> ".join(reversed(chain)))
                continue
            target = _known(name, known)
            if target is not None and target.split(".")[0] == package and target not in came_from:
                came_from[target] = module
                queue.append(target)
    return chains


def test_every_plugin_has_keys_entry_and_a_run_module_and_imports_nothing_heavy_to_configure() -> None:
    """docs/writing-plugins.md, "Entry module and runtime object": keys.py, entry.py, and runtime.py (or a sink
    or tracker module that entry.py reaches lazily); entry.py and keys.py load no torch nor other heavy library."""
    packages = plugin_packages()
    assert {"ktrain_lora", "ktrain_deepspeed", "ktrain_tensorboard", "ktrain_wandb"} <= packages.keys()
    problems = []
    for package, folder in sorted(packages.items()):
        missing = [f"{name}.py" for name in ("keys", "entry") if not (folder / f"{name}.py").is_file()]
        run = [name for name in RUN_MODULES if (folder / f"{name}.py").is_file()]
        if not run:
            missing.append(" or ".join(f"{name}.py" for name in RUN_MODULES))
        if missing:
            problems.append(f"{folder.relative_to(REPO)} has no {', '.join(missing)}")
            continue
        entry = folder / "entry.py"
        eager = {_known(n, modules()) for n in _module_level_imports(entry, f"{package}.entry")}
        for name in run:
            if f"{package}.{name}" in eager:
                problems.append(f"{package}.entry imports {package}.{name} at module level; import it in the hook")
            elif f"{package}.{name}" not in entry.read_text(encoding="utf-8"):
                problems.append(f"{package}.entry never reaches {package}.{name} (an import in a hook or a lazy())")
        for start in ("entry", "keys"):
            problems += [f"{chain} at module level" for chain in heavy_imports(package, f"{package}.{start}")]
    assert not problems, "plugin layout (docs/writing-plugins.md, Entry module and runtime object):\n" + "\n".join(
        problems
    )

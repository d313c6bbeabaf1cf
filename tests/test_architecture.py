"""The import directions of the design, checked on the source.

Arrows point down only: commands -> API -> frontends -> lowering -> OpTable ->
engine -> kernels. The core predicts; ``predictor.calibration`` measures and
fits, so it may import the core and never the reverse.

The folders ``kernels/``, ``specs/`` and ``calibration/`` install as
``predictor.kernels``, ``predictor.specs`` and ``predictor.calibration``
(``[tool.setuptools] package-dir`` in pyproject.toml). Tools that walk the
package folder cannot see that remap, so the imports are read here with ``ast``
under the installed names, without importing anything. Every import counts:
module level, inside functions, under ``if TYPE_CHECKING``, relative, and
``importlib.import_module("...")`` with a literal name. A lazy import is still
a dependency.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# source folder -> installed package name
FOLDERS = {
    "predictor": "predictor",
    "kernels": "predictor.kernels",
    "specs": "predictor.specs",
    "calibration": "predictor.calibration",
    "benchmarks": "benchmarks",
}
# Above the core: the package facade (its lazy __getattr__ exposes the public
# API, predictor.calibrate included) and the command line.
ENTRY_POINTS = ("predictor", "predictor.cli")
# Beside the core, each with its own contract.
NOT_CORE_PACKAGES = ("predictor.commands", "predictor.kernels", "predictor.specs",
                     "predictor.calibration")
FORBIDDEN_FOR_CORE = ("predictor.calibration", "benchmarks")
KERNELS_MAY_USE = {"numpy", "numba"}  # besides themselves and the standard library


@dataclass(frozen=True)
class Edge:
    source: str   # importing module
    target: str   # imported module (a project module when it resolves to one)
    where: str    # file:line

    def __str__(self) -> str:
        return f"{self.where}: {self.source} -> {self.target}"


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def module_name(folder: str, path: Path) -> str:
    parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([FOLDERS[folder], *parts])


def imports(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in ``source``, at any depth.

    ``from a import b`` names the submodule ``a.b`` when that is a module of
    ours, else ``a``. Relative imports resolve against ``module``.
    """
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in known else base, node.lineno))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.args[0].value, node.lineno))
    return found


@lru_cache(maxsize=None)
def scan() -> tuple[dict[str, Path], tuple[Edge, ...]]:
    """Every module of the five folders by installed name, and every import edge."""
    files = {}
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            files[module_name(folder, path)] = path
    known = set(files)
    edges = []
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        rel = path.relative_to(REPO)
        for target, line in imports(path.read_text(encoding="utf-8"), module, is_package, known):
            if target != module:
                edges.append(Edge(module, target, f"{rel}:{line}"))
    return files, tuple(dict.fromkeys(edges))  # one edge per line and target


def is_core(module: str) -> bool:
    """Every module of the predictor/ folder but the facade and the command line."""
    return (within(module, "predictor") and module not in ENTRY_POINTS
            and not any(within(module, p) for p in NOT_CORE_PACKAGES))


def listing(title: str, edges) -> str:
    return title + ":\n  " + "\n  ".join(str(e) for e in edges)


# --------------------------------------------------------------------------- cycles


def shortest_cycles(nodes: set[str], edges) -> list[tuple[list[str], list[Edge]]]:
    """(group, cycle): each group of ``nodes`` that import each other in a
    circle (a strongly connected component), with one of its shortest cycles."""
    out: dict[str, list[Edge]] = {}
    for e in edges:
        if e.source in nodes and e.target in nodes:
            out.setdefault(e.source, [])
            if all(x.target != e.target for x in out[e.source]):
                out[e.source].append(e)

    def shortest_path(start: str, goal: str) -> list[Edge] | None:
        """Fewest edges from start to goal (start != goal), by breadth-first search."""
        came: dict[str, Edge] = {}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            for e in out.get(node, ()):
                if e.target not in came and e.target != start:
                    came[e.target] = e
                    if e.target == goal:
                        path = [e]
                        while path[0].source != start:
                            path.insert(0, came[path[0].source])
                        return path
                    queue.append(e.target)
        return None

    cycles: dict[frozenset, list[Edge]] = {}
    for node in sorted(out):
        best = None
        for first in out[node]:
            back = [] if first.target == node else shortest_path(first.target, node)
            if back is not None and (best is None or len(back) + 1 < len(best)):
                best = [first, *back]
        if best is None:
            continue
        # the group: every node on some cycle with `node`
        group = frozenset({node} | {m for m in out if m != node
                                    and shortest_path(node, m) and shortest_path(m, node)})
        if group not in cycles or len(best) < len(cycles[group]):
            cycles[group] = best
    return [(sorted(g), cycles[g]) for g in sorted(cycles, key=sorted)]


def describe(cycles, edges) -> str:
    """Each circle: its modules, its shortest cycle, and every import inside it."""
    lines = []
    for group, cycle in cycles:
        lines.append(f"{len(group)} modules in a circle: {', '.join(group)}")
        lines.append("  shortest: " + " -> ".join([e.source for e in cycle] + [cycle[0].source]))
        lines.append("  imports inside the circle:")
        lines += [f"    {e}" for e in edges if e.source in group and e.target in group]
    return "\n  ".join(lines)


# --------------------------------------------------------------------------- the scanner itself


def test_scanner_sees_lazy_and_relative_imports():
    source = (
        "import os\n"
        "from . import sibling\n"
        "from ..errors import PredictorError\n"
        "from predictor import engine, errors\n"
        "def f():\n"
        "    import predictor.kernels.roofline as R\n"
        "    from predictor.calibration import file\n"
        "    return importlib.import_module('predictor.specs')\n"
    )
    known = {"predictor.frontend.sibling", "predictor.errors", "predictor.engine",
             "predictor.kernels.roofline", "predictor.calibration.file", "predictor.specs"}
    found = imports(source, "predictor.frontend.x", False, known)
    assert sorted(found) == [
        ("os", 1), ("predictor.calibration.file", 7), ("predictor.engine", 4),
        ("predictor.errors", 3), ("predictor.errors", 4), ("predictor.frontend.sibling", 2),
        ("predictor.kernels.roofline", 6), ("predictor.specs", 8)]
    # in a package's __init__, "." is the package itself
    assert imports("from . import a\n", "predictor.frontend", True,
                   {"predictor.frontend.a"}) == [("predictor.frontend.a", 1)]
    # a name that is not a submodule is an edge to the package it comes from
    assert imports("from predictor import PredictorError\n", "predictor.engine", False,
                   {"predictor.engine"}) == [("predictor", 1)]


def test_cycle_report_finds_the_shortest():
    e = [Edge("a", "b", "a.py:1"), Edge("b", "c", "b.py:1"), Edge("c", "a", "c.py:1"),
         Edge("b", "a", "b.py:2"), Edge("c", "d", "c.py:2")]
    cycles = shortest_cycles({"a", "b", "c", "d"}, e)
    assert [(g, [x.source for x in c]) for g, c in cycles] == [(["a", "b", "c"], ["a", "b"])]
    assert "shortest: a -> b -> a" in describe(cycles, e)


def test_scanner_saw_the_whole_tree():
    files, edges = scan()
    assert len(files) > 40, sorted(files)
    for name in ("predictor.engine", "predictor.kernels.roofline", "predictor.specs",
                 "predictor.calibration", "predictor.commands.predict", "benchmarks.e2e"):
        assert name in files
    core = [m for m in files if is_core(m)]
    assert len(core) > 20 and "predictor.engine" in core
    assert not any(is_core(m) for m in ("predictor", "predictor.cli", "predictor.commands.common",
                                        "predictor.kernels.mlp", "predictor.calibration.train"))
    assert sum(e.source == "predictor.engine" for e in edges) > 3


# --------------------------------------------------------------------------- the contracts


def test_imports_use_installed_names():
    """``import kernels`` works under pytest (the repo root is on sys.path) but
    not once installed: the folders are only reachable as ``predictor.*``."""
    _, edges = scan()
    bad = [e for e in edges if e.target.split(".")[0] in ("kernels", "specs", "calibration")]
    if bad:
        pytest.fail(listing("imports by folder name instead of the installed name", bad),
                    pytrace=False)


def test_kernels_import_nothing_of_ours():
    _, edges = scan()
    allowed = KERNELS_MAY_USE | set(sys.stdlib_module_names)
    bad = [e for e in edges if within(e.source, "predictor.kernels")
           and not within(e.target, "predictor.kernels") and e.target.split(".")[0] not in allowed]
    if bad:
        pytest.fail(listing("predictor.kernels may import only itself, numpy, numba and the "
                            "standard library", bad), pytrace=False)


def test_specs_is_data_only():
    files, _ = scan()
    code = []
    for module, path in files.items():
        if not within(module, "predictor.specs"):
            continue
        if path.name != "__init__.py":
            code.append(f"{path.relative_to(REPO)}: a Python module in the data package")
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            if not (docstring or isinstance(node, ast.Pass)):
                code.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:60]}")
    if code:
        pytest.fail("predictor.specs holds data only:\n  " + "\n  ".join(code), pytrace=False)


def test_core_never_imports_calibration_or_benchmarks():
    _, edges = scan()
    bad = [e for e in edges if is_core(e.source)
           and any(within(e.target, p) for p in FORBIDDEN_FOR_CORE)]
    if bad:
        pytest.fail(listing("the core predicts; it must not import predictor.calibration or "
                            "benchmarks (calibration/ imports the core, not the reverse)", bad),
                    pytrace=False)


def test_core_never_imports_the_command_line():
    _, edges = scan()
    bad = [e for e in edges if is_core(e.source)
           and (e.target == "predictor.cli" or within(e.target, "predictor.commands"))]
    if bad:
        pytest.fail(listing("arrows point down: the core must not import the command line", bad),
                    pytrace=False)


def test_no_cycle_in_the_core():
    files, edges = scan()
    cycles = shortest_cycles({m for m in files if is_core(m)}, edges)
    if cycles:
        pytest.fail(f"import circles in the core:\n  {describe(cycles, edges)}", pytrace=False)


def test_no_cycle_in_commands():
    files, edges = scan()
    cycles = shortest_cycles({m for m in files if within(m, "predictor.commands")}, edges)
    if cycles:
        pytest.fail(f"import circles in predictor.commands:\n  {describe(cycles, edges)}",
                    pytrace=False)

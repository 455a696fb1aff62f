"""No import circle in src/koord: every module's imports, read with ast, form a graph without cycles.

A circle works in Python only while every module in it happens to import the other's names
late enough; it hides a layering mistake (a registry importing its members, a low-level module
reaching up for a type), so the test counts every import: module-level, inside functions, and
under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def modules(src: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package) for every .py file under ``src``."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``src`` it imports (``from pkg import mod`` is an edge to pkg.mod)."""
    mods = modules(src)
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, (path, is_package) in mods.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in mods else module
                           for alias in node.names]
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_src_koord_has_no_import_circle() -> None:
    graph = import_graph(SRC)
    assert len(graph) > 100, "the walk found too few modules to be the real tree"
    assert cycles(graph) == []


@pytest.mark.parametrize("files, expected", [
    # a registry importing its members while they import it: the circle this test guards against
    ({"pkg/__init__.py": "", "pkg/registry.py": "def load():\n    from .member import M\n",
      "pkg/member.py": "from .registry import load\n"}, [["pkg.member", "pkg.registry"]]),
    # a low-level module reaching up for a type only under TYPE_CHECKING still counts
    ({"pkg/__init__.py": "", "pkg/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
      "    from pkg.high import H\n", "pkg/high.py": "from pkg import low\n"}, [["pkg.high", "pkg.low"]]),
    # three modules around, with `import a.b` spelling
    ({"a/__init__.py": "", "a/x.py": "import a.y\n", "a/y.py": "from . import z\n", "a/z.py": "from a.x import f\n"},
     [["a.x", "a.y", "a.z"]]),
    # layered: no circle
    ({"p/__init__.py": "from .top import T\n", "p/top.py": "from .base import B\n", "p/base.py": "import os\n"}, []),
])
def test_the_check_finds_circles(tmp_path: Path, files: dict[str, str], expected: list[list[str]]) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cycles(import_graph(tmp_path)) == expected


# Layer contracts: (importer prefix, imported prefix) pairs that must have no edge.
CONTRACTS = [
    ("koord", "koord_testing"),                 # the product never needs its test support
    ("koord.koordlet", "koord.runtimeproxy"),   # the two binaries meet only in the shared layer
    ("koord.runtimeproxy", "koord.koordlet"),
    ("koord.hookapi", "koord.koordlet"),        # the shared layer sits below both
    ("koord.hookapi", "koord.runtimeproxy"),
    ("koord.apis", "koord.koordlet"),
    ("koord.apis", "koord.runtimeproxy"),
    ("koord.koordlet.qosmanager", "koord.koordlet.runtimehooks.plugins"),  # strategies do not reach into hooks
    ("koord.nri", "koord.koordlet"),            # the NRI wire layer knows no agent
]


def broken_contracts(graph: Mapping[str, Iterable[str]]) -> list[str]:
    def under(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")
    return sorted(f"{src} imports {dst} ({low} must not import {high})" for src, targets in graph.items()
                  for dst in targets for low, high in CONTRACTS if under(src, low) and under(dst, high))


def test_layer_contracts_hold() -> None:
    assert broken_contracts(import_graph(SRC)) == []


def test_the_contract_check_finds_a_broken_layer(tmp_path: Path) -> None:
    for name, text in {"koord/__init__.py": "", "koord/hookapi/__init__.py": "from koord.koordlet import x\n",
                       "koord/koordlet/__init__.py": "", "koord/koordlet/x.py": ""}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert broken_contracts(import_graph(tmp_path)) == [
        "koord.hookapi imports koord.koordlet.x (koord.hookapi must not import koord.koordlet)"]


MAX_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    """Generated protobuf code aside: a module that grows past this is split along its seams."""
    sizes = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")
             if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))}
    assert {name: lines for name, lines in sizes.items() if lines > MAX_LINES} == {}

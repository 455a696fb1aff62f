"""Koordinator's keys and annotation parsers are defined once, in koord.apis.extension: a
second spelling of a key in the product, or a second parser of an annotation extension
parses, fails here naming the file and line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from koord.apis import extension

SRC = Path(__file__).resolve().parents[2] / "src" / "koord"
HOME = SRC / "apis" / "extension.py"
KEY = re.compile(r"(?:[a-z.]*koordinator\.sh/[\w.-]+|kubernetes\.io/(?:batch|mid)-\w+)")
PARSED = {
    "ANNOTATION_RESOURCE_STATUS": "resource_status",
    "ANNOTATION_NODE_RESERVATION": "node_reservation",
    "ANNOTATION_SYSTEM_QOS_RESOURCE": "system_qos_resource",
    "ANNOTATION_KUBELET_CPU_MANAGER_POLICY": "kubelet_cpu_manager_policy",
}
"""Annotations extension parses -> its parser; nobody else reads their JSON."""


def product_files() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if "testing" not in p.relative_to(SRC).parts and p != HOME]


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings (they may name a key in prose)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                value = stmt.value if isinstance(stmt, ast.Expr) else None
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.add(id(value))
    return found


def spelt_keys(path: Path, base: Path = SRC.parent) -> list[str]:
    """``file:line: 'key'`` for each key spelt in ``path`` outside a docstring."""
    tree = ast.parse(path.read_text())
    skip = docstrings(tree)
    return [f"{path.relative_to(base)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and KEY.fullmatch(node.value)]


def test_no_key_is_spelt_outside_extension() -> None:
    found = [hit for path in product_files() for hit in spelt_keys(path)]
    assert not found, "define these in koord.apis.extension and import them:\n" + "\n".join(found)


def test_the_check_finds_a_second_spelling(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Reads ``koordinator.sh/qosClass``."""\nQOS = "koordinator.sh/qosClass"\n')
    assert spelt_keys(module, tmp_path) == ["m.py:2: 'koordinator.sh/qosClass'"]


def test_every_key_is_defined_once_in_extension() -> None:
    values = {name: value for name, value in vars(extension).items() if name.isupper() and isinstance(value, str)}
    assert values, "extension defines no keys"
    assert len(set(values.values())) == len(values), "a key is defined twice in extension"
    assert all(KEY.fullmatch(v) for v in values.values())


@pytest.mark.parametrize("constant,parser", sorted(PARSED.items()))
def test_an_annotation_extension_parses_is_read_nowhere_else(constant: str, parser: str) -> None:
    assert callable(getattr(extension, parser))
    readers = []
    for path in product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and any(isinstance(a, ast.Name) and a.id == constant for a in node.args):
                readers.append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
    assert not readers, f"{constant} parsed outside extension.{parser}: {readers}"

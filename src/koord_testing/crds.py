"""Upstream's CRD schemas (``tests/data/crds``, copied from koordinator-sh/koordinator's
``config/crd/bases``) as JSON-schema validators for the objects koordlet writes.

The API server prunes fields a structural schema does not declare, silently; a misspelt
field would vanish rather than fail. So the check here is stricter: every object level
that declares ``properties`` and no ``additionalProperties`` refuses undeclared fields.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "crds"
FILES = {
    "NodeMetric": "slo.koordinator.sh_nodemetrics.yaml",
    "NodeSLO": "slo.koordinator.sh_nodeslos.yaml",
    "NodeResourceTopology": "topology.node.k8s.io_noderesourcetopologies.yaml",
}


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def schema(kind: str, version: str = "v1alpha1") -> dict:
    crd = yaml.safe_load((CRD_DIR / FILES[kind]).read_text())
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    top = copy.deepcopy(served["schema"]["openAPIV3Schema"])
    top.setdefault("properties", {})["metadata"] = {"type": "object"}  # ObjectMeta is the API server's
    return _strict(top)


def errors(kind: str, obj: dict) -> list[str]:
    """Every way ``obj`` breaks ``kind``'s CRD schema, as 'path: message' lines."""
    validator = jsonschema.Draft7Validator(schema(kind))
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                  for e in validator.iter_errors(obj))

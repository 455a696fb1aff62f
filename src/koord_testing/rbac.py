"""What koordlet's API requests need from RBAC, and what a ClusterRole grants.

A request is (verb, path) as ``FakeKubeAPI`` and ``FakeKubelet`` record them; the
kubelet authorizes ``/pods`` and ``/configz`` as ``nodes/proxy`` (its webhook authorizer's
mapping), so those count as ``get`` on ``nodes/proxy``.
"""

from __future__ import annotations

from collections.abc import Iterable

Permission = tuple[str, str, str]
"""(API group, resource[/subresource], verb)."""


def permission(verb: str, path: str) -> Permission:
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        raise ValueError(f"{path}: not an API path")
    if rest[:1] == ["namespaces"]:
        rest = rest[2:]
    resource = rest[0]
    if len(rest) >= 3:
        resource += "/" + rest[2]
    return group, resource, verb


def kubelet_permission(path: str) -> Permission:
    return "", "nodes/proxy", "get"


def granted(cluster_role: dict) -> set[Permission]:
    out = set()
    for rule in cluster_role.get("rules") or []:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    out.add((group, resource, verb))
    return out


def missing(needed: Iterable[Permission], cluster_role: dict) -> list[Permission]:
    have = granted(cluster_role)
    return sorted({p for p in needed if p not in have})

"""A fake states informer for unit tests and benchmarks of koordlet modules that read pods.

It has the states informer's query side (``get_all_pods``, ``get_node``, ``get_node_slo``,
``has_synced``, ``register_callback``) over lists the test sets directly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeContainer:
    name: str
    id: str
    cgroup_dir: str
    running: bool = True
    requests: dict[str, int] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)


@dataclass
class FakePod:
    namespace: str
    name: str
    uid: str
    cgroup_dir: str
    kube_qos: str = "burstable"
    koord_qos: str = ""
    priority: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    sandbox_id: str = ""
    running: bool = True
    containers: list[FakeContainer] = field(default_factory=list)


class FakeStatesInformer:
    def __init__(self, pods: list[Any] | None = None, node_slo: Any = None, node: dict | None = None,
                 synced: bool = True) -> None:
        self.pods = list(pods or [])
        self.node_slo = node_slo
        self.node = node
        self.synced = synced
        self.callbacks: dict[str, list[Callable[[], None]]] = {}

    def get_all_pods(self) -> list[Any]:
        return copy.deepcopy(self.pods)

    def get_node_slo(self) -> Any:
        return self.node_slo

    def get_node(self) -> dict | None:
        return self.node

    def has_synced(self) -> bool:
        return self.synced

    def register_callback(self, kind: str, fn: Callable[[], None]) -> None:
        self.callbacks.setdefault(kind, []).append(fn)

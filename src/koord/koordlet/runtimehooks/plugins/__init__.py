"""The runtime-hooks plugin registry: the built-in plugins in order, and what is derived
from them (their feature gates, the rules parsed at each NodeSLO or Node update).

A plugin owns its rules (``RuntimePlugin.rules_read``), its koordlet-only cgroup files
(``cgroup_files``) and its gate's name (``name``): adding one is its own module plus one
entry in ``REGISTRY``.

Order matters: a later plugin refines an earlier one's answer (CPUNormalization scales
the quota BatchResource or kubelet set, after CPUSetAllocator has decided whether the pod
is bound to cpus and so exempt).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ...features import ALL_GATE_DEFAULTS, MODULE_FEATURE_GATES, UPSTREAM_GATES
from ..hooks import PluginEnv, RuntimePlugin
from ..hostapps import HOST_APPS
from ..rule import Rule, Rules, parse
from .batchresource import BatchResource
from .coresched import CoreSched
from .cpunormalization import CPUNormalization
from .cpuset import CPUSetAllocator
from .gpu import GPUEnvInject
from .groupidentity import GroupIdentity
from .oomscoreadj import OOMScoreAdj
from .resctrl import Resctrl

FRAMEWORK_RULES: tuple[Rule[Any], ...] = (HOST_APPS,)
"""Rules the framework reads itself (the reconciler's host applications), whatever plugins run."""


class PluginRegistry:
    """Plugin classes in order; refuses one whose name, gate, rules or files would clash."""

    def __init__(self, plugins: Iterable[type[RuntimePlugin]] = ()) -> None:
        self._plugins: list[type[RuntimePlugin]] = []
        for cls in plugins:
            self.register(cls)

    @property
    def plugins(self) -> tuple[type[RuntimePlugin], ...]:
        return tuple(self._plugins)

    def copy(self) -> PluginRegistry:
        """A registry to extend without changing this one (a test's own plugin)."""
        return PluginRegistry(self._plugins)

    def register(self, cls: type[RuntimePlugin]) -> None:
        """Appends ``cls``: it runs after every plugin registered before it."""
        if cls.name in {p.name for p in self._plugins}:
            raise ValueError(f"plugin {cls.name}: registered twice")
        upstream = cls.name in UPSTREAM_GATES
        if upstream == (cls.gate_default is not None):
            raise ValueError(f"plugin {cls.name}: set gate_default exactly when upstream has no "
                             "gate of this name (features.UPSTREAM_GATES holds upstream's defaults)")
        for rule in cls.rules_read:
            same = next((r for r in self.rules() if r.name == rule.name), rule)
            if same is not rule:
                raise ValueError(f"plugin {cls.name}: rule {rule.name!r} is another plugin's rule's name")
        for file in cls.cgroup_files:
            if any(f.name == file.name and f != file for p in self._plugins for f in p.cgroup_files):
                raise ValueError(f"plugin {cls.name}: cgroup file {file.name!r} declared differently before")
        self._plugins.append(cls)

    def gates(self) -> dict[str, bool]:
        """Each plugin's gate, named after it, with its default."""
        return {cls.name: ALL_GATE_DEFAULTS.get(cls.name, bool(cls.gate_default)) for cls in self._plugins}

    def rules(self) -> tuple[Rule[Any], ...]:
        """Every rule to parse: the framework's, then each plugin's in order, once each."""
        found: dict[int, Rule[Any]] = {}
        for rule in (*FRAMEWORK_RULES, *(r for cls in self._plugins for r in cls.rules_read)):
            found.setdefault(id(rule), rule)
        return tuple(found.values())

    def build(self, env: PluginEnv, gates: Mapping[str, bool]) -> list[RuntimePlugin]:
        """The enabled plugins in order; gates missing from ``gates`` take their default."""
        defaults = self.gates()
        unknown = set(gates) - set(UPSTREAM_GATES) - set(defaults)
        if unknown:
            raise ValueError(f"unknown feature gate(s) {', '.join(sorted(unknown))}")
        return [cls(env) for cls in self._plugins if gates.get(cls.name, defaults[cls.name])]

    def parse_rules(self, node_slo: dict | None, node: dict | None, topology: dict | None = None) -> Rules:
        """Every registered plugin's rules, enabled or not, so one bad NodeSLO is refused the
        same whatever the gates (see ``rule.parse``)."""
        return parse(self.rules(), node_slo, node, topology)


REGISTRY = PluginRegistry([
    GroupIdentity, BatchResource, CPUSetAllocator, CPUNormalization, GPUEnvInject, Resctrl, OOMScoreAdj,
    CoreSched,
])


def build_plugins(env: PluginEnv, gates: Mapping[str, bool]) -> list[RuntimePlugin]:
    """``REGISTRY.build``: the enabled built-in plugins in order."""
    return REGISTRY.build(env, gates)


def parse_rules(node_slo: dict | None, node: dict | None, topology: dict | None = None) -> Rules:
    """``REGISTRY.parse_rules``: NodeSLO (the object or its spec), the Node and the topology -> Rules."""
    return REGISTRY.parse_rules(node_slo, node, topology)


def implemented_gates() -> dict[str, bool]:
    """Every gate this koordlet implements, with its default: the modules' and the plugins'."""
    return {**REGISTRY.gates(), **MODULE_FEATURE_GATES}

"""The hooks framework: plugins register one function per stage; the server and the
reconciler run them.

Order is the order of the plugin registry (``plugins.REGISTRY``), then the order each
plugin registers its functions: stable, so a later plugin may refine an earlier one.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from koord.hookapi import FailurePolicy, HookPoint

from ..features import ALL_GATE_DEFAULTS
from ..resources import CgroupFile, KubeQoS, Resources
from .protocol import ContainerContext, HookContext, HookPodMeta, PodContext

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..resourceexecutor.executor import CgroupExecutor
    from ..slo import HostApp
    from ..statesinformer import meta as statesinformer
    from .rule import Rule, Rules

log = logging.getLogger(__name__)


PodHook = Callable[[PodContext], None]
ContainerHook = Callable[[ContainerContext], None]
PluginObserver = Callable[[str, HookPoint, bool, float], None]
"""Told of every plugin function run: (plugin, stage, succeeded, seconds); e.g. for metrics."""


class HookError(Exception):
    """A plugin could not do its job for this pod or container; the message says why."""


class InvalidInput(HookError):
    """The request holds a value a plugin cannot use (an annotation, a quantity): the
    caller's error, answered INVALID_ARGUMENT when it fails the hook."""


@dataclass(frozen=True)
class PluginEnv:
    """What a plugin may touch on the node."""

    executor: CgroupExecutor
    sys_fs_root: Path
    proc_root: Path
    current_pods: Callable[[], list[statesinformer.PodMeta]] | None = None
    """The states informer's pods (e.g. to find processes that existed before koordlet)."""
    registry: CollectorRegistry | None = None
    """koordlet's Prometheus registry for a plugin's metrics; None: a private one."""
    node: str = ""
    """This node's name, the ``node`` label of every metric."""
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    """The gates given on the command line; a gate not named takes upstream's default."""
    disable_unset_cpu_quota: bool = False
    """``--disable-unset-cpu-quota``: cpuset-bound pods keep their cfs quota."""

    def gate(self, name: str) -> bool:
        """Whether feature gate ``name`` (one upstream knows) is on."""
        return self.feature_gates.get(name, ALL_GATE_DEFAULTS[name])


@dataclass(frozen=True)
class RunningPod:
    """A pod the reconciler found running (a ready sandbox) in one round."""

    meta: HookPodMeta
    annotations: dict[str, str]
    """The pods source's current ones when it knows the pod, else the sandbox's."""
    cgroup_parent: str
    sandbox_id: str
    container_ids: tuple[str, ...]
    """Its created and running containers."""


class RuntimePlugin(ABC):
    """A runtime-hooks plugin: registers functions per stage and keeps its current rules."""

    name: ClassVar[str]
    """Also the feature gate's name (e.g. ``GroupIdentity``)."""
    gate_default: ClassVar[bool | None] = None
    """The gate's default for a hook upstream has no gate for; None: upstream's
    (``features.UPSTREAM_GATES``), so each default is written once."""
    rules_read: ClassVar[tuple[Rule[Any], ...]] = ()
    """The rules its hooks read (``self.rules[RULE]``), defined in the plugin's own module:
    the registry parses every registered plugin's rules at each NodeSLO or Node update."""
    cgroup_files: ClassVar[tuple[CgroupFile, ...]] = ()
    """The koordlet-only cgroup files it answers in ``Resources.files``, beyond the runtime's."""
    answers_from_request_and_rules: ClassVar[bool] = False
    """True when the plugin's hooks only set the response, from the request and ``self.rules``
    (they touch no process, file or state of their own): the reconciler may then reuse a pod's
    or container's last answer while neither changed (see ``reconciler.REFRESH_ROUNDS``)."""

    def __init__(self, env: PluginEnv) -> None:
        self.env = env
        self.rules: Rules | None = None

    @abstractmethod
    def register(self, hooks: Hooks) -> None:
        """Calls ``hooks.register_pod`` / ``hooks.register_container`` for each stage it serves."""

    def update_rules(self, rules: Rules) -> bool:
        """Takes new rules; True when existing pods must be refreshed."""
        changed = rules != self.rules
        self.rules = rules
        return changed

    def reconcile_sandbox(self, ctx: ContainerContext) -> None:
        """Sets, in ``ctx.response``, what the reconciler writes to a pod's sandbox (pause)
        container cgroup; ``ctx.request`` holds the pod's fields, the sandbox's id and no
        container name. Most plugins leave the sandbox container alone."""
        return None

    def host_app_resources(self, app: HostApp) -> Resources | None:
        """Values for a NodeSLO host application's cgroup, for the reconciler; None: none."""
        return None

    def kube_qos_resources(self, qos: KubeQoS) -> Resources | None:
        """Values for the kube-QoS cgroup dir (``kubepods/besteffort`` ...), for the reconciler."""
        return None

    def reconcile_pods(self, pods: list[RunningPod], complete: bool) -> list[str]:
        """After each reconciler round that could list the runtime's pods: every running pod,
        for what a plugin keeps beside the pods' cgroups (its own directories, host
        applications' cgroups).
        ``complete``: every listed sandbox is in ``pods`` (state of a pod missing from an
        incomplete list may still be in use). Returns the problems, each naming its pod."""
        return []


_C = TypeVar("_C", PodContext, ContainerContext)


@dataclass(frozen=True)
class _Registration(Generic[_C]):
    stage: HookPoint
    plugin: str
    description: str
    fn: Callable[[_C], None]


class Hooks:
    """Registry of hook functions and their runner.

    Pod hook points take functions of a PodContext, container hook points functions of a
    ContainerContext; registering one at the other kind of hook point is refused at once,
    so a plugin never has to check what it was given.
    """

    def __init__(self, failure_policy: FailurePolicy = FailurePolicy.IGNORE,
                 observe: PluginObserver | None = None) -> None:
        self.failure_policy = failure_policy
        self.observe = observe
        self._pod: dict[HookPoint, list[_Registration[PodContext]]] = {s: [] for s in HookPoint if s.is_pod}
        self._container: dict[HookPoint, list[_Registration[ContainerContext]]] = {
            s: [] for s in HookPoint if not s.is_pod}

    def register_pod(self, stage: HookPoint, plugin: str, description: str, fn: PodHook) -> None:
        if not stage.is_pod:
            raise ValueError(f"plugin {plugin}: {stage} is a container hook point; register a "
                             "function of a ContainerContext with register_container")
        self._pod[stage].append(_Registration(stage, plugin, description, fn))

    def register_container(self, stage: HookPoint, plugin: str, description: str, fn: ContainerHook) -> None:
        if stage.is_pod:
            raise ValueError(f"plugin {plugin}: {stage} is a pod hook point; register a "
                             "function of a PodContext with register_pod")
        self._container[stage].append(_Registration(stage, plugin, description, fn))

    def stages(self) -> set[HookPoint]:
        return {s for s, regs in [*self._pod.items(), *self._container.items()] if regs}

    def registrations(self, stage: HookPoint) -> list[tuple[str, str]]:
        regs = self._pod[stage] if stage.is_pod else self._container[stage]
        return [(r.plugin, r.description) for r in regs]

    def run(self, stage: HookPoint, ctx: HookContext) -> list[tuple[str, Exception]]:
        """Runs every function of ``stage`` on ``ctx``; returns the (plugin, error) pairs.

        With FailurePolicy.FAIL the first error stops the rest and is raised as HookError.
        """
        if isinstance(ctx, PodContext) and stage.is_pod:
            return self._run(self._pod[stage], stage, ctx)
        if isinstance(ctx, ContainerContext) and not stage.is_pod:
            return self._run(self._container[stage], stage, ctx)
        raise TypeError(f"{stage} runs on a {'Pod' if stage.is_pod else 'Container'}Context, "
                        f"got {type(ctx).__name__}")

    def _run(self, regs: list[_Registration[_C]], stage: HookPoint, ctx: _C) -> list[tuple[str, Exception]]:
        errors: list[tuple[str, Exception]] = []
        for reg in regs:
            before = ctx.response.copy()
            started = time.perf_counter()
            try:
                reg.fn(ctx)
                problems = ctx.response.resources.problems("resources")
                if problems:
                    raise HookError("answer out of range: " + "; ".join(problems))
                self._observe(reg.plugin, stage, True, started)
            except Exception as exc:  # a plugin's bug must not take the server down
                self._observe(reg.plugin, stage, False, started)
                # None of a failed plugin's changes stay: a half-done answer is never sent.
                ctx.response = before
                who = describe(ctx)
                log.warning("plugin %s failed at %s for %s: %s", reg.plugin, stage, who, exc)
                if self.failure_policy is FailurePolicy.FAIL:
                    raise HookError(f"plugin {reg.plugin} failed at {stage} for {who}: {exc}") from exc
                errors.append((reg.plugin, exc))
        return errors

    def _observe(self, plugin: str, stage: HookPoint, ok: bool, started: float) -> None:
        if self.observe is None:
            return
        try:
            self.observe(plugin, stage, ok, time.perf_counter() - started)
        except Exception:  # metrics must never change an answer
            log.exception("hook observer failed for plugin %s at %s", plugin, stage)


def describe(ctx: HookContext) -> str:
    """``pod ns/name`` or ``pod ns/name container c``: the subject of every hook log line."""
    if isinstance(ctx, PodContext):
        return f"pod {ctx.request.meta}"
    return f"pod {ctx.request.pod_meta} container {ctx.request.container_name}"

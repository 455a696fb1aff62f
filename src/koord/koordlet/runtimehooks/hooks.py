"""The hooks framework: plugins register one function per stage; the server and the
reconciler run them.

Order is the order plugins are registered in (``plugins.PLUGIN_ORDER``), then the order
each plugin registers its functions: stable, so a later plugin may refine an earlier one.
"""

from __future__ import annotations

import copy
import enum
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .protocol import ContainerContext, HookContext, KubeQoS, PodContext, Resources

if TYPE_CHECKING:
    from .executor import CgroupExecutor
    from .rule import Rules

log = logging.getLogger(__name__)


class Stage(enum.StrEnum):
    """The seven hook points of seed 001; values are the registration-file names."""

    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    POST_STOP_CONTAINER = "PostStopContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"

    @property
    def is_pod_stage(self) -> bool:
        return self in (Stage.PRE_RUN_POD_SANDBOX, Stage.POST_STOP_POD_SANDBOX)

    @property
    def rpc(self) -> str:
        """The RuntimeHookService method name, e.g. ``PreRunPodSandboxHook``."""
        return f"{self.value}Hook"


HookFn = Callable[[HookContext], None]


class HookError(Exception):
    """A plugin could not do its job for this pod or container; the message says why."""


class InvalidInput(HookError):
    """The request holds a value a plugin cannot use (an annotation, a quantity): the
    caller's error, answered INVALID_ARGUMENT when it fails the hook."""


_JSON_KINDS = {dict: "object", list: "list"}


def json_annotation(annotations: Mapping[str, str], key: str, want: type = dict,
                    error: type[Exception] = InvalidInput, owner: str = "pod") -> Any:
    """The JSON value of an annotation, or None when it is absent or empty.

    Every plugin reads Koordinator's JSON annotations; a malformed one must fail with the
    same message naming the annotation, so users see which object to fix.
    """
    text = annotations.get(key)
    if not text:
        return None
    if not isinstance(text, str):
        raise error(f"{owner} annotation {key}: want a JSON string value, got {text!r}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{owner} annotation {key}: bad JSON: {exc.msg}") from None
    if not isinstance(value, want):
        raise error(f"{owner} annotation {key}: want a JSON {_JSON_KINDS.get(want, want.__name__)}, got {text!r}")
    return value


class FailurePolicy(enum.StrEnum):
    FAIL = "Fail"
    IGNORE = "Ignore"


@dataclass(frozen=True)
class PluginEnv:
    """What a plugin may touch on the node."""

    executor: CgroupExecutor
    sys_fs_root: Path
    proc_root: Path


class RuntimePlugin(ABC):
    """A runtime-hooks plugin: registers functions per stage and keeps its current rules."""

    name: ClassVar[str]
    """Also the feature gate's name (e.g. ``GroupIdentity``)."""

    def __init__(self, env: PluginEnv) -> None:
        self.env = env
        self.rules: Rules | None = None

    @abstractmethod
    def register(self, hooks: Hooks) -> None:
        """Calls ``hooks.register(stage, self.name, description, fn)`` for each stage it serves."""

    def update_rules(self, rules: Rules) -> bool:
        """Takes new rules; True when existing pods must be refreshed."""
        changed = rules != self.rules
        self.rules = rules
        return changed

    def kube_qos_resources(self, qos: KubeQoS) -> Resources | None:
        """Values for the kube-QoS cgroup dir (``kubepods/besteffort`` ...), for the reconciler."""
        return None


@dataclass(frozen=True)
class _Registration:
    stage: Stage
    plugin: str
    description: str
    fn: HookFn


class Hooks:
    """Registry of hook functions and their runner."""

    def __init__(self, failure_policy: FailurePolicy = FailurePolicy.IGNORE) -> None:
        self.failure_policy = failure_policy
        self._by_stage: dict[Stage, list[_Registration]] = {s: [] for s in Stage}

    def register(self, stage: Stage, plugin: str, description: str, fn: HookFn) -> None:
        self._by_stage[stage].append(_Registration(stage, plugin, description, fn))

    def stages(self) -> set[Stage]:
        return {s for s, regs in self._by_stage.items() if regs}

    def registrations(self, stage: Stage) -> list[tuple[str, str]]:
        return [(r.plugin, r.description) for r in self._by_stage[stage]]

    def run(self, stage: Stage, ctx: HookContext) -> list[tuple[str, Exception]]:
        """Runs every function of ``stage`` on ``ctx``; returns the (plugin, error) pairs.

        With FailurePolicy.FAIL the first error stops the rest and is raised as HookError.
        """
        errors: list[tuple[str, Exception]] = []
        for reg in self._by_stage[stage]:
            before = copy.deepcopy(ctx.response)
            try:
                reg.fn(ctx)
                problems = ctx.response.resources.problems("resources")
                if problems:
                    raise HookError("answer out of range: " + "; ".join(problems))
            except Exception as exc:  # a plugin's bug must not take the server down
                # None of a failed plugin's changes stay: a half-done answer is never sent.
                ctx.response = before  # type: ignore[assignment]
                who = describe(ctx)
                log.warning("plugin %s failed at %s for %s: %s", reg.plugin, stage, who, exc)
                if self.failure_policy is FailurePolicy.FAIL:
                    raise HookError(f"plugin {reg.plugin} failed at {stage} for {who}: {exc}") from exc
                errors.append((reg.plugin, exc))
        return errors


def describe(ctx: HookContext) -> str:
    """``pod ns/name`` or ``pod ns/name container c``: the subject of every hook log line."""
    if isinstance(ctx, PodContext):
        return f"pod {ctx.request.meta}"
    assert isinstance(ctx, ContainerContext)
    return f"pod {ctx.request.pod_meta} container {ctx.request.container_name}"

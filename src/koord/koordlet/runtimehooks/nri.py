"""koordlet's NRI mode: its runtime hooks run inside containerd's own pod and container
lifecycle, with no proxy in kubelet's path (upstream's default on containerd >= 1.7).

koordlet registers as an external NRI plugin on the runtime's socket and subscribes to
upstream's events: RunPodSandbox, RemovePodSandbox, CreateContainer and UpdateContainer.
Each runs the same hook plugins as the proxy's calls (``Hooks``), on requests made by
``nriconvert``. A new container's answer goes back as an NRI adjustment (containerd applies
it before the container starts); an update's as a container update; what NRI cannot carry
(pod-level cgroups, group identity's bvt) koordlet writes itself where the cgroup exists,
and the reconciler writes the rest on its rounds. On connect (Synchronize) every running
container is brought in line with an update, as the reconciler would.

No socket at start is no error: koordlet logs it, proxy mode and the reconciler go on, and
the stub keeps trying with upstream's backoff until containerd comes.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from koord.hookapi import FailurePolicy, HookPoint
from koord.nri import api_pb2 as api
from koord.nri import events
from koord.nri.stub import Handlers, NriStub

from ..flagtypes import flag_bool, positive_duration
from ..resourceexecutor.executor import CgroupExecutor
from .hooks import HookError, Hooks, describe
from .nriconvert import NriInputError, adjustment, container_request, pod_request, update
from .protocol import ContainerContext, HookContext, PodContext
from .server import write_node_side

log = logging.getLogger(__name__)

SUBSCRIBED = events.mask(api.RUN_POD_SANDBOX, api.REMOVE_POD_SANDBOX, api.CREATE_CONTAINER, api.UPDATE_CONTAINER)
"""Upstream koordlet's events."""

C = TypeVar("C", PodContext, ContainerContext)

BACKOFF_CAP = ((1 << 62) - 1) / 1e9
"""Upstream's default cap, 2**62 - 1 ns: in effect, no cap."""

HANDLER_TIMEOUT = 1.5
"""Within containerd's 2 s NRI request timeout: a slow plugin must never stall pod creation beyond it."""


@dataclass(frozen=True)
class NriOptions:
    enabled: bool
    socket_path: str
    plugin_name: str
    plugin_index: str
    connect_timeout: float
    backoff: float
    backoff_cap: float
    backoff_steps: int
    backoff_factor: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NriOptions:
        """The socket is ``-runtime-hooks-nri-socket-path`` under ``-var-run-root-dir``, as upstream joins them."""
        return cls(
            enabled=args.enable_nri_runtime_hook,
            socket_path=os.path.normpath(os.path.join(args.var_run_root_dir,
                                                      args.runtime_hooks_nri_socket_path.lstrip("/"))),
            plugin_name=args.runtime_hooks_nri_plugin_name,
            plugin_index=args.runtime_hooks_nri_plugin_index,
            connect_timeout=args.runtime_hooks_nri_connect_timeout,
            backoff=args.runtime_hooks_nri_backoff_duration,
            backoff_cap=args.runtime_hooks_nri_backoff_cap,
            backoff_steps=args.runtime_hooks_nri_backoff_steps,
            backoff_factor=args.runtime_hooks_nri_backoff_factor,
        )


def _backoff_factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want a positive number")
    return value


def _plugin_index(text: str) -> str:
    if len(text) != 2 or not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: want two digits, e.g. 00")
    return text


def _plugin_name(text: str) -> str:
    if not text or "/" in text or len(text) > 64:
        raise argparse.ArgumentTypeError(f"{text!r}: want a non-empty name of at most 64 characters without '/'")
    return text


def add_flags(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--enable-nri-runtime-hook", type=flag_bool, nargs="?", const=True, default=True, metavar="BOOL",
      help="run the runtime hooks as an NRI plugin of the runtime (containerd >= 1.7 with NRI on) "
      "(default: true)")
    a("--var-run-root-dir", default="/var/run/", metavar="DIR",
      help="the host's /var/run as koordlet sees it (default: %(default)s; /host-var-run/ with "
      "agent_mode=dsMode, as in upstream's DaemonSet)")
    a("--runtime-hooks-nri-socket-path", default="nri/nri.sock", metavar="PATH",
      help="NRI socket, under -var-run-root-dir (default: %(default)s)")
    a("--runtime-hooks-nri-plugin-name", type=_plugin_name, default="koordlet_nri", metavar="NAME",
      help="NRI plugin name (default: %(default)s)")
    a("--runtime-hooks-nri-plugin-index", type=_plugin_index, default="00", metavar="NN",
      help="NRI plugin index: plugins run in ascending index (default: %(default)s)")
    a("--runtime-hooks-nri-connect-timeout", type=positive_duration, default=6.0, metavar="DURATION",
      help="time to register with the runtime (default: 6s)")
    a("--runtime-hooks-nri-backoff-duration", type=positive_duration, default=1.0, metavar="DURATION",
      help="first wait before reconnecting (default: 1s)")
    a("--runtime-hooks-nri-backoff-cap", type=positive_duration, default=BACKOFF_CAP, metavar="DURATION",
      help="longest wait before reconnecting (default: 1281023h53m38.427387903s)")
    a("--runtime-hooks-nri-backoff-steps", type=int, default=2147483647, metavar="N",
      help="how many times the wait grows (default: 2147483647)")
    a("--runtime-hooks-nri-backoff-factor", type=_backoff_factor, default=2.0, metavar="FACTOR",
      help="how much the wait grows each time (default: 2)")


class NriServer:
    """koordlet's hooks served to the runtime over NRI; start() and stop() own its thread."""

    def __init__(self, hooks: Hooks, executor: CgroupExecutor, options: NriOptions,
                 disabled_stages: Iterable[HookPoint] = (),
                 on_connect: Callable[[], None] | None = None) -> None:
        self.hooks = hooks
        self.executor = executor
        self.options = options
        self.disabled_stages = frozenset(disabled_stages)
        self.on_connect = on_connect
        """Called after each Synchronize (e.g. a reconcile round for what NRI cannot carry)."""
        self.stub = NriStub(options.plugin_name, options.plugin_index, Handlers(
            configure=self._configure, synchronize=self._synchronize,
            run_pod_sandbox=self._run_pod_sandbox, remove_pod_sandbox=self._remove_pod_sandbox,
            create_container=self._create_container, update_container=self._update_container),
            socket_path=options.socket_path, handler_timeout=HANDLER_TIMEOUT,
            registration_timeout=options.connect_timeout, on_disconnect=self._disconnected)

    @property
    def connected(self) -> bool:
        return self.stub.ready.is_set()

    def start(self) -> None:
        if not os.path.exists(self.options.socket_path):
            log.info("NRI socket %s not found (containerd >= 1.7 with NRI on serves it): proxy mode and "
                     "the reconciler go on; connecting when it appears", self.options.socket_path)
        self.stub.start(backoff=self.options.backoff, backoff_max=self.options.backoff_cap,
                        factor=self.options.backoff_factor, steps=self.options.backoff_steps)

    def stop(self) -> None:
        self.stub.stop()

    # ---- the runtime's calls ------------------------------------------------------------

    def _configure(self, request: api.ConfigureRequest) -> int:
        log.info("NRI: configured by %s %s", request.runtime_name or "the runtime", request.runtime_version)
        return SUBSCRIBED

    def _disconnected(self, reason: str) -> None:
        log.warning("NRI: connection to %s ended: %s", self.options.socket_path, reason)

    def _synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> list[api.ContainerUpdate]:
        """Every running container as the plugins answer it now, as the reconciler would."""
        by_id = {pod.id: pod for pod in pods}
        updates = []
        for container in containers:
            pod = by_id.get(container.pod_sandbox_id)
            if pod is None or container.state != api.CONTAINER_RUNNING:
                continue
            ctx = self._container_context(pod, container, None)
            if ctx is None or not self._run(HookPoint.PRE_CREATE_CONTAINER, ctx, fail=False):
                continue
            found = update(container.id, ctx.response)
            if found is not None:
                found.ignore_failure = True  # one container gone since the list must not fail the rest
                updates.append(found)
        log.info("NRI: synchronized %d pods, %d containers; %d updates", len(pods), len(containers), len(updates))
        if self.on_connect is not None:
            self.on_connect()
        return updates

    def _run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        ctx = self._pod_context(pod)
        if ctx is not None and self._run(HookPoint.PRE_RUN_POD_SANDBOX, ctx):
            # NRI cannot adjust a pod: its values go to the pod's cgroup, which exists by now.
            write_node_side(self.executor, f"NRI {HookPoint.PRE_RUN_POD_SANDBOX}", ctx, through_proxy=False)

    def _remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        ctx = self._pod_context(pod)
        if ctx is not None:
            self._run(HookPoint.POST_STOP_POD_SANDBOX, ctx)

    def _create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        ctx = self._container_context(pod, container, None)
        if ctx is None or not self._run(HookPoint.PRE_CREATE_CONTAINER, ctx):
            return None
        adj = adjustment(ctx.response)
        log.debug("NRI CreateContainer for %s: %s", describe(ctx), str(adj).replace("\n", " ") or "no changes")
        return adj

    def _update_container(self, pod: api.PodSandbox, container: api.Container,
                          resources: api.LinuxResources) -> list[api.ContainerUpdate]:
        ctx = self._container_context(pod, container, resources)
        if ctx is None or not self._run(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, ctx):
            return []
        found = update(container.id, ctx.response)
        return [found] if found is not None else []

    # ---- shared steps --------------------------------------------------------------------

    def _pod_context(self, pod: api.PodSandbox) -> PodContext | None:
        return self._checked(f"pod {pod.namespace}/{pod.name}", lambda: PodContext(pod_request(pod)))

    def _container_context(self, pod: api.PodSandbox, container: api.Container,
                           resources: api.LinuxResources | None) -> ContainerContext | None:
        return self._checked(f"pod {pod.namespace}/{pod.name} container {container.name}",
                             lambda: ContainerContext(container_request(pod, container, resources)))

    def _checked(self, who: str, make: Callable[[], C]) -> C | None:
        """The context, or None when the runtime's message cannot be acted on (a field that would
        leave the cgroup root, a malformed env): nothing of it reaches a plugin or a file. Under
        the Fail plugin policy the runtime's call fails with the reason; else it goes on unchanged."""
        try:
            ctx = make()
            problems = ctx.request.problems()
            if problems:
                raise NriInputError("; ".join(problems))
        except NriInputError as exc:
            log.warning("NRI: %s: bad request, no hooks run: %s", who, exc)
            if self.hooks.failure_policy is FailurePolicy.FAIL:
                raise NriInputError(f"{who}: {exc}") from None
            return None
        return ctx

    def _run(self, stage: HookPoint, ctx: HookContext, fail: bool = True) -> bool:
        """Runs ``stage``'s plugins; False when the stage is disabled. Under the Fail policy a
        failing plugin fails the runtime's call (``fail``) with the plugin's error."""
        if stage in self.disabled_stages:
            return False
        try:
            self.hooks.run(stage, ctx)
        except HookError:
            if fail:
                raise
            return False
        return True

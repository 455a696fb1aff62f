"""Standalone mode: writes the plugins' cgroup values for pods already running.

Without the proxy nobody calls the hooks, and with it a rule change still has to reach
pods created earlier. Every interval, and on demand after a rule change, the reconciler
lists ready pods and running containers from the CRI endpoint and replays the hooks:

=====================  =======================  ===========================================
level                  stage replayed           written to
=====================  =======================  ===========================================
kube-QoS               (none)                   ``kube_qos_dir(qos)``: merged
                                                ``plugin.kube_qos_resources(qos)``
pod sandbox (READY)    PreRunPodSandbox         ``pod_dir(cgroup_parent)``
container (RUNNING)    PreCreateContainer       ``container_dir(cgroup_parent, id)``
pod gone since last    PostStopPodSandbox       nothing (plugins clean up, e.g. resctrl)
=====================  =======================  ===========================================

The contexts are built from verbose CRI status exactly as the proxy would build the
hook request, so a plugin computes the same values in both modes. Changes a cgroup
cannot carry (envs, annotations) are ignored here.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc

from koord.hookapi import HookPoint

from .executor import CgroupError, CgroupExecutor
from .hooks import Hooks, RuntimePlugin, describe
from .protocol import (
    ContainerContext,
    ContainerRequest,
    HookContext,
    KubeQoS,
    PodContext,
    PodMeta,
    PodRequest,
    Resources,
)
from .server import cgroup_dir_exists

log = logging.getLogger(__name__)

CRI_TIMEOUT = 10.0


@dataclass
class ReconcileReport:
    """What one round did; ``written`` holds ``<cgroup dir>:<resource>`` per changed file."""

    pods: int = 0
    containers: int = 0
    stopped_pods: int = 0
    written: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(self, hooks: Hooks, executor: CgroupExecutor, plugins: Iterable[RuntimePlugin],
                 cri_endpoint: str, interval: float) -> None:
        self.hooks = hooks
        self.executor = executor
        self.plugins = list(plugins)
        self.cri_endpoint = cri_endpoint.removeprefix("unix://")
        self.interval = interval
        self._channel = grpc.insecure_channel("unix:" + self.cri_endpoint)
        self._cri = cri_grpc.RuntimeServiceStub(self._channel)
        self._known_pods: dict[str, PodRequest] = {}
        self._round_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._cri_error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()
        log.info("reconciler started: every %.3gs from CRI %s", self.interval, self.cri_endpoint)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._channel.close()

    def reconcile_now(self) -> None:
        """Asks the loop for a round as soon as possible (after a rule change)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.reconcile_once()
            self._wake.wait(self.interval)
            self._wake.clear()

    def reconcile_once(self) -> ReconcileReport:
        with self._round_lock:
            report = ReconcileReport()
            self._reconcile_kube_qos(report)
            try:
                sandboxes = self._cri.ListPodSandbox(cri.ListPodSandboxRequest(filter=cri.PodSandboxFilter(
                    state=cri.PodSandboxStateValue(state=cri.SANDBOX_READY))), timeout=CRI_TIMEOUT).items
                containers = self._cri.ListContainers(cri.ListContainersRequest(filter=cri.ContainerFilter(
                    state=cri.ContainerStateValue(state=cri.CONTAINER_RUNNING))),
                    timeout=CRI_TIMEOUT).containers
            except grpc.RpcError as exc:
                self._cri_unavailable(report, exc)
                return report
            if self._cri_error is not None:
                log.info("reconciler: CRI %s reachable again", self.cri_endpoint)
                self._cri_error = None
            pods = self._reconcile_pods(sandboxes, report)
            self._reconcile_containers(containers, pods, report)
            self._forget_stopped_pods(pods, report)
            log.debug("reconciler round: %d pods, %d containers, %d writes, %d errors",
                      report.pods, report.containers, len(report.written), len(report.errors))
            return report

    def _cri_unavailable(self, report: ReconcileReport, exc: grpc.RpcError) -> None:
        message = f"CRI {self.cri_endpoint}: {exc.code().name}: {exc.details()}"
        report.errors.append(message)
        if message != self._cri_error:
            log.warning("reconciler: cannot list pods: %s; retrying every %.3gs",
                        message, self.interval)
            self._cri_error = message

    def _reconcile_kube_qos(self, report: ReconcileReport) -> None:
        for qos in KubeQoS:
            merged = Resources()
            for plugin in self.plugins:
                values = plugin.kube_qos_resources(qos)
                if values is not None:
                    merged.update(values)
            if merged.is_empty():
                continue
            cgroup_dir = self.executor.kube_qos_dir(qos)
            if cgroup_dir_exists(self.executor, cgroup_dir, merged):
                self._apply(cgroup_dir, merged, f"kube-QoS {qos}", report)
            else:
                log.debug("reconciler: kube-QoS %s: no cgroup %s", qos, cgroup_dir)

    def _reconcile_pods(self, sandboxes, report: ReconcileReport) -> dict[str, PodRequest]:
        pods: dict[str, PodRequest] = {}
        for sandbox in sandboxes:
            who = f"pod {sandbox.metadata.namespace}/{sandbox.metadata.name}"
            try:
                status = self._cri.PodSandboxStatus(cri.PodSandboxStatusRequest(
                    pod_sandbox_id=sandbox.id, verbose=True), timeout=CRI_TIMEOUT)
                request = pod_request_from_status(status)
                pods[sandbox.id] = request
                ctx = PodContext(request)
                if self._run_hooks(HookPoint.PRE_RUN_POD_SANDBOX, ctx, report):
                    report.pods += 1
                    self._apply(self.executor.pod_dir(request.cgroup_parent),
                                ctx.response.resources, who, report)
            except Exception as exc:  # one broken pod must not stop the round
                self._error(report, who, exc)
        return pods

    def _reconcile_containers(self, containers, pods: dict[str, PodRequest],
                              report: ReconcileReport) -> None:
        for container in containers:
            pod = pods.get(container.pod_sandbox_id)
            if pod is None:
                continue
            who = f"pod {pod.meta} container {container.metadata.name}"
            try:
                status = self._cri.ContainerStatus(cri.ContainerStatusRequest(
                    container_id=container.id, verbose=True), timeout=CRI_TIMEOUT)
                ctx = ContainerContext(container_request_from_status(pod, container, status))
                if self._run_hooks(HookPoint.PRE_CREATE_CONTAINER, ctx, report):
                    report.containers += 1
                    cgroup_dir = self.executor.container_dir(pod.cgroup_parent, container.id)
                    self._apply(cgroup_dir, ctx.response.resources, who, report)
            except Exception as exc:  # one broken container must not stop the round
                self._error(report, who, exc)

    def _forget_stopped_pods(self, pods: dict[str, PodRequest], report: ReconcileReport) -> None:
        for sandbox_id in self._known_pods.keys() - pods.keys():
            ctx = PodContext(self._known_pods[sandbox_id])
            if self._run_hooks(HookPoint.POST_STOP_POD_SANDBOX, ctx, report):
                report.stopped_pods += 1
        self._known_pods = pods

    def _run_hooks(self, stage: HookPoint, ctx: HookContext, report: ReconcileReport) -> bool:
        """False when a plugin failed under the Fail policy (the error is in the report)."""
        try:
            errors = self.hooks.run(stage, ctx)
        except Exception as exc:
            report.errors.append(str(exc))
            return False
        report.errors.extend(f"plugin {plugin} at {stage} for {describe(ctx)}: {exc}"
                             for plugin, exc in errors)
        return True

    def _apply(self, cgroup_dir: str, resources: Resources, who: str,
               report: ReconcileReport) -> None:
        if resources.is_empty():
            return
        try:
            written = self.executor.apply(cgroup_dir, resources)
        except CgroupError as exc:
            self._error(report, who, exc)
            return
        if written:
            log.info("reconciler: %s: wrote %s to cgroup %s", who, ", ".join(written), cgroup_dir)
        report.written.extend(f"{cgroup_dir}:{name}" for name in written)

    @staticmethod
    def _error(report: ReconcileReport, who: str, exc: Exception) -> None:
        log.warning("reconciler: %s: %s", who, exc)
        report.errors.append(f"{who}: {exc}")


def _info(status_response) -> dict[str, Any]:
    """containerd's verbose ``info`` JSON; it holds the original CRI config under ``config``."""
    raw = status_response.info.get("info")
    return json.loads(raw) if raw else {}


def _field(obj: dict[str, Any] | None, snake: str) -> Any:
    """A field of a CRI object in containerd's JSON (Go json tags are snake_case; accept camelCase)."""
    if not obj:
        return None
    if snake in obj:
        return obj[snake]
    head, *rest = snake.split("_")
    return obj.get(head + "".join(p.title() for p in rest))


def resources_from_json(obj: dict[str, Any] | None) -> Resources:
    """LinuxContainerResources as containerd prints it in the verbose config."""
    return Resources(
        cpu_period=int(_field(obj, "cpu_period") or 0) or None,
        cpu_quota=int(_field(obj, "cpu_quota") or 0) or None,
        cpu_shares=int(_field(obj, "cpu_shares") or 0) or None,
        memory_limit=int(_field(obj, "memory_limit_in_bytes") or 0) or None,
        cpuset_cpus=_field(obj, "cpuset_cpus") or None,
        cpuset_mems=_field(obj, "cpuset_mems") or None,
        unified=dict(_field(obj, "unified") or {}),
    )


def pod_request_from_status(response: cri.PodSandboxStatusResponse) -> PodRequest:
    """The PreRunPodSandbox request the proxy sent for this pod, rebuilt from CRI status."""
    status = response.status
    config = _info(response).get("config") or {}
    linux = _field(config, "linux") or {}
    cgroup_parent = _field(linux, "cgroup_parent") or ""
    if not cgroup_parent:
        raise ValueError(f"sandbox {status.id}: no cgroup parent in the verbose status "
                         "(is the runtime containerd with the CRI plugin?)")
    return PodRequest(
        meta=PodMeta(name=status.metadata.name, namespace=status.metadata.namespace,
                     uid=status.metadata.uid, attempt=status.metadata.attempt),
        labels=dict(status.labels),
        annotations=dict(status.annotations),
        cgroup_parent=cgroup_parent,
        resources=resources_from_json(_field(linux, "resources")),
        overhead=resources_from_json(_field(linux, "overhead")),
        runtime_handler=status.runtime_handler,
    )


def container_request_from_status(pod: PodRequest, container: cri.Container,
                                  response: cri.ContainerStatusResponse) -> ContainerRequest:
    """The PreCreateContainer request the proxy sent for this container, rebuilt from CRI status."""
    config = _info(response).get("config") or {}
    envs = {kv.get("key", ""): kv.get("value", "") for kv in _field(config, "envs") or []}
    linux = _field(config, "linux") or {}
    return ContainerRequest(
        pod_meta=pod.meta,
        container_name=container.metadata.name,
        container_id=container.id,
        attempt=container.metadata.attempt,
        pod_labels=dict(pod.labels),
        pod_annotations=dict(pod.annotations),
        container_annotations=dict(container.annotations),
        pod_cgroup_parent=pod.cgroup_parent,
        envs=envs,
        resources=resources_from_json(_field(linux, "resources")),
        pod_resources=pod.resources,
    )

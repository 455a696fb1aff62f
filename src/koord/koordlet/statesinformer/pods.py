"""Pods of this node from the CRI runtime: the source that works on any node without kubelet.

Each sync lists sandboxes and containers (cheap), and asks verbose status only for ids it
has not seen (labels, annotations, cgroup parent and resources never change for an id),
so a node with a hundred pods costs two list calls per sync. The conversion from verbose
status is the project's one (``koord.hookapi.fromcri``), so the proxy, the reconciler and the
informer see the same pod.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc

from koord.hookapi import PodHookRequest, fromcri

from ..cgrouplayout import CgroupLayout, container_cgroup_dir
from ..resources import KoordQoS
from .meta import (
    ContainerMeta,
    PodMeta,
    kube_qos_of_cgroup_parent,
    milli_cpu_of_quota,
    milli_cpu_of_shares,
)

log = logging.getLogger(__name__)

CRI_TIMEOUT = 5.0


class PodsUnavailable(Exception):
    """The source could not list pods this time; the caller keeps the previous list."""


class CriPodsSource:
    """Lists pods from a CRI endpoint as ``PodMeta`` (terminated pods included, not running)."""

    def __init__(self, endpoint: str, layout: CgroupLayout) -> None:
        self.endpoint = endpoint.removeprefix("unix://")
        self.layout = layout
        self._channel = grpc.insecure_channel("unix:" + self.endpoint)
        self._cri = cri_grpc.RuntimeServiceStub(self._channel)
        self._pods: dict[str, tuple[PodHookRequest, PodMeta]] = {}
        self._containers: dict[str, ContainerMeta] = {}

    def describe(self) -> str:
        return f"CRI {self.endpoint}"

    def close(self) -> None:
        self._channel.close()

    def list_pods(self) -> list[PodMeta]:
        try:
            sandboxes = self._cri.ListPodSandbox(cri.ListPodSandboxRequest(),
                                                 timeout=CRI_TIMEOUT).items
            containers = self._cri.ListContainers(cri.ListContainersRequest(),
                                                  timeout=CRI_TIMEOUT).containers
        except grpc.RpcError as exc:
            raise PodsUnavailable(f"CRI {self.endpoint}: {exc.code().name}: {exc.details()}") from None
        seen_pods: dict[str, tuple[PodHookRequest, PodMeta]] = {}
        sandbox_ready: dict[str, bool] = {}
        pod_containers: dict[str, list[ContainerMeta]] = {}
        for sandbox in sandboxes:
            entry = self._pods.get(sandbox.id) or self._describe_pod(sandbox)
            if entry is None:
                continue
            seen_pods[sandbox.id] = entry
            sandbox_ready[sandbox.id] = sandbox.state == cri.SANDBOX_READY
            pod_containers[sandbox.id] = []
        seen_containers: dict[str, ContainerMeta] = {}
        for container in containers:
            entry = seen_pods.get(container.pod_sandbox_id)
            if entry is None:
                continue
            meta = self._containers.get(container.id) or self._describe_container(entry[0], entry[1], container)
            if meta is None:
                continue
            seen_containers[container.id] = meta
            pod_containers[container.pod_sandbox_id].append(
                replace(meta, running=container.state == cri.CONTAINER_RUNNING))
        self._pods, self._containers = seen_pods, seen_containers
        pods = [replace(template, running=sandbox_ready[sid],
                        containers=tuple(sorted(pod_containers[sid], key=lambda c: (c.name, c.id))))
                for sid, (_, template) in seen_pods.items()]
        return sorted(pods, key=lambda p: (p.namespace, p.name, p.uid))

    def _describe_pod(self, sandbox: cri.PodSandbox) -> tuple[PodHookRequest, PodMeta] | None:
        who = f"pod {sandbox.metadata.namespace}/{sandbox.metadata.name}"
        try:
            status = self._cri.PodSandboxStatus(cri.PodSandboxStatusRequest(
                pod_sandbox_id=sandbox.id, verbose=True), timeout=CRI_TIMEOUT)
            request = fromcri.pod_record_from_status(status, sandbox.id)
            if not request.cgroup_parent:
                raise ValueError("no cgroup parent in the verbose status (is the runtime "
                                 "containerd with the CRI plugin?)")
            kube_qos = kube_qos_of_cgroup_parent(request.cgroup_parent)
            driver = self.layout.driver_for(request.cgroup_parent)
            uid = request.pod_meta.uid
            meta = PodMeta(
                namespace=request.pod_meta.namespace, name=request.pod_meta.name, uid=uid,
                labels=dict(request.labels), annotations=dict(request.annotations),
                kube_qos=kube_qos, koord_qos=KoordQoS.of(dict(request.labels)), priority=None,
                cgroup_dir=self.layout.pod_dir(kube_qos, uid, driver),
                sandbox_id=sandbox.id, running=sandbox.state == cri.SANDBOX_READY,
                created=sandbox.created_at / 1e9 if sandbox.created_at > 0 else None)
        except grpc.RpcError as exc:  # vanished between list and status: next sync decides
            log.debug("states informer: %s: status: %s", who, exc.code().name)
            return None
        except (ValueError, fromcri.StatusError) as exc:
            log.warning("states informer: %s (sandbox %s): skipped: %s", who, sandbox.id, exc)
            return None
        return request, meta

    def _describe_container(self, request: PodHookRequest, pod: PodMeta,
                            container: cri.Container) -> ContainerMeta | None:
        who = f"pod {pod.key} container {container.metadata.name}"
        try:
            status = self._cri.ContainerStatus(cri.ContainerStatusRequest(
                container_id=container.id, verbose=True), timeout=CRI_TIMEOUT)
            _, record = fromcri.container_record_from_status(status, container.id)
            driver = self.layout.driver_for(request.cgroup_parent)
            res = record.container_resources
            requests = {"cpu": milli_cpu_of_shares(res.cpu_shares)}
            limits: dict[str, int] = {}
            cpu_limit = milli_cpu_of_quota(res.cpu_quota, res.cpu_period)
            if cpu_limit is not None:
                limits["cpu"] = cpu_limit
            if res.memory_limit_in_bytes > 0:
                limits["memory"] = res.memory_limit_in_bytes
            return ContainerMeta(
                name=container.metadata.name, id=container.id,
                cgroup_dir=container_cgroup_dir(pod.cgroup_dir, container.id, driver),
                running=container.state == cri.CONTAINER_RUNNING,
                requests=requests, limits=limits)
        except grpc.RpcError as exc:
            log.debug("states informer: %s: status: %s", who, exc.code().name)
            return None
        except (ValueError, TypeError, fromcri.StatusError) as exc:
            log.warning("states informer: %s (%s): skipped: %s", who, container.id, exc)
            return None

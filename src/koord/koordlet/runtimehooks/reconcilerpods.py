"""The reconciler's view of a pod: its request as the pods source shows it now, the request
of its sandbox (pause) container, the running pods handed to ``RuntimePlugin.reconcile_pods``,
and what a round keeps of its answers and reports.

The sandbox container has a cgroup of its own under the pod's, which the runtime made with
the pod's resources; upstream's reconciler decides its cpuset (``RuntimePlugin.
reconcile_sandbox``) as for the pod's containers, so a pod bound to some cpus does not keep
its pause process on others.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import grpc
from cri_api.v1 import api_pb2 as cri

from koord.hookapi import PodHookRequest

from ..resourceexecutor.executor import CgroupError, CgroupExecutor, file_names
from ..statesinformer.meta import PodMeta
from .hooks import RunningPod, RuntimePlugin
from .protocol import CgroupUpdate, ContainerContext, ContainerRequest, HookPodMeta, PodRequest


@dataclass(frozen=True)
class Answer:
    """The cgroup update the hooks made of ``inputs`` (objects compared by identity)."""

    inputs: tuple[object, ...]
    update: CgroupUpdate | None


Observe = Callable[[str, list[str], bool, float], None]
"""Told each timed invocation: (level, the resource types it set, succeeded, seconds)."""


@dataclass(frozen=True, slots=True)
class Timing:
    """One invocation at ``level`` (a pod's, sandbox's, container's or kube-QoS dir's hooks
    and write): when it began, and the round's errors then, as a plugin's error since fails
    it as upstream's reconcile function's error fails its."""

    level: str
    began: float
    errors: int

    @classmethod
    def start(cls, level: str, report: ReconcileReport) -> Timing:
        return cls(level, time.perf_counter(), len(report.errors))

    def done(self, observe: Observe | None, update: CgroupUpdate | None, written: bool,
             report: ReconcileReport) -> bool:
        """Tells ``observe`` the invocation that made ``update`` (nothing when it set
        nothing), failed when its write failed or an error was reported since it began;
        ``written`` (whether the write succeeded), for the caller to test."""
        if observe is not None and update is not None:
            observe(self.level, file_names(update.resources), written and len(report.errors) == self.errors,
                    time.perf_counter() - self.began)
        return written


@dataclass
class ReconcileReport:
    """What one round did; ``written`` holds ``<cgroup dir>:<resource>`` per changed file."""

    pods: int = 0
    containers: int = 0
    stopped_pods: int = 0
    starting: int = 0
    """Young containers not running yet (see STARTING_WINDOW)."""
    unreadable: int = 0  # listed sandboxes and containers whose records do not decode
    written: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ListedPod:
    """A listed sandbox as a round uses it: its name for log lines and its hook request."""

    who: str
    request: bytes
    """A serialized PodHookRequest (see ``Reconciler._cri_pods``)."""


KUBELET_LABEL_PREFIX = "io.kubernetes."
"""Labels kubelet adds to a sandbox itself (pod name, namespace, uid): not in the pod object."""


def with_current_metadata(record: bytes, pod: PodMeta | None) -> bytes:
    """``record`` (a serialized PodHookRequest from CRI) with the labels and annotations of
    ``pod`` (the pods source's view of the same pod), as the proxy would see them were the
    pod created now: the pod's labels plus the ones kubelet adds to every sandbox, the pod's
    annotations; serialized. ``record`` itself when the source does not know the pod."""
    if pod is None:
        return record
    out = PodHookRequest.FromString(record)
    kubelet_own = {k: v for k, v in out.labels.items() if k.startswith(KUBELET_LABEL_PREFIX)}
    out.ClearField("labels")
    out.labels.update(kubelet_own)
    out.labels.update(pod.labels)
    out.ClearField("annotations")
    out.annotations.update(pod.annotations)
    return out.SerializeToString()


def same_metadata(a: PodMeta | None, b: PodMeta | None) -> bool:
    """What ``with_current_metadata`` takes from a pod is the same in both."""
    if a is None or b is None:
        return a is b
    return a is b or (a.labels == b.labels and a.annotations == b.annotations)


def container_sizes(pods: dict[str, PodMeta]) -> dict[str, object]:
    """Container id -> its (requests, limits) in the pods source: what changes when kubelet
    resizes a container."""
    return {c.id: (c.requests, c.limits) for pod in pods.values() for c in pod.containers if c.id}


def sandbox_context(request: bytes, sandbox_id: str) -> ContainerContext:
    """A container context for the sandbox container of the pod of ``request`` (a
    serialized PodHookRequest): the pod's metadata, labels, annotations and cgroup parent,
    the sandbox's id as the container's and no container name."""
    pod = PodHookRequest.FromString(request)
    return ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta.from_proto(pod.pod_meta), container_id=sandbox_id,
        pod_labels=dict(pod.labels), pod_annotations=dict(pod.annotations), pod_cgroup_parent=pod.cgroup_parent))


def running_pods(requests: Mapping[str, bytes], containers: Iterable[cri.Container]) -> list[RunningPod]:
    """The pods of a round: sandbox id -> its serialized PodHookRequest, with the ids of the
    listed containers of each."""
    ids: dict[str, list[str]] = defaultdict(list)
    for container in containers:
        ids[container.pod_sandbox_id].append(container.id)
    pods = []
    for sandbox_id, request in requests.items():
        req = PodRequest.from_proto(PodHookRequest.FromString(request))
        pods.append(RunningPod(req.meta, req.annotations, req.cgroup_parent, sandbox_id, tuple(ids[sandbox_id])))
    return pods


def reconcile_plugins(plugins: Iterable[RuntimePlugin], running: list[RunningPod], complete: bool) -> list[str]:
    """Each plugin's ``reconcile_pods``; the problems, each naming its plugin (a plugin that
    raised is one problem: the others still run)."""
    problems = []
    for plugin in plugins:
        try:
            problems += [f"plugin {plugin.name}: {p}" for p in plugin.reconcile_pods(running, complete)]
        except Exception as exc:  # a plugin's bug must not end the round
            problems.append(f"plugin {plugin.name}: {exc!r}")
    return problems


def error_message(exc: Exception, executor: CgroupExecutor) -> tuple[str, bool]:
    """What to say of an error of a pod or container, and whether it went between the list
    and the call that failed (the runtime no longer knows it, or its cgroup is gone from a
    tree that is there)."""
    if isinstance(exc, grpc.RpcError):
        code = exc.code()
        return f"CRI: {code.name}: {exc.details()}", code == grpc.StatusCode.NOT_FOUND
    return str(exc), isinstance(exc, CgroupError) and executor.gone(exc)

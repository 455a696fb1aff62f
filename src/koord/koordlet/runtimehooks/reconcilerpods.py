"""The reconciler's view of a pod: its request as the pods source shows it now, and the
request of its sandbox (pause) container.

The sandbox container has a cgroup of its own under the pod's, which the runtime made with
the pod's resources; upstream's reconciler decides its cpuset (``RuntimePlugin.
reconcile_sandbox``) as for the pod's containers, so a pod bound to some cpus does not keep
its pause process on others.
"""

from __future__ import annotations

from dataclasses import dataclass

from koord.hookapi import PodHookRequest

from ..statesinformer.meta import PodMeta
from .protocol import ContainerContext, ContainerRequest
from .protocol import PodMeta as RequestPodMeta


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
        pod_meta=RequestPodMeta.from_proto(pod.pod_meta), container_id=sandbox_id,
        pod_labels=dict(pod.labels), pod_annotations=dict(pod.annotations), pod_cgroup_parent=pod.cgroup_parent))

"""What the reconciler makes of a round's lists besides the hooks' requests: a pod's request
with the pods source's current labels and annotations, the containers' sizes to notice a
resize, and the running pods handed to ``RuntimePlugin.reconcile_pods``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from cri_api.v1 import api_pb2 as cri

from koord.hookapi import PodHookRequest

from ..statesinformer.meta import PodMeta
from .hooks import RunningPod, RuntimePlugin
from .protocol import PodRequest

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


def sizes(pods: dict[str, PodMeta]) -> dict[str, object]:
    """Container id -> its (requests, limits) in the pods source: what changes when kubelet
    resizes a container."""
    return {c.id: (c.requests, c.limits) for pod in pods.values() for c in pod.containers if c.id}


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

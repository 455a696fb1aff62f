"""CRI messages and containerd's verbose CRI status → hook requests, written once.

The proxy builds hook requests from the CRI calls it intercepts and, for pods and
containers it did not see created, from the backend's verbose status; koordlet's
reconciler builds the very same requests from the same status, so a plugin computes the
same values whichever path called it.

CRI's and the hook protocol's ``LinuxContainerResources`` share field numbers 1-10
(checked by a unit test), so resources convert through the wire format, keeping fields
either side does not know.

containerd's verbose status carries the original CRI config as JSON in ``info["info"]``
(``config``; Go's snake_case field names, which ``json_format.ParseDict`` reads along with
camelCase), and the container's current resources in ``status.resources``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from cri_api.v1 import api_pb2 as cri
from google.protobuf import json_format
from google.protobuf.message import Message

from koord.apis.runtime.v1alpha1 import api_pb2 as hook

from .annotations import json_document
from .hookpoints import ContainerHookRequest, PodHookRequest

MAX_INFO_BYTES = 16 << 20
"""containerd's verbose info holds the config and the OCI spec: a few KiB, far below this."""

_M = TypeVar("_M", bound=Message)


class StatusError(Exception):
    """A CRI status answer that cannot become a hook request; the message names the sandbox or container."""


def to_hook_resources(res: cri.LinuxContainerResources) -> hook.LinuxContainerResources:
    return hook.LinuxContainerResources.FromString(res.SerializeToString())


def to_cri_resources(res: hook.LinuxContainerResources) -> cri.LinuxContainerResources:
    return cri.LinuxContainerResources.FromString(res.SerializeToString())


# ---------------------------------------------------------------- CRI requests

def pod_hook_request(req: cri.RunPodSandboxRequest) -> PodHookRequest:
    cfg = req.config
    out = PodHookRequest(
        pod_meta=hook.PodSandboxMetadata(
            name=cfg.metadata.name, uid=cfg.metadata.uid,
            namespace=cfg.metadata.namespace, attempt=cfg.metadata.attempt),
        runtime_handler=req.runtime_handler,
        labels=cfg.labels,
        annotations=cfg.annotations,
        cgroup_parent=cfg.linux.cgroup_parent,
    )
    if cfg.linux.HasField("overhead"):
        out.overhead.CopyFrom(to_hook_resources(cfg.linux.overhead))
    if cfg.linux.HasField("resources"):
        out.resources.CopyFrom(to_hook_resources(cfg.linux.resources))
    return out


def pod_record_from_config(config: cri.PodSandboxConfig, runtime_handler: str = "") -> PodHookRequest:
    return pod_hook_request(cri.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler))


def container_record(config: cri.ContainerConfig, container_id: str = "") -> ContainerHookRequest:
    """The container's own half of a hook request (no pod fields): what the proxy's store keeps."""
    out = ContainerHookRequest(
        container_meta=hook.ContainerMetadata(
            name=config.metadata.name, attempt=config.metadata.attempt, id=container_id),
        container_annotations=config.annotations,
        container_envs={kv.key: kv.value for kv in config.envs},
    )
    if config.linux.HasField("resources"):
        out.container_resources.CopyFrom(to_hook_resources(config.linux.resources))
    return out


def container_hook_request(pod: PodHookRequest, container: ContainerHookRequest) -> ContainerHookRequest:
    """Joins the pod's info with the container's."""
    out = ContainerHookRequest()
    out.CopyFrom(container)
    out.pod_meta.CopyFrom(pod.pod_meta)
    if pod.HasField("resources"):
        out.pod_resources.CopyFrom(pod.resources)
    out.pod_annotations.update(pod.annotations)
    out.pod_labels.update(pod.labels)
    out.pod_cgroup_parent = pod.cgroup_parent
    return out


# ---------------------------------------------------------------- verbose CRI status

def verbose_info(info: dict[str, str], what: str) -> dict[str, Any]:
    """The JSON object containerd puts in a verbose status' ``info["info"]``."""
    raw = info.get("info")
    if not raw:
        raise StatusError(f"{what}: the runtime returned no verbose info (is it containerd with the CRI plugin?)")
    if len(raw) > MAX_INFO_BYTES:
        raise StatusError(f"{what}: verbose info is {len(raw)} bytes, more than {MAX_INFO_BYTES}")
    return json_document(raw, f"{what}: verbose info", StatusError)


def _config(info: dict[str, Any], message: type[_M], what: str) -> _M:
    config = info.get("config")
    if not isinstance(config, dict):
        raise StatusError(f"{what}: verbose info has no config")
    try:
        return json_format.ParseDict(config, message(), ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError) as exc:
        raise StatusError(f"{what}: config in verbose info does not parse: {exc}") from None


def pod_record_from_status(response: cri.PodSandboxStatusResponse, sandbox_id: str) -> PodHookRequest:
    """The PreRunPodSandbox request of a pod (as sent to the runtime), from its verbose status."""
    what = f"sandbox {sandbox_id}"
    info = verbose_info(dict(response.info), what)
    handler = info.get("runtimeHandler", "")
    return pod_record_from_config(_config(info, cri.PodSandboxConfig, what),
                                  handler if isinstance(handler, str) else "")


def container_record_from_status(response: cri.ContainerStatusResponse,
                                 container_id: str) -> tuple[str, ContainerHookRequest]:
    """(sandbox id, the container's half of a hook request) from its verbose status.

    Resources are the current ones (updates since creation live in the status, not in the
    creation config), except containerd's implicit swap: it reports "no swap" as swap ==
    memory limit; kubelet sent none, and replaying it after a plugin raises the memory
    limit would make runc fail.
    """
    what = f"container {container_id}"
    info = verbose_info(dict(response.info), what)
    config = _config(info, cri.ContainerConfig, what)
    record = container_record(config, container_id)
    current = response.status.resources.linux if response.status.HasField("resources") else None
    if current is not None and current.ByteSize():
        record.container_resources.CopyFrom(to_hook_resources(current))
        res = record.container_resources
        if not config.linux.resources.memory_swap_limit_in_bytes and res.memory_swap_limit_in_bytes == \
                res.memory_limit_in_bytes:
            res.memory_swap_limit_in_bytes = 0
    sandbox_id = info.get("sandboxID", "")
    if not sandbox_id or not isinstance(sandbox_id, str):
        raise StatusError(f"{what}: verbose info names no sandboxID")
    return sandbox_id, record

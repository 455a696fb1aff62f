"""Docker Engine JSON <-> hook messages: every fact about how Kubernetes lives in Docker.

cri-dockerd (and dockershim before it) store a pod as a "sandbox" container and each app
container as a container, both named ``k8s_<container>_<pod>_<namespace>_<uid>_<attempt>``
(the sandbox's container name is ``POD``) and labelled ``io.kubernetes.docker.type``; an
app container names its sandbox in ``io.kubernetes.sandbox.id``.  Pod and container
annotations travel as labels prefixed ``annotation.``.

The same view reads a ``POST /containers/create`` body (``Labels``/``Env`` at the top)
and a ``GET /containers/{id}/json`` answer (under ``Config``), so a record built at create
time and one rebuilt after a restart are the same.  Everything here validates before it
trusts: the input is a client's or the backend's JSON, and the only exception that leaves
this module is ``DockerJSONError`` with a message naming what was wrong.

Answers go back with the proxy's merge rules (``koord.runtimeproxy.convert``): the apply
functions write only what differs between the request the plugins saw and the one they
returned, so whatever no plugin answered stays as the client sent it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cri_api.v1 import api_pb2 as cri

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord.hookapi import ContainerHookRequest, PodHookRequest, json_document, json_object

from .. import convert

TYPE_LABEL = "io.kubernetes.docker.type"
SANDBOX_TYPE = "podsandbox"
CONTAINER_TYPE = "container"
SANDBOX_ID_LABEL = "io.kubernetes.sandbox.id"
ANNOTATION_PREFIX = "annotation."
NAME_PREFIX = "k8s"

# HostConfig (create, inspect) and UpdateConfig (update) key -> LinuxContainerResources field.
RESOURCE_KEYS = (
    ("CpuShares", "cpu_shares"),
    ("CpuQuota", "cpu_quota"),
    ("CpuPeriod", "cpu_period"),
    ("CpusetCpus", "cpuset_cpus"),
    ("CpusetMems", "cpuset_mems"),
    ("Memory", "memory_limit_in_bytes"),
    ("MemorySwap", "memory_swap_limit_in_bytes"),
    ("OomScoreAdj", "oom_score_adj"),
)
UPDATE_KEYS = tuple((k, f) for k, f in RESOURCE_KEYS if k != "OomScoreAdj")
"""``POST /containers/{id}/update`` has no OomScoreAdj."""

_INT64 = (-(1 << 63), (1 << 63) - 1)
_MAX_NAME = 1024


class DockerJSONError(ValueError):
    """A Docker body or answer that cannot become a hook request; the message says what and where."""


@dataclass(frozen=True)
class KubeName:
    """The parts of ``k8s_<container>_<pod>_<namespace>_<uid>_<attempt>``."""

    container: str
    pod: str
    namespace: str
    uid: str
    attempt: int


def parse_name(name: str) -> KubeName:
    """Parses a Kubernetes container name as cri-dockerd writes it (a leading ``/`` as inspect shows it).

    A seventh ``_`` field is a random suffix dockershim appends on a name conflict and is ignored.
    """
    if len(name) > _MAX_NAME:
        raise DockerJSONError(f"container name is {len(name)} characters long, more than {_MAX_NAME}")
    parts = name.removeprefix("/").split("_")
    if len(parts) not in (6, 7) or parts[0] != NAME_PREFIX:
        raise DockerJSONError(f"container name {name[:100]!r} is not k8s_<container>_<pod>_<namespace>_<uid>_<attempt>")
    _, container, pod, namespace, uid, attempt = parts[:6]
    if not (container and pod and namespace and uid):
        raise DockerJSONError(f"container name {name[:100]!r} has an empty field")
    if not attempt.isascii() or not attempt.isdigit() or int(attempt) >= 1 << 32:
        raise DockerJSONError(f"container name {name[:100]!r}: attempt {attempt[:20]!r} is not a uint32")
    return KubeName(container, pod, namespace, uid, int(attempt))


def decode_object(raw: bytes, what: str) -> dict[str, Any]:
    """A JSON object from ``raw``; anything else is a DockerJSONError naming ``what``."""
    return json_document(raw, what, DockerJSONError)


def _string_map(value: Any, where: str) -> dict[str, str]:
    out = json_object(value, where, DockerJSONError)
    for key, item in out.items():
        if not isinstance(item, str):
            raise DockerJSONError(f"{where}[{key[:100]!r}]: expected a string, got {type(item).__name__}")
    return out


def _string_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise DockerJSONError(f"{where}: expected a list of strings")
    return value


def resources_from(obj: dict[str, Any], where: str,
                   keys: tuple[tuple[str, str], ...] = RESOURCE_KEYS) -> hook.LinuxContainerResources:
    """The resource fields of a HostConfig (or an update body); absent or null fields stay 0 ("not set")."""
    out = hook.LinuxContainerResources()
    for key, field in keys:
        value = obj.get(key)
        if value is None:
            continue
        if field.startswith("cpuset"):
            if not isinstance(value, str):
                raise DockerJSONError(f"{where}.{key}: expected a string, got {type(value).__name__}")
        elif isinstance(value, bool) or not isinstance(value, int) or not _INT64[0] <= value <= _INT64[1]:
            raise DockerJSONError(f"{where}.{key}: expected a 64-bit integer, got {str(value)[:40]!r}")
        setattr(out, field, value)
    return out


@dataclass
class ContainerView:
    """The parts of one container's JSON the hooks need, referencing the JSON so apply_* edits it in place."""

    name: str
    labels: dict[str, str]
    env: list[str]
    host_config: dict[str, Any]
    _owner: dict[str, Any]
    """The object holding ``Labels`` and ``Env``: the body itself (create) or its ``Config`` (inspect)."""

    @classmethod
    def of_create(cls, body: dict[str, Any], name: str) -> ContainerView:
        view = cls(name, _string_map(body.get("Labels"), "Labels"), _string_list(body.get("Env"), "Env"),
                   json_object(body.get("HostConfig"), "HostConfig", DockerJSONError), body)
        body["HostConfig"] = view.host_config
        return view

    @classmethod
    def of_inspect(cls, answer: dict[str, Any]) -> ContainerView:
        config = json_object(answer.get("Config"), "Config", DockerJSONError)
        name = answer.get("Name", "")
        if not isinstance(name, str):
            raise DockerJSONError("Name: expected a string")
        return cls(name, _string_map(config.get("Labels"), "Config.Labels"),
                   _string_list(config.get("Env"), "Config.Env"),
                   json_object(answer.get("HostConfig"), "HostConfig", DockerJSONError), config)

    @property
    def kind(self) -> str:
        """``podsandbox``, ``container``, or "" for a container Kubernetes did not make."""
        return self.labels.get(TYPE_LABEL, "")

    @property
    def sandbox_id(self) -> str:
        return self.labels.get(SANDBOX_ID_LABEL, "")

    def plain_labels(self) -> dict[str, str]:
        return {k: v for k, v in self.labels.items() if not k.startswith(ANNOTATION_PREFIX)}

    def annotations(self) -> dict[str, str]:
        return {k.removeprefix(ANNOTATION_PREFIX): v for k, v in self.labels.items()
                if k.startswith(ANNOTATION_PREFIX)}

    def resources(self) -> hook.LinuxContainerResources:
        return resources_from(self.host_config, "HostConfig")

    def cgroup_parent(self) -> str:
        value = self.host_config.get("CgroupParent") or ""
        if not isinstance(value, str):
            raise DockerJSONError("HostConfig.CgroupParent: expected a string")
        return value

    def _set_label(self, key: str, value: str) -> None:
        if self.labels.get(key) != value:
            self.labels[key] = value
            self._owner["Labels"] = self.labels


# ---------------------------------------------------------------- Docker -> hook messages

def pod_request(view: ContainerView) -> PodHookRequest:
    """The PreRunPodSandbox request (and the store's pod record) of a sandbox container."""
    name = parse_name(view.name)
    return PodHookRequest(
        pod_meta=hook.PodSandboxMetadata(name=name.pod, uid=name.uid, namespace=name.namespace,
                                         attempt=name.attempt),
        labels=view.plain_labels(),
        annotations=view.annotations(),
        cgroup_parent=view.cgroup_parent(),
        resources=view.resources(),
    )


def container_record(view: ContainerView, container_id: str = "") -> ContainerHookRequest:
    """The container's half of a hook request (what the store keeps), like ``fromcri.container_record``."""
    name = parse_name(view.name)
    envs: dict[str, str] = {}
    for item in view.env:
        key, _, value = item.partition("=")
        envs[key] = value
    return ContainerHookRequest(
        container_meta=hook.ContainerMetadata(name=name.container, attempt=name.attempt, id=container_id),
        container_annotations=view.annotations(),
        container_resources=view.resources(),
        container_envs=envs,
    )


# ---------------------------------------------------------------- final hook messages -> Docker

def _apply_resources(target: dict[str, Any], before: hook.LinuxContainerResources,
                     after: hook.LinuxContainerResources, keys: tuple[tuple[str, str], ...]) -> None:
    """Writes the changed fields.

    Docker refuses a Memory above MemorySwap, and cri-dockerd sends MemorySwap = Memory
    ("no swap"): when a plugin changes only the memory limit, the swap limit follows it so
    the container stays without swap, as it would under containerd.
    """
    for key, field in keys:
        value = getattr(after, field)
        if value != getattr(before, field):
            target[key] = value
    swap_followed_memory = before.memory_swap_limit_in_bytes == before.memory_limit_in_bytes > 0
    if (swap_followed_memory and after.memory_limit_in_bytes != before.memory_limit_in_bytes
            and after.memory_swap_limit_in_bytes == before.memory_swap_limit_in_bytes):
        target["MemorySwap"] = after.memory_limit_in_bytes


def apply_pod(view: ContainerView, before: PodHookRequest, after: PodHookRequest) -> None:
    """Writes what the plugins changed into a sandbox's create body."""
    for key, value in after.labels.items():
        if before.labels.get(key) != value:
            view._set_label(key, value)
    for key, value in after.annotations.items():
        if before.annotations.get(key) != value:
            view._set_label(ANNOTATION_PREFIX + key, value)
    if after.cgroup_parent != before.cgroup_parent:
        view.host_config["CgroupParent"] = after.cgroup_parent
    _apply_resources(view.host_config, before.resources, after.resources, RESOURCE_KEYS)


def apply_container(view: ContainerView, before: ContainerHookRequest, after: ContainerHookRequest) -> None:
    """Writes what the plugins changed into a container's create body; envs keep their order."""
    for key, value in after.container_annotations.items():
        if before.container_annotations.get(key) != value:
            view._set_label(ANNOTATION_PREFIX + key, value)
    if after.pod_cgroup_parent != before.pod_cgroup_parent:
        view.host_config["CgroupParent"] = after.pod_cgroup_parent
    _apply_resources(view.host_config, before.container_resources, after.container_resources, RESOURCE_KEYS)
    if dict(after.container_envs) != dict(before.container_envs):
        view.env[:] = merge_env_list(view.env, after.container_envs)
        view._owner["Env"] = view.env


def merge_env_list(env: list[str], wanted: dict[str, str] | Any) -> list[str]:
    """Docker's ``K=V`` list merged by the CRI path's rule (``convert.merge_envs``)."""
    holder = cri.ContainerConfig()
    bare = set()
    for item in env:
        key, eq, value = item.partition("=")
        if not eq:
            bare.add(key)
        holder.envs.add(key=key, value=value)
    convert.merge_envs(holder.envs, wanted)
    # ``KEY`` without ``=`` (take the value from the daemon's env) stays so unless a plugin set a value.
    return [kv.key if kv.key in bare and not kv.value else f"{kv.key}={kv.value}" for kv in holder.envs]


def update_body(before: hook.LinuxContainerResources, after: hook.LinuxContainerResources) -> dict[str, Any]:
    """A ``POST /containers/{id}/update`` body with the fields that differ."""
    out: dict[str, Any] = {}
    _apply_resources(out, before, after, UPDATE_KEYS)
    return out


def apply_update(body: dict[str, Any], before: hook.LinuxContainerResources,
                 after: hook.LinuxContainerResources) -> None:
    _apply_resources(body, before, after, UPDATE_KEYS)


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()

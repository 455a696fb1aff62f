"""Typed pod and container contexts: the one place hook requests become Python and answers go back.

A hook request is converted to a context once, plugins change only ``context.response``,
and the response is converted to the protocol message once.  The reconciler (Standalone
mode) builds the same hook requests from CRI status (``koord.hookapi.fromcri``, as the
proxy does), so a plugin never knows which mode it runs in.  After the plugins ran, a
context says what koordlet must write to cgroups itself (``cgroup_update``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from koord.apis.runtime.v1alpha1 import api_pb2

from ..resources import KoordQoS, KubeQoS, Resources, present

if TYPE_CHECKING:
    from ..resourceexecutor.executor import CgroupExecutor

def _path_problems(value: str, name: str, *, single: bool) -> list[str]:
    """A request field that becomes part of a path: a cgroup parent, or one name in it."""
    if "\x00" in value:
        return [f"{name} {value!r} contains NUL"]
    if single and ("/" in value or value in (".", "..")):
        return [f"{name} {value!r} must be one path element (no '/', not '.' or '..')"]
    if ".." in value.split("/"):
        return [f"{name} {value!r} must not contain '..': it would leave the cgroup root"]
    return []


@dataclass
class HookPodMeta:
    """The pod's identity as a hook request carries it (CRI's sandbox metadata), not the
    states informer's pod (``statesinformer.meta.PodMeta``), which a request may not have."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    attempt: int = 0

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_proto(cls, msg: api_pb2.PodSandboxMetadata) -> HookPodMeta:
        return cls(name=msg.name, namespace=msg.namespace, uid=msg.uid, attempt=msg.attempt)

    def to_proto(self) -> api_pb2.PodSandboxMetadata | None:
        """None when empty, so an absent field stays absent on the way back."""
        return present(api_pb2.PodSandboxMetadata(
            name=self.name, namespace=self.namespace, uid=self.uid, attempt=self.attempt))


@dataclass
class PodRequest:
    meta: HookPodMeta = field(default_factory=HookPodMeta)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""
    resources: Resources = field(default_factory=Resources)
    runtime_handler: str = ""
    overhead: Resources = field(default_factory=Resources)

    @property
    def koord_qos(self) -> KoordQoS:
        return KoordQoS.of(self.labels)

    @classmethod
    def from_proto(cls, msg: api_pb2.PodSandboxHookRequest) -> PodRequest:
        return cls(
            meta=HookPodMeta.from_proto(msg.pod_meta),
            labels=dict(msg.labels),
            annotations=dict(msg.annotations),
            cgroup_parent=msg.cgroup_parent,
            resources=Resources.from_proto(msg.resources),
            runtime_handler=msg.runtime_handler,
            overhead=Resources.from_proto(msg.overhead),
        )

    def to_proto(self) -> api_pb2.PodSandboxHookRequest:
        """The request as a caller (proxy, SDK tests, benchmarks) sends it."""
        return api_pb2.PodSandboxHookRequest(
            pod_meta=self.meta.to_proto(),
            runtime_handler=self.runtime_handler,
            labels=self.labels,
            annotations=self.annotations,
            cgroup_parent=self.cgroup_parent,
            overhead=self.overhead.to_proto(),
            resources=self.resources.to_proto(),
        )

    @property
    def kube_qos(self) -> KubeQoS:
        return KubeQoS.of_cgroup_parent(self.cgroup_parent)

    def problems(self) -> list[str]:
        """Fields that would make a path leave its root: the request is refused as a whole."""
        return (_path_problems(self.meta.uid, "pod_meta.uid", single=True)
                + _path_problems(self.cgroup_parent, "cgroup_parent", single=False))


@dataclass
class PodResponse:
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cgroup_parent: str | None = None
    resources: Resources = field(default_factory=Resources)

    @classmethod
    def from_proto(cls, msg: api_pb2.PodSandboxHookResponse) -> PodResponse:
        return cls(
            labels=dict(msg.labels),
            annotations=dict(msg.annotations),
            cgroup_parent=msg.cgroup_parent or None,
            resources=Resources.from_proto(msg.resources),
        )

    def to_proto(self) -> api_pb2.PodSandboxHookResponse:
        return api_pb2.PodSandboxHookResponse(
            labels=self.labels,
            annotations=self.annotations,
            cgroup_parent=self.cgroup_parent or "",
            resources=self.resources.to_proto(),
        )

    def copy(self) -> PodResponse:
        """An independent copy (every field is a string, a dict of strings or Resources)."""
        return PodResponse(labels=dict(self.labels), annotations=dict(self.annotations),
                           cgroup_parent=self.cgroup_parent, resources=self.resources.copy())

    def merge(self, other: PodResponse) -> None:
        """Takes every change ``other`` makes; keys and values of ``other`` win."""
        self.labels.update(other.labels)
        self.annotations.update(other.annotations)
        if other.cgroup_parent:
            self.cgroup_parent = other.cgroup_parent
        self.resources.update(other.resources)


@dataclass(frozen=True)
class CgroupUpdate:
    """What koordlet writes itself once the plugins ran: ``resources`` into ``cgroup_dir``."""

    cgroup_dir: str
    resources: Resources


@dataclass
class PodContext:
    request: PodRequest
    response: PodResponse = field(default_factory=PodResponse)

    @classmethod
    def from_proto(cls, msg: api_pb2.PodSandboxHookRequest) -> PodContext:
        return cls(PodRequest.from_proto(msg))

    def to_proto(self) -> api_pb2.PodSandboxHookResponse:
        return self.response.to_proto()

    def cgroup_update(self, executor: CgroupExecutor, *, through_proxy: bool) -> CgroupUpdate | None:
        """The pod's resources go to its cgroup in both modes: the proxy drops pod-level resources.

        Through the proxy the pod may be moved to the cgroup parent the answer names.
        """
        parent = (self.response.cgroup_parent if through_proxy else None) or self.request.cgroup_parent
        if self.response.resources.is_empty() or not parent:
            return None
        return CgroupUpdate(executor.pod_dir(parent), self.response.resources)


@dataclass
class ContainerRequest:
    pod_meta: HookPodMeta = field(default_factory=HookPodMeta)
    container_name: str = ""
    container_id: str = ""
    attempt: int = 0
    pod_labels: dict[str, str] = field(default_factory=dict)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    container_annotations: dict[str, str] = field(default_factory=dict)
    pod_cgroup_parent: str = ""
    envs: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    pod_resources: Resources = field(default_factory=Resources)

    @property
    def koord_qos(self) -> KoordQoS:
        return KoordQoS.of(self.pod_labels)

    @property
    def kube_qos(self) -> KubeQoS:
        return KubeQoS.of_cgroup_parent(self.pod_cgroup_parent)

    def problems(self) -> list[str]:
        """Fields that would make a path leave its root: the request is refused as a whole."""
        return (_path_problems(self.pod_meta.uid, "pod_meta.uid", single=True)
                + _path_problems(self.pod_cgroup_parent, "pod_cgroup_parent", single=False)
                + _path_problems(self.container_id, "container_meta.id", single=True))

    @classmethod
    def from_proto(cls, msg: api_pb2.ContainerResourceHookRequest) -> ContainerRequest:
        return cls(
            pod_meta=HookPodMeta.from_proto(msg.pod_meta),
            container_name=msg.container_meta.name,
            container_id=msg.container_meta.id,
            attempt=msg.container_meta.attempt,
            pod_labels=dict(msg.pod_labels),
            pod_annotations=dict(msg.pod_annotations),
            container_annotations=dict(msg.container_annotations),
            pod_cgroup_parent=msg.pod_cgroup_parent,
            envs=dict(msg.container_envs),
            resources=Resources.from_proto(msg.container_resources),
            pod_resources=Resources.from_proto(msg.pod_resources),
        )

    def to_proto(self) -> api_pb2.ContainerResourceHookRequest:
        """The request as a caller (proxy, SDK tests, benchmarks) sends it."""
        return api_pb2.ContainerResourceHookRequest(
            pod_meta=self.pod_meta.to_proto(),
            container_meta=present(api_pb2.ContainerMetadata(
                name=self.container_name, id=self.container_id, attempt=self.attempt)),
            container_annotations=self.container_annotations,
            container_resources=self.resources.to_proto(),
            pod_resources=self.pod_resources.to_proto(),
            pod_annotations=self.pod_annotations,
            pod_labels=self.pod_labels,
            pod_cgroup_parent=self.pod_cgroup_parent,
            container_envs=self.envs,
        )


@dataclass
class ContainerResponse:
    """What the plugins answer for a container. ``rdt_class`` (the resctrl group the container
    joins when the runtime creates it) has no form in the proxy's protocol: NRI carries it,
    and through the proxy the plugin moves the container's threads after it starts."""

    annotations: dict[str, str] = field(default_factory=dict)
    envs: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    pod_cgroup_parent: str | None = None
    rdt_class: str | None = None

    @classmethod
    def from_proto(cls, msg: api_pb2.ContainerResourceHookResponse) -> ContainerResponse:
        return cls(
            annotations=dict(msg.container_annotations),
            envs=dict(msg.container_envs),
            resources=Resources.from_proto(msg.container_resources),
            pod_cgroup_parent=msg.pod_cgroup_parent or None,
        )

    def to_proto(self) -> api_pb2.ContainerResourceHookResponse:
        return api_pb2.ContainerResourceHookResponse(
            container_annotations=self.annotations,
            container_resources=self.resources.to_proto(),
            pod_cgroup_parent=self.pod_cgroup_parent or "",
            container_envs=self.envs,
        )

    def copy(self) -> ContainerResponse:
        """An independent copy (every field is a string, a dict of strings or Resources)."""
        return ContainerResponse(annotations=dict(self.annotations), envs=dict(self.envs),
                                 resources=self.resources.copy(), pod_cgroup_parent=self.pod_cgroup_parent,
                                 rdt_class=self.rdt_class)

    def merge(self, other: ContainerResponse) -> None:
        """Takes every change ``other`` makes; keys and values of ``other`` win."""
        self.annotations.update(other.annotations)
        self.envs.update(other.envs)
        if other.pod_cgroup_parent:
            self.pod_cgroup_parent = other.pod_cgroup_parent
        if other.rdt_class:
            self.rdt_class = other.rdt_class
        self.resources.update(other.resources)


@dataclass
class ContainerContext:
    request: ContainerRequest
    response: ContainerResponse = field(default_factory=ContainerResponse)

    @classmethod
    def from_proto(cls, msg: api_pb2.ContainerResourceHookRequest) -> ContainerContext:
        return cls(ContainerRequest.from_proto(msg))

    def to_proto(self) -> api_pb2.ContainerResourceHookResponse:
        return self.response.to_proto()

    def cgroup_update(self, executor: CgroupExecutor, *, through_proxy: bool) -> CgroupUpdate | None:
        """Through the proxy only what CRI cannot carry (group identity's bvt, plugins' own
        files); without it, everything."""
        resources = self.response.resources
        if through_proxy:
            resources = Resources(cpu_bvt_warp_ns=resources.cpu_bvt_warp_ns, files=dict(resources.files))
        elif resources.cpuset_cpus == "":
            # "" asks the runtime for no cpuset of the container's own; in a cgroup file it
            # would mean no cpus at all, so it is not written there.
            resources = resources.copy()
            resources.cpuset_cpus = None
        if resources.is_empty() or not self.request.container_id:
            return None
        return CgroupUpdate(executor.container_dir(self.request.pod_cgroup_parent, self.request.container_id),
                            resources)


HookContext = PodContext | ContainerContext

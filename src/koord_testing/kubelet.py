"""A CRI client that talks to a runtime the way kubelet does.

There is no kubelet on the test machines, so e2e tests drive containerd (directly
or through the proxy) with this client. It reproduces the parts of kubelet's
requests that runtimes and hook plugins react to: the pod cgroup layout under
``/kubepods``, host network, the ``io.kubernetes.*`` labels, the sandbox config
repeated in CreateContainer, and kubelet's 16 MiB message limit.
"""

from __future__ import annotations

import importlib
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from koord_testing.cgroups import PodLimits, create_pod_cgroup, pod_dir, remove_tree

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
QOS_CLASSES = ("besteffort", "burstable", "guaranteed")

# Cleanup must not hang a test teardown on a wedged runtime.
_CLEANUP_TIMEOUT = 30.0


def pod_cgroup_parent(qos: str, uid: str, kube_dir: str = "kubepods") -> str:
    """kubelet's pod cgroup for a QoS class (koordlet parses this layout); ``kube_dir`` is
    koordlet's ``--cgroup-kube-dir``, for tests that keep their pods apart.

    A ``kube_dir`` of ``kubepods.slice`` gives the systemd driver's names, expanded as kubelet
    sends them: ``/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice``
    (systemd names have ``_`` where the uid has ``-``).
    """
    base = kube_dir.strip("/")
    if base == "kubepods.slice":
        unit = uid.replace("-", "_")
        if qos == "guaranteed":
            return f"/{base}/kubepods-pod{unit}.slice"
        if qos in ("besteffort", "burstable"):
            return f"/{base}/kubepods-{qos}.slice/kubepods-{qos}-pod{unit}.slice"
    if qos == "guaranteed":
        return f"/{base}/pod{uid}"
    if qos in ("besteffort", "burstable"):
        return f"/{base}/{qos}/pod{uid}"
    raise ValueError(f"qos must be one of {QOS_CLASSES}, got {qos!r}")


def cri_modules(version: str) -> tuple[ModuleType, ModuleType]:
    """``(api_pb2, api_pb2_grpc)`` of the CRI version ``v1`` or ``v1alpha2``."""
    if version not in ("v1", "v1alpha2"):
        raise ValueError(f"CRI version must be 'v1' or 'v1alpha2', got {version!r}")
    return (
        importlib.import_module(f"cri_api.{version}.api_pb2"),
        importlib.import_module(f"cri_api.{version}.api_pb2_grpc"),
    )


def grpc_target(endpoint: str) -> str:
    """A grpc target for a unix socket path given with or without ``unix://``."""
    path = endpoint.removeprefix("unix://")
    return f"unix://{path}"


class KubeletClient:
    """CRI client with kubelet's request shapes; remembers what it created for cleanup."""

    def __init__(
        self,
        endpoint: str,
        version: str = "v1",
        on_pod_created: Callable[[str], None] | None = None,
        log_root: Path | None = None,
        cgroup_root: str | Path = "/sys/fs/cgroup",
    ) -> None:
        self.endpoint = endpoint
        self.version = version
        self.pb, grpc_mod = cri_modules(version)
        self.channel = grpc.insecure_channel(
            grpc_target(endpoint),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self.runtime = grpc_mod.RuntimeServiceStub(self.channel)
        self.image = grpc_mod.ImageServiceStub(self.channel)
        self._on_pod_created = on_pod_created
        self._log_root = Path(log_root) if log_root else None
        self.cgroup_root = Path(cgroup_root)
        self.kube_dir = "kubepods"
        """Where this client's pods' cgroups go (as kubelet's, unless a test moves them)."""
        self.sandbox_configs: dict[str, Any] = {}
        self.pods: list[str] = []
        self.containers: list[str] = []

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> KubeletClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- request builders -------------------------------------------------

    def sandbox_config(
        self,
        name: str,
        namespace: str = "default",
        uid: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        qos: str = "besteffort",
        attempt: int = 0,
        kube_dir: str | None = None,
    ) -> Any:
        """A PodSandboxConfig as kubelet 1.2x builds it for a host-network pod."""
        pb = self.pb
        uid = uid or str(uuid.uuid4())
        all_labels = dict(labels or {})
        all_labels.update(
            {
                "io.kubernetes.pod.name": name,
                "io.kubernetes.pod.namespace": namespace,
                "io.kubernetes.pod.uid": uid,
            }
        )
        all_annotations = {
            "kubernetes.io/config.source": "api",
            "kubernetes.io/config.seen": "2024-01-01T00:00:00.000000000Z",
        }
        all_annotations.update(annotations or {})
        if self._log_root is None:
            self._log_root = Path(tempfile.mkdtemp(prefix="koord-pod-logs-"))
        log_dir = self._log_root / f"{namespace}_{name}_{uid}"
        log_dir.mkdir(parents=True, exist_ok=True)
        namespaces = pb.NamespaceOption(
            network=pb.NamespaceMode.NODE, pid=pb.NamespaceMode.CONTAINER, ipc=pb.NamespaceMode.POD
        )
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=attempt),
            hostname="",
            log_directory=str(log_dir),
            dns_config=pb.DNSConfig(),
            labels=all_labels,
            annotations=all_annotations,
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=pod_cgroup_parent(qos, uid, kube_dir or self.kube_dir),
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=namespaces),
            ),
        )

    def _resources(self, resources: Any) -> Any:
        if resources is None or isinstance(resources, self.pb.LinuxContainerResources):
            return resources
        if isinstance(resources, Mapping):
            return self.pb.LinuxContainerResources(**resources)
        raise TypeError(
            f"resources must be a dict or {self.pb.__name__}.LinuxContainerResources, got {type(resources).__name__}"
        )

    def container_config(
        self,
        sandbox_config: Any,
        name: str,
        image: str,
        command: Sequence[str] | None = None,
        args: Sequence[str] | None = None,
        envs: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        resources: Any = None,
    ) -> Any:
        """A ContainerConfig as kubelet builds it, carrying the pod's identity labels."""
        pb = self.pb
        meta = sandbox_config.metadata
        all_labels = dict(labels or {})
        all_labels.update(
            {
                "io.kubernetes.container.name": name,
                "io.kubernetes.pod.name": meta.name,
                "io.kubernetes.pod.namespace": meta.namespace,
                "io.kubernetes.pod.uid": meta.uid,
            }
        )
        all_annotations = {
            "io.kubernetes.container.hash": "0",
            "io.kubernetes.container.restartCount": "0",
            "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
            "io.kubernetes.container.terminationMessagePolicy": "File",
            "io.kubernetes.pod.terminationGracePeriod": "30",
        }
        all_annotations.update(annotations or {})
        env_items = envs.items() if isinstance(envs, Mapping) else (envs or ())
        security = pb.LinuxContainerSecurityContext(
            namespace_options=sandbox_config.linux.security_context.namespace_options
        )
        linux = pb.LinuxContainerConfig(security_context=security)
        res = self._resources(resources)
        if res is not None:
            linux.resources.CopyFrom(res)
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image),
            command=list(command or ()),
            args=list(args or ()),
            envs=[pb.KeyValue(key=k, value=v) for k, v in env_items],
            labels=all_labels,
            annotations=all_annotations,
            log_path=f"{name}/0.log",
            linux=linux,
        )

    # ---- kubelet-like operations -----------------------------------------

    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        uid: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        qos: str = "besteffort",
        runtime_handler: str = "",
        timeout: float | None = 240.0,
        kube_dir: str | None = None,
        pod_limits: PodLimits | None = None,
    ) -> str:
        """RunPodSandbox as kubelet sends it; with ``pod_limits`` the pod cgroup is first created
        holding them, as kubelet does (otherwise the runtime creates it, empty)."""
        config = self.sandbox_config(name, namespace, uid, labels, annotations, qos, kube_dir=kube_dir)
        if self._on_pod_created is not None:
            # Registered before the call: a failed RunPodSandbox can still leave a cgroup dir.
            self._on_pod_created(config.linux.cgroup_parent)
        if pod_limits is not None:
            create_pod_cgroup(config.linux.cgroup_parent, pod_limits, self.cgroup_root)
        resp = self.runtime.RunPodSandbox(
            self.pb.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler), timeout=timeout
        )
        self.sandbox_configs[resp.pod_sandbox_id] = config
        self.pods.append(resp.pod_sandbox_id)
        return resp.pod_sandbox_id

    def pod_cgroup_parent(self, sandbox_id: str) -> str:
        """The cgroup parent this client asked for when it ran ``sandbox_id``."""
        return self.sandbox_configs[sandbox_id].linux.cgroup_parent

    def create_container(
        self,
        sandbox_id: str,
        name: str,
        image: str,
        command: Sequence[str] | None = None,
        args: Sequence[str] | None = None,
        envs: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        resources: Any = None,
        timeout: float | None = 120.0,
    ) -> str:
        sandbox_config = self.sandbox_configs.get(sandbox_id)
        if sandbox_config is None:
            raise KeyError(f"sandbox {sandbox_id} was not run by this client; its config is unknown")
        config = self.container_config(
            sandbox_config, name, image, command, args, envs, labels, annotations, resources
        )
        resp = self.runtime.CreateContainer(
            self.pb.CreateContainerRequest(
                pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config
            ),
            timeout=timeout,
        )
        self.containers.append(resp.container_id)
        return resp.container_id

    def start_container(self, container_id: str, timeout: float | None = 120.0) -> None:
        self.runtime.StartContainer(self.pb.StartContainerRequest(container_id=container_id), timeout=timeout)

    def stop_container(self, container_id: str, grace: int = 10, timeout: float | None = 120.0) -> None:
        self.runtime.StopContainer(
            self.pb.StopContainerRequest(container_id=container_id, timeout=grace), timeout=timeout
        )

    def remove_container(self, container_id: str, timeout: float | None = 120.0) -> None:
        self.runtime.RemoveContainer(self.pb.RemoveContainerRequest(container_id=container_id), timeout=timeout)
        if container_id in self.containers:
            self.containers.remove(container_id)

    def stop_pod(self, sandbox_id: str, timeout: float | None = 120.0) -> None:
        self.runtime.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=timeout)

    def remove_pod(self, sandbox_id: str, timeout: float | None = 120.0) -> None:
        """RemovePodSandbox, then (like kubelet) the pod's now empty cgroup dir."""
        self.runtime.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=timeout)
        if sandbox_id in self.pods:
            self.pods.remove(sandbox_id)
        config = self.sandbox_configs.get(sandbox_id)
        if config is not None:
            remove_tree(pod_dir(config.linux.cgroup_parent), self.cgroup_root)

    def container_status(self, container_id: str, verbose: bool = False, timeout: float | None = 120.0) -> Any:
        return self.runtime.ContainerStatus(
            self.pb.ContainerStatusRequest(container_id=container_id, verbose=verbose), timeout=timeout
        )

    def pod_status(self, sandbox_id: str, verbose: bool = False, timeout: float | None = 120.0) -> Any:
        return self.runtime.PodSandboxStatus(
            self.pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose), timeout=timeout
        )

    def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout: int = 10, grpc_timeout: float | None = None
    ) -> Any:
        """ExecSync; like kubelet the gRPC deadline defaults to the exec timeout plus slack."""
        deadline = grpc_timeout if grpc_timeout is not None else timeout + 30.0
        return self.runtime.ExecSync(
            self.pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout), timeout=deadline
        )

    def update_resources(self, container_id: str, resources: Any, timeout: float | None = 120.0) -> None:
        self.runtime.UpdateContainerResources(
            self.pb.UpdateContainerResourcesRequest(container_id=container_id, linux=self._resources(resources)),
            timeout=timeout,
        )

    def run_container(self, sandbox_id: str, name: str, image: str, **kwargs: Any) -> str:
        """CreateContainer then StartContainer: the common case in tests."""
        container_id = self.create_container(sandbox_id, name, image, **kwargs)
        self.start_container(container_id)
        return container_id

    def cleanup(self) -> list[str]:
        """Stops and removes every pod this client ran; returns the errors instead of raising.

        Removing the pods also removes their containers; tests call this in teardown so
        a failed test never leaks pods into the next one.
        """
        errors: list[str] = []
        for sandbox_id in list(self.pods):
            for step in (self.stop_pod, self.remove_pod):
                try:
                    step(sandbox_id, timeout=_CLEANUP_TIMEOUT)
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.NOT_FOUND:
                        errors.append(f"{step.__name__}({sandbox_id}): {err.code().name}: {err.details()}")
            if sandbox_id in self.pods:
                self.pods.remove(sandbox_id)
        self.containers.clear()
        return errors

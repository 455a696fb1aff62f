"""The e2e harness for hook tests: a proxy in front of the session containerd, plugins
registered in its hook dir, and helpers to read what landed in the container."""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Callable

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord.hookapi import HookPoint
from koord_testing.cgroups import Cgroup
from koord_testing.containerd import Containerd
from koord_testing.hookplugin import ALL_HOOKS, POD_HOOKS, Behaviour, RecordingPlugin
from koord_testing.kubelet import KubeletClient
from koord_testing.proxy import RuntimeProxy
from koord_testing.sockets import make_short_socket_dir

MiB = 1 << 20
SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"
# The order kubelet's lifecycle below triggers them in.
LIFECYCLE_HOOKS = tuple(HookPoint)


class PluginRig:
    """Plugins and their registration dir under a short /tmp dir (pytest's tmp_path can push a
    unix socket path past its 107-byte limit), the proxy a test starts and the kubelet clients
    it makes; ``close`` removes them in one order whatever the backend."""

    def __init__(self, prefix: str) -> None:
        self.root = make_short_socket_dir(prefix)
        self.hook_dir = self.root / "hookserver.d"
        self.hook_dir.mkdir()
        self.plugins: list[RecordingPlugin] = []
        self.proxy: RuntimeProxy | None = None
        self.clients: list[KubeletClient] = []

    def plugin(self, file_name: str, hooks=ALL_HOOKS, failure_policy: str = "Ignore",
               timeout: float | None = None) -> RecordingPlugin:
        plugin = RecordingPlugin(self.root / f"{file_name.removesuffix('.json')}.sock", name=file_name).start()
        self.plugins.append(plugin)
        plugin.registration(self.hook_dir, file_name, hooks=hooks, failure_policy=failure_policy, timeout=timeout)
        return plugin

    def cleanup_client(self) -> KubeletClient:
        """A client straight at the backend that removes every pod the test's clients made."""
        raise NotImplementedError

    def cleanup_backend(self) -> list[str]:
        """What else the backend keeps after the pods are gone; the errors met removing it."""
        return []

    def close(self) -> None:
        with self.cleanup_client() as direct:
            direct.pods = sorted({p for c in self.clients for p in c.pods})
            errors = direct.cleanup()
        for client in self.clients:
            client.close()
        if self.proxy is not None:
            self.proxy.stop()
            print("--- runtime proxy log ---\n" + self.proxy.logs(tail=200))
        for plugin in self.plugins:
            plugin.stop()
        errors += self.cleanup_backend()
        shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            print("cleanup errors:", *errors, sep="\n  ")


class Rig(PluginRig):
    """A proxy process in front of the session containerd, with plugins."""

    def __init__(self, containerd: Containerd) -> None:
        super().__init__("kh-")
        self.containerd = containerd

    def start_proxy(self, metrics_bind_address: str = "", extra_args=()) -> RuntimeProxy:
        self.proxy = RuntimeProxy(self.root / "proxy", self.containerd.endpoint, hook_config_dir=self.hook_dir,
                                  metrics_bind_address=metrics_bind_address, extra_args=extra_args).start()
        return self.proxy

    def kubelet(self) -> KubeletClient:
        """A kubelet talking to the proxy; its pods are removed at containerd on close."""
        assert self.proxy is not None
        client = KubeletClient(self.proxy.endpoint, on_pod_created=self.containerd.track_pod_cgroup,
                               log_root=self.containerd.workdir / "pod-logs")
        self.clients.append(client)
        return client

    def direct(self) -> KubeletClient:
        """A kubelet talking to containerd itself, bypassing the proxy."""
        client = self.containerd.client()
        self.clients.append(client)
        return client

    def cleanup_client(self) -> KubeletClient:
        return self.containerd.client()


def empty_answer(hook_name: str):
    return hook.PodSandboxHookResponse() if hook_name in POD_HOOKS else hook.ContainerResourceHookResponse()


def record_order(order: list[tuple[str, str]], plugin: RecordingPlugin,
                 answers: dict[str, Callable] | None = None) -> None:
    """Every hook of ``plugin`` appends (hook, plugin) to the shared ``order`` and answers from ``answers``."""
    for hook_name in ALL_HOOKS:
        answer = (answers or {}).get(hook_name)

        def serve(req, hook_name=hook_name, answer=answer):
            order.append((hook_name, plugin.name))
            return answer(req) if answer is not None else empty_answer(hook_name)
        plugin.behaviours[hook_name] = Behaviour(answer=serve)


def cgroup(client: KubeletClient, sandbox_id: str, container_id: str) -> Cgroup:
    """The container's cgroup, read the same way on v1 and v2."""
    return Cgroup.of_container(client.pod_cgroup_parent(sandbox_id), container_id)


def spec_env(client: KubeletClient, container_id: str) -> list[str]:
    """The env of the OCI spec containerd generated (verbose ContainerStatus)."""
    info = json.loads(client.container_status(container_id, verbose=True).info["info"])
    return info["runtimeSpec"]["process"]["env"]


def only_keys(env: list[str], keys: set[str]) -> list[str]:
    return [kv for kv in env if kv.partition("=")[0] in keys]


def eventually(check: Callable[[], bool], timeout: float = 3.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""The e2e harness for Docker mode: one private dockerd per session, two cri-dockerds (one
straight at dockerd, one at the proxy's socket), and per test a proxy in Docker mode with
its own hook dir and plugins."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from koord.testing.docker import CriDockerd, Dockerd
from koord.testing.hookplugin import ALL_HOOKS, RecordingPlugin
from koord.testing.kubelet import KubeletClient
from koord.testing.proxy import RuntimeProxy
from koord.testing.sockets import make_short_socket_dir


class DockerEnv:
    """The session's dockerd and cri-dockerds; the proxied cri-dockerd starts with the first proxy."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dockerd = Dockerd(root / "d")
        self.proxy_endpoint = str(root / "proxy.sock")
        self.direct_cri = CriDockerd(root / "cd", self.dockerd.endpoint)
        self.proxied_cri = CriDockerd(root / "cp", self.proxy_endpoint)

    def start(self) -> DockerEnv:
        self.dockerd.start()
        self.direct_cri.start()
        return self

    def stop(self) -> None:
        self.proxied_cri.stop()
        self.direct_cri.stop()
        self.dockerd.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class DockerRig:
    """Plugins, their registration dir and a Docker-mode proxy serving on the session's proxy socket."""

    def __init__(self, env: DockerEnv) -> None:
        self.env = env
        self.dockerd = env.dockerd
        self.root = make_short_socket_dir("kdr-")
        self.hook_dir = self.root / "hookserver.d"
        self.hook_dir.mkdir()
        self.plugins: list[RecordingPlugin] = []
        self.proxy: RuntimeProxy | None = None
        self.clients: list[KubeletClient] = []

    def plugin(self, file_name: str, hooks=ALL_HOOKS, failure_policy: str = "Ignore") -> RecordingPlugin:
        plugin = RecordingPlugin(self.root / f"{file_name.removesuffix('.json')}.sock", name=file_name).start()
        self.plugins.append(plugin)
        plugin.registration(self.hook_dir, file_name, hooks=hooks, failure_policy=failure_policy)
        return plugin

    def start_proxy(self, metrics_bind_address: str = "") -> RuntimeProxy:
        if self.proxy is None:
            self.proxy = RuntimeProxy(self.root / "proxy", self.dockerd.endpoint, hook_config_dir=self.hook_dir,
                                      docker=True, endpoint=self.env.proxy_endpoint,
                                      metrics_bind_address=metrics_bind_address)
        self.proxy.start()
        if not self.env.proxied_cri.running:
            self.env.proxied_cri.start()
        return self.proxy

    def kubelet(self) -> KubeletClient:
        """kubelet's CRI calls to the cri-dockerd that talks to the proxy."""
        client = self.env.proxied_cri.client(self.dockerd.track_pod_cgroup)
        self.clients.append(client)
        return client

    def direct(self) -> KubeletClient:
        """kubelet's CRI calls to the cri-dockerd that talks to dockerd itself."""
        client = self.env.direct_cri.client(self.dockerd.track_pod_cgroup)
        self.clients.append(client)
        return client

    def inspect(self, ref: str) -> dict[str, Any]:
        status, body = self.dockerd.api("GET", f"/containers/{ref}/json")
        assert status == 200, f"inspect {ref}: {status} {body}"
        return body

    def close(self) -> None:
        errors: list[str] = []
        with self.env.direct_cri.client() as direct:
            direct.pods = sorted({p for c in self.clients for p in c.pods})
            errors += direct.cleanup()
        for client in self.clients:
            client.close()
        if self.proxy is not None:
            self.proxy.stop()
            print("--- runtime proxy log ---\n" + self.proxy.logs(tail=200))
        for plugin in self.plugins:
            plugin.stop()
        errors += self.dockerd.remove_all_containers()
        shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            print("cleanup errors:", *errors, sep="\n  ")

"""The e2e harness for Docker mode: one private dockerd per session, two cri-dockerds (one
straight at dockerd, one at the proxy's socket), and per test a proxy in Docker mode with
its own hook dir and plugins."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from koord_testing.docker import CriDockerd, Dockerd
from koord_testing.kubelet import KubeletClient
from koord_testing.proxy import RuntimeProxy

from .rig import PluginRig


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


class DockerRig(PluginRig):
    """A Docker-mode proxy serving on the session's proxy socket, with plugins."""

    def __init__(self, env: DockerEnv) -> None:
        super().__init__("kdr-")
        self.env = env
        self.dockerd = env.dockerd

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

    def cleanup_client(self) -> KubeletClient:
        return self.env.direct_cri.client()

    def cleanup_backend(self) -> list[str]:
        return self.dockerd.remove_all_containers()

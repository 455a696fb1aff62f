"""A private dockerd and a private cri-dockerd for Docker-mode e2e tests.

Everything lives under one work dir (data root, exec root, sockets, pidfile, config,
cri-dockerd's root), so a session runs beside the node's own docker and beside other
sessions.  What it took on machines without systemd, with cgroup v1 and without
CAP_SYS_RESOURCE:

* dockerd's default runtime is a wrapper around runc that clamps a negative
  ``oomScoreAdj`` in the bundle's config.json to 0 (cri-dockerd asks -998 for every
  sandbox, which runc cannot apply without CAP_SYS_RESOURCE); the API traffic and
  ``docker inspect`` are unchanged;
* no bridge, no iptables: containers use ``--network host`` or ``none``;
* cri-dockerd runs in its own PID namespace (it periodically rewrites oom_score_adj of
  every process named dockerd or containerd on the host), and its no-op CNI setup needs
  an empty private conf dir; pods are host-network;
* dockerd leaves ``<exec-root>/netns/default`` mounted: teardown unmounts everything
  under the work dir.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from koord_testing.cgroups import hierarchies, pod_dir, remove_tree
from koord_testing.containerd import _cgroup_pids, _kill, unmount_all, wait_cri_ready
from koord_testing.image import DEFAULT_REF, build_pause_image
from koord_testing.kubelet import KubeletClient
from koord_testing.processes import stop_process
from koord_testing.sharedbin import missing_shared_binaries, shared_binary

log = logging.getLogger(__name__)

CRI_DOCKERD = shared_binary("cri-dockerd")
CRICTL = shared_binary("crictl")
REQUIRED_BINARIES = ("dockerd", "docker", "containerd", "runc", "unshare", "gcc")

_RUNC_WRAPPER = """#!/bin/sh
# Clamps a negative oomScoreAdj in the OCI bundle to 0: root here lacks CAP_SYS_RESOURCE.
prev=""
for arg in "$@"; do
  case "$prev" in
    --bundle|-b) sed -i -E 's/"oomScoreAdj":-[0-9]+/"oomScoreAdj":0/' "$arg/config.json" ;;
  esac
  case "$arg" in
    --bundle=*) sed -i -E 's/"oomScoreAdj":-[0-9]+/"oomScoreAdj":0/' "${arg#--bundle=}/config.json" ;;
  esac
  prev="$arg"
done
exec runc "$@"
"""


def docker_binaries_present() -> None:
    """Raises naming every missing tool: a missing runtime is a broken test setup, not a skip."""
    missing = [name for name in REQUIRED_BINARIES if shutil.which(name) is None]
    missing += missing_shared_binaries("cri-dockerd", "crictl")
    if missing:
        raise RuntimeError(f"Docker e2e tests need {', '.join(missing)} (Debian package docker.io; "
                           "cri-dockerd and crictl from shared/bin beside the checkout, or $KOORD_SHARED_BIN)")


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a unix socket: the tests' own view of the Docker API, no SDK in between."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


def api(endpoint: str, method: str, path: str, body: Any = None,
        timeout: float = 60.0) -> tuple[int, Any]:
    """One Docker API call; returns (status, decoded JSON or raw bytes)."""
    conn = UnixHTTPConnection(endpoint, timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw
    finally:
        conn.close()


def _wait(check: Callable[[], bool], what: str, timeout: float, alive: Callable[[], bool]) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive():
            raise RuntimeError(f"{what}: the process exited")
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout}s")


def _pings(endpoint: str) -> bool:
    try:
        return api(endpoint, "GET", "/_ping", timeout=2)[0] == 200
    except OSError:
        return False


def wait_docker_ready(endpoint: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Polls ``GET /_ping`` every 50 ms until it answers 200; raises otherwise."""
    _wait(lambda: _pings(endpoint), f"Docker API on {endpoint}", timeout, alive)


class Dockerd:
    """One private dockerd (with the containerd it spawns) under ``workdir``; a context manager."""

    def __init__(self, workdir: Path, image_ref: str = DEFAULT_REF) -> None:
        self.workdir = Path(workdir).resolve()
        self.data_root = self.workdir / "data"
        self.exec_root = self.workdir / "exec"
        self.endpoint = str(self.workdir / "docker.sock")
        self.pidfile = self.workdir / "docker.pid"
        self.config_file = self.workdir / "daemon.json"
        self.docker_config = self.workdir / "docker-cli"
        self.runtime_wrapper = self.workdir / "runc-wrapper"
        self.log_path = self.workdir / "dockerd.log"
        self.image = image_ref
        self.image_cache = self.workdir / "image"
        self.cgroup_parent = f"koord-test-docker-{os.getpid()}"
        self.pod_cgroup_parents: set[str] = set()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        return ["dockerd", "--data-root", str(self.data_root), "--exec-root", str(self.exec_root),
                "--pidfile", str(self.pidfile), "--host", f"unix://{self.endpoint}",
                "--config-file", str(self.config_file), "--iptables=false", "--ip6tables=false",
                "--ip-forward=false", "--ip-masq=false", "--bridge=none",
                "--cgroup-parent", self.cgroup_parent, "--exec-opt", "native.cgroupdriver=cgroupfs",
                "--add-runtime", f"koord-runc={self.runtime_wrapper}", "--default-runtime", "koord-runc"]

    def start(self, timeout: float = 60.0) -> Dockerd:
        docker_binaries_present()
        for directory in (self.data_root, self.exec_root, self.docker_config):
            directory.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text("{}")
        self.runtime_wrapper.write_text(_RUNC_WRAPPER)
        self.runtime_wrapper.chmod(0o755)
        self._log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_docker_ready(self.endpoint, timeout, lambda: self.running)
        except Exception as err:
            self.stop()
            raise RuntimeError(f"dockerd did not start: {err}\n--- {self.log_path} tail ---\n"
                               f"{self.log_tail()}") from err
        self.load_image(build_pause_image(self.image_cache, self.image))
        return self

    def cli(self, *args: str, endpoint: str | None = None, input: bytes | None = None,
            timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        """Runs the docker CLI against ``endpoint`` (default: this dockerd) with a private config dir."""
        env = dict(os.environ, DOCKER_CONFIG=str(self.docker_config))
        env.pop("DOCKER_HOST", None)
        proc = subprocess.run([self.docker_binary(), "-H", f"unix://{endpoint or self.endpoint}", *args],
                              input=input, capture_output=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()}")
        return proc

    @staticmethod
    def docker_binary() -> str:
        """Debian's /usr/bin/docker when installed, else whatever ``docker`` is on PATH."""
        return "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else shutil.which("docker") or "docker"

    def load_image(self, archive: Path) -> None:
        with open(archive, "rb") as f:
            self.cli("load", input=f.read())

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return api(self.endpoint, method, path, body)

    def remove_all_containers(self) -> list[str]:
        problems = []
        status, containers = self.api("GET", "/containers/json?all=1")
        if status != 200:
            return [f"list containers: {status} {containers}"]
        for c in containers:
            status, body = self.api("DELETE", f"/containers/{c['Id']}?force=1&v=1")
            if status not in (204, 404):
                problems.append(f"remove {c['Id'][:12]}: {status} {body}")
        return problems

    def track_pod_cgroup(self, cgroup_parent: str) -> None:
        self.pod_cgroup_parents.add(cgroup_parent)

    def stop(self) -> None:
        """Removes every container, stops dockerd, unmounts and removes the pod cgroups."""
        problems: list[str] = []
        if self.running:
            try:
                problems += self.remove_all_containers()
            except OSError as err:
                problems.append(f"removing containers: {err}")
        if self._proc is not None:
            stop_process(self._proc, timeout=20)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        leftovers = [pid for parent in self.pod_cgroup_parents | {self.cgroup_parent}
                     for hierarchy in hierarchies()
                     for pid in _cgroup_pids(hierarchy / pod_dir(parent))]
        _kill(leftovers)
        problems += unmount_all(self.workdir)
        for parent in sorted(self.pod_cgroup_parents | {self.cgroup_parent}):
            problems += remove_tree(pod_dir(parent))
        shutil.rmtree(self.data_root, ignore_errors=True)
        if problems:
            log.warning("dockerd cleanup under %s left: %s", self.workdir, "; ".join(problems))

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Dockerd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DockerKubeletClient(KubeletClient):
    """kubelet's CRI calls for cri-dockerd, which (unlike containerd) needs the container's log dir to exist."""

    def create_container(self, sandbox_id: str, name: str, image: str, *args: Any, **kwargs: Any) -> str:
        config = self.sandbox_configs.get(sandbox_id)
        if config is not None:
            (Path(config.log_directory) / name).mkdir(parents=True, exist_ok=True)
        return super().create_container(sandbox_id, name, image, *args, **kwargs)


class CriDockerd:
    """One cri-dockerd serving CRI on its own socket, talking Docker API to ``docker_endpoint``.

    It runs in its own PID namespace (``unshare --pid --fork --mount-proc``); ``stop``
    signals cri-dockerd itself, not ``unshare``.
    """

    def __init__(self, workdir: Path, docker_endpoint: str, pause_image: str = DEFAULT_REF) -> None:
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.docker_endpoint = docker_endpoint
        self.endpoint = str(self.workdir / "cri-dockerd.sock")
        self.root = self.workdir / "root"
        self.cni_conf_dir = self.workdir / "cni-conf"
        self.cni_bin_dir = self.workdir / "cni-bin"
        self.cni_cache_dir = self.workdir / "cni-cache"
        self.log_path = self.workdir / "cri-dockerd.log"
        self.pause_image = pause_image
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    def command(self) -> list[str]:
        return ["unshare", "--pid", "--fork", "--mount-proc", str(CRI_DOCKERD),
                "--docker-endpoint", f"unix://{self.docker_endpoint}",
                "--container-runtime-endpoint", f"unix://{self.endpoint}",
                "--cri-dockerd-root-directory", str(self.root),
                "--pod-infra-container-image", self.pause_image,
                "--network-plugin", "cni", "--cni-conf-dir", str(self.cni_conf_dir),
                "--cni-bin-dir", str(self.cni_bin_dir), "--cni-cache-dir", str(self.cni_cache_dir),
                "--streaming-bind-addr", "127.0.0.1:0"]

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 60.0) -> CriDockerd:
        docker_binaries_present()
        for directory in (self.root, self.cni_conf_dir, self.cni_bin_dir, self.cni_cache_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_cri_ready(self.endpoint, timeout, alive=lambda: self.running)
        except Exception as err:
            self.stop()
            raise RuntimeError(f"cri-dockerd did not serve CRI: {err}\n--- {self.log_path} tail ---\n"
                               f"{self.log_tail()}") from err
        return self

    def _child(self) -> int | None:
        """cri-dockerd's pid as the host sees it: the child of ``unshare``."""
        if self._proc is None:
            return None
        try:
            children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def stop(self) -> None:
        child = self._child()
        if child is not None:
            try:
                os.kill(child, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                if child is not None:
                    _kill([child])
                stop_process(self._proc, timeout=5, sig=signal.SIGKILL)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        Path(self.endpoint).unlink(missing_ok=True)

    def client(self, on_pod_created: Callable[[str], None] | None = None) -> KubeletClient:
        return DockerKubeletClient(self.endpoint, on_pod_created=on_pod_created, log_root=self.workdir / "pod-logs")

    def crictl(self, *args: str, timeout: float = 60.0,
               input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """Runs crictl against this cri-dockerd; the caller checks the return code."""
        return subprocess.run([str(CRICTL), "--runtime-endpoint", f"unix://{self.endpoint}",
                               "--image-endpoint", f"unix://{self.endpoint}", "--timeout", "60s", *args],
                              input=input, capture_output=True, timeout=timeout)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> CriDockerd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""A private containerd for e2e tests, with cleanup that survives failed tests.

Everything containerd owns lives under one work dir (root, state, sockets, opt,
runc root, CNI dirs), so several sessions can run side by side with the node's
own containerd. The exceptions are cgroups: pods use kubelet's layout
(``/kubepods/<qos>/pod<uid>``) because koordlet's plugins read exactly that, so
cleanup removes only the pod dirs of pods that went through this instance.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import grpc

from koord_testing.cgroups import hierarchies, pod_dir, remove_tree
from koord_testing.image import DEFAULT_REF, build_pause_image
from koord_testing.kubelet import KubeletClient, cri_modules, grpc_target
from koord_testing.processes import stop_process
from koord_testing.runtimes import ContainerdRuntime, system_runtime
from koord_testing.wait import scaled, wait_for

log = logging.getLogger(__name__)

REQUIRED_BINARIES = ("containerd", "ctr", "runc", "containerd-shim-runc-v2", "gcc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_MNT_DETACH = 2


def containerd_binaries_present() -> None:
    """Raises naming every missing tool: a missing runtime is a broken test setup, not a skip."""
    missing = [name for name in REQUIRED_BINARIES if shutil.which(name) is None]
    if missing:
        raise RuntimeError(
            f"e2e tests need {', '.join(missing)} on PATH (Debian packages: containerd, runc, gcc)"
        )


def wait_cri_ready(endpoint: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Polls CRI Version every 50 ms until it answers; raises TimeoutError otherwise."""
    pb, grpc_mod = cri_modules("v1")
    timeout = scaled(timeout)
    end = time.monotonic() + timeout
    last: Exception | None = None
    with grpc.insecure_channel(grpc_target(endpoint)) as channel:
        stub = grpc_mod.RuntimeServiceStub(channel)
        while time.monotonic() < end:
            if not alive():
                raise RuntimeError(f"process serving {endpoint} exited before CRI answered")
            if os.path.exists(endpoint):
                try:
                    stub.Version(pb.VersionRequest(), timeout=1.0)
                    return
                except grpc.RpcError as err:
                    last = err
            time.sleep(0.05)
    raise TimeoutError(f"CRI at {endpoint} did not answer Version within {timeout}s: {last}")


def _unescape_mountinfo(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and i + 4 <= len(field):
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below ``directory`` in mount order."""
    prefix = str(directory).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mount_point = _unescape_mountinfo(line.split()[4])
            if mount_point == prefix or mount_point.startswith(prefix + "/"):
                found.append(mount_point)
    return found


def unmount_all(directory: Path) -> list[str]:
    """Unmounts everything under ``directory``, newest first, lazily if busy; returns failures."""
    libc = ctypes.CDLL(None, use_errno=True)
    failures = []
    for mount_point in reversed(mounts_under(directory)):
        path = mount_point.encode()
        if libc.umount2(path, 0) == 0:
            continue
        if libc.umount2(path, _MNT_DETACH) != 0:
            failures.append(f"{mount_point}: {os.strerror(ctypes.get_errno())}")
    return failures


def _processes_mentioning(needle: str) -> list[int]:
    """PIDs whose command line contains ``needle`` (our shims carry our socket path)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in cmdline:
            pids.append(int(entry))
    return pids


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (PID 1 here may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _cgroup_pids(cgroup_dir: Path) -> list[int]:
    pids: list[int] = []
    for procs in cgroup_dir.rglob("cgroup.procs"):
        try:
            pids.extend(int(p) for p in procs.read_text().split())
        except OSError:
            continue
    return pids


class Containerd:
    """One private containerd + CRI plugin under ``workdir``; a context manager."""

    def __init__(
        self,
        workdir: Path,
        image_ref: str = DEFAULT_REF,
        cgroup_root: Path = CGROUP_ROOT,
        image_cache: Path | None = None,
        cgroup_driver: str = "cgroupfs",
        runtime: ContainerdRuntime | None = None,
    ) -> None:
        """``runtime``: which containerd build runs (default: the one on PATH).
        ``cgroup_driver="systemd"``: containerd's systemd driver, with runc wrapped so that the
        cgroups land where systemd would create them (see ``koord_testing.runc_systemd``);
        pods then need kubelet's systemd parents (``KubeletClient(kube_dir="kubepods.slice")``)."""
        if cgroup_driver not in ("cgroupfs", "systemd"):
            raise ValueError(f"cgroup driver {cgroup_driver!r}: want 'cgroupfs' or 'systemd'")
        self.cgroup_driver = cgroup_driver
        self._runtime = runtime
        self.workdir = Path(workdir).resolve()
        self.root = self.workdir / "root"
        self.state = self.workdir / "state"
        self.endpoint = str(self.workdir / "containerd.sock")
        self.ttrpc_endpoint = str(self.workdir / "containerd.sock.ttrpc")
        self.nri_socket = str(self.workdir / "nri.sock")
        self.opt = self.workdir / "opt"
        self.runc_root = self.state / "runc"
        self.cni_conf_dir = self.workdir / "cni" / "conf"
        self.cni_bin_dir = self.workdir / "cni" / "bin"
        self.config_path = self.workdir / "config.toml"
        self.log_path = self.workdir / "containerd.log"
        self.image = image_ref
        self.image_cache = Path(image_cache) if image_cache else self.workdir / "image"
        self.cgroup_root = Path(cgroup_root)
        self.pod_cgroup_parents: set[str] = set()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: BinaryIO | None = None

    # ---- lifecycle ---------------------------------------------------------

    def config_toml(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{self.root}"
state = "{self.state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{self.endpoint}"

[ttrpc]
  address = "{self.ttrpc_endpoint}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.opt}"

[{cri}]
  sandbox_image = "{self.image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.cni]
  bin_dir = "{self.cni_bin_dir}"
  conf_dir = "{self.cni_conf_dir}"

[{cri}.containerd]
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = {"true" if self.systemd else "false"}
  Root = "{self.runc_root}"
{f'  BinaryName = "{self.runc_wrapper}"' if self.systemd else ""}
{self._nri_toml()}"""

    def _nri_toml(self) -> str:
        """NRI (on by default from containerd 2.0) listens at a node-wide path: a private instance
        keeps its own socket and plugin dirs."""
        if not self.runtime.has_nri:
            return ""
        return f"""
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{self.nri_socket}"
  plugin_path = "{self.workdir / 'nri' / 'plugins'}"
  plugin_config_path = "{self.workdir / 'nri' / 'conf.d'}"
"""

    @property
    def runtime(self) -> ContainerdRuntime:
        """The build given, else the one on PATH (looked up when first needed)."""
        if self._runtime is None:
            self._runtime = system_runtime()
        return self._runtime

    @property
    def systemd(self) -> bool:
        return self.cgroup_driver == "systemd"

    @property
    def runc_wrapper(self) -> Path:
        return self.workdir / "runc-systemd"

    def _write_runc_wrapper(self) -> None:
        real = shutil.which("runc")
        if real is None:
            raise RuntimeError("runc is not on PATH")
        # Only create and run need Python (the bundle's cgroups path is rewritten); every other
        # call only drops --systemd-cgroup, in the shell: the shim bounds runc state and
        # delete with deadlines that a Python start-up under emulation (seconds) overran,
        # which left stopped containers undeletable.
        self.runc_wrapper.write_text(
            "#!/bin/sh\n"
            f'case " $* " in *" create "*|*" run "*)\n'
            f'  exec {sys.executable} -m koord_testing.runc_systemd {real} "$@";;\nesac\n'
            'for arg do shift; [ "$arg" = --systemd-cgroup ] || set -- "$@" "$arg"; done\n'
            f'exec {real} "$@"\n')
        self.runc_wrapper.chmod(0o755)

    def start(self, timeout: float = 30.0) -> Containerd:
        """Starts containerd, waits for CRI and imports the test image (idempotent image build)."""
        containerd_binaries_present()
        for directory in (self.root, self.state, self.opt, self.runc_root, self.cni_conf_dir, self.cni_bin_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if self.systemd:
            self._write_runc_wrapper()
        self.config_path.write_text(self.config_toml())
        self._spawn(timeout)
        self.reimport_image()
        return self

    def reimport_image(self) -> None:
        """Imports the test image (again): tests that delete images restore it with this."""
        self.import_image(build_pause_image(self.image_cache, self.image))
        self._wait_image_in_cri()

    def _wait_image_in_cri(self, timeout: float = 30.0) -> None:
        """Returns once CRI knows the image: containerd 2.x's CRI learns of an import from an
        event, a moment after ``ctr`` returns, and a sandbox started before then tries to pull
        its image from the network (seen in the emulated v2 lane)."""
        pb, _ = cri_modules("v1")
        with KubeletClient(self.endpoint, log_root=self.workdir / "pod-logs") as client:
            wait_for(lambda: client.image.ImageStatus(
                pb.ImageStatusRequest(image=pb.ImageSpec(image=self.image)), timeout=10).HasField("image"),
                f"CRI at {self.endpoint} to list the imported image {self.image}", timeout,
                tolerate=(grpc.RpcError,))

    def import_image(self, archive: Path) -> None:
        proc = subprocess.run(
            [self.runtime.binary("ctr"), "--address", self.endpoint, "-n", "k8s.io", "images", "import", str(archive)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ctr images import {archive} failed: {proc.stderr.strip()}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop_daemon(self) -> None:
        """Stops only the containerd process (pods and shims stay): a backend outage."""
        if self._proc is None:
            return
        stop_process(self._proc, timeout=10)
        self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def restart_daemon(self, timeout: float = 30.0) -> None:
        """Starts containerd again on the same sockets and state after ``stop_daemon``."""
        self.stop_daemon()
        self._spawn(timeout)

    def _spawn(self, timeout: float) -> None:
        self._log_file = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            [self.runtime.binary("containerd"), "--config", str(self.config_path), "--log-level", "info"],
            env=self.runtime.env(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_cri_ready(self.endpoint, timeout, alive=lambda: self.running)
        except Exception as err:
            raise RuntimeError(
                f"containerd did not start: {err}\n--- {self.log_path} tail ---\n{self.log_tail()}"
            ) from err

    def stop(self) -> None:
        """Tears everything down; safe after any failure and safe to call twice."""
        problems: list[str] = []
        if self.running:
            problems += self._remove_all_pods()
        self.stop_daemon()
        problems += self._kill_leftovers()
        problems += unmount_all(self.workdir)
        problems += self._remove_pod_cgroups()
        for directory in (self.state, self.root):
            if not mounts_under(directory):
                shutil.rmtree(directory, ignore_errors=True)
        if problems:
            log.warning("containerd cleanup under %s left: %s", self.workdir, "; ".join(problems))

    def __enter__(self) -> Containerd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- helpers for tests ---------------------------------------------------

    def track_pod_cgroup(self, cgroup_parent: str) -> None:
        """Remembers a pod cgroup to remove at ``stop`` (passed to KubeletClient as on_pod_created)."""
        self.pod_cgroup_parents.add(cgroup_parent)

    def client(self, version: str = "v1", log_root: Path | None = None) -> KubeletClient:
        """A kubelet-like client to this containerd whose pods are cleaned up by ``stop``."""
        return KubeletClient(
            self.endpoint, version, on_pod_created=self.track_pod_cgroup, log_root=log_root or self.workdir / "pod-logs"
        )


    def remove_pods_of(self, client: KubeletClient) -> None:
        """Removes a client's pods straight at containerd, so a broken proxy can't leak them."""
        with self.client() as direct:
            direct.pods = list(client.pods)
            direct.sandbox_configs = dict(client.sandbox_configs)
            errors = direct.cleanup()
        client.close()
        if errors:
            print("pod cleanup errors:", *errors, sep="\n  ")
            print(f"--- {self.log_path} tail ---\n{self.log_tail(60)}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ---- cleanup steps ---------------------------------------------------------

    def _remove_all_pods(self) -> list[str]:
        problems = []
        with KubeletClient(self.endpoint, log_root=self.workdir / "pod-logs") as cri:
            try:
                pods = cri.runtime.ListPodSandbox(cri.pb.ListPodSandboxRequest(), timeout=30).items
            except grpc.RpcError as err:
                return [f"ListPodSandbox: {err.code().name}: {err.details()}"]
            for pod in pods:
                self._remember_pod_cgroup(cri, pod.id)
                cri.pods.append(pod.id)
            problems += cri.cleanup()
        return problems

    def _remember_pod_cgroup(self, cri: KubeletClient, sandbox_id: str) -> None:
        # Pods created by clients that were not wired to track_pod_cgroup still get cleaned.
        try:
            info = cri.pod_status(sandbox_id, verbose=True, timeout=10).info.get("info", "{}")
            parent = json.loads(info).get("config", {}).get("linux", {}).get("cgroup_parent", "")
        except (grpc.RpcError, ValueError):
            return
        if parent:
            self.pod_cgroup_parents.add(parent)

    def _kill_leftovers(self) -> list[str]:
        """Kills our shims and every process left in containers runc still knows about."""
        container_pids: list[int] = []
        for state_file in self.runc_root.glob("*/*/state.json"):
            try:
                state = json.loads(state_file.read_text())
            except (OSError, ValueError):
                continue
            # The cgroups, not init_process_pid: a stale pid may belong to someone else by now.
            for path in state.get("cgroup_paths", {}).values():
                container_pids += _cgroup_pids(Path(path))
        for parent in self.pod_cgroup_parents:
            for hierarchy in hierarchies(self.cgroup_root):
                container_pids += _cgroup_pids(hierarchy / pod_dir(parent))
        _kill(container_pids)
        shims = _processes_mentioning(f"{self.workdir}/")
        _kill(shims)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in shims):
            time.sleep(0.05)
        return [f"pid {p} still alive" for p in shims if _alive(p)]

    def _remove_pod_cgroups(self) -> list[str]:
        problems = []
        for parent in sorted(self.pod_cgroup_parents):
            problems += remove_tree(pod_dir(parent), self.cgroup_root)
            # QoS and kubepods dirs are shared with other sessions: removed only when empty.
            for hierarchy in hierarchies(self.cgroup_root):
                for shared in (hierarchy / pod_dir(parent)).parents:
                    if shared == hierarchy:
                        break
                    try:
                        shared.rmdir()
                    except OSError:
                        break
        return problems

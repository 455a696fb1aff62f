"""The HAProxy data plane: HAProxy serves kubelet's socket, Python serves only the hooked calls.

grpc-python costs about a millisecond of latency and CPU per proxied call whatever the
tuning; HAProxy forwards a call for a tenth of that.  So HAProxy owns the public socket and
routes each HTTP/2 stream by its ``:path``: the lifecycle paths the CRI server intercepts go
to the Python server on an internal socket, everything else (lists, status, stats, exec,
event streams, images, methods nobody knows yet) goes straight to the backend.

The Python process supervises: it renders the configuration from its own flags, starts
HAProxy as a child that the kernel kills when Python dies, restarts it with backoff when it
dies, and stops it first on shutdown.  Every setting in ``render_config`` answers a failure
seen with real clients; the comments there say which.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import signal
import socket
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .config import DataPlane

log = logging.getLogger(__name__)

INTERNAL_ROOT = Path("/run/koord-runtimeproxy")
"""Where internal directories live: root-owned, so no other user can pre-create them, and short,
because a unix socket path must fit in 107 bytes."""

MAX_STREAMS = 10000
"""kubelet multiplexes every call on one connection; HAProxy's default of 100 streams queues the rest."""

WINDOW_BYTES = 1 << 20
"""HTTP/2 flow-control window: the 64 KiB default doubles the time of an 8 MiB ListContainers."""

IDLE_TIMEOUT = "24h"
"""A quiet GetContainerEvents stream and a StopContainer with a long grace period must never be cut."""

HARD_STOP_AFTER = 10.0
"""A soft stop waits for every open stream; an event stream would hold it forever."""

STOP_KILL_AFTER = HARD_STOP_AFTER + 2.0
"""SIGKILL if HAProxy has not exited this long after its soft stop began."""

RESTART_BACKOFF = (0.1, 5.0)
"""First and longest wait before restarting a dead HAProxy; the wait doubles while it keeps dying."""

STABLE_SECONDS = 30.0
"""A HAProxy that ran this long is healthy again: the next restart waits the shortest time."""

READY_TIMEOUT = 10.0

_PR_SET_PDEATHSIG = 1

# gRPC status codes the errorfiles answer with.
_UNAVAILABLE = 14
_DEADLINE_EXCEEDED = 4


class DataPlaneError(RuntimeError):
    """HAProxy could not be started; the message says why."""


def choose(requested: DataPlane,
           which: Callable[[str], str | None] = shutil.which) -> tuple[DataPlane, str, str | None]:
    """The data plane to run, why (for the one log line), and the haproxy binary if that is it."""
    binary = which("haproxy")
    if requested is DataPlane.PYTHON:
        return DataPlane.PYTHON, "--data-plane=python", None
    if binary is not None:
        why = "--data-plane=haproxy" if requested is DataPlane.HAPROXY else "--data-plane=auto and haproxy is installed"
        return DataPlane.HAPROXY, f"{why} ({binary})", binary
    if requested is DataPlane.HAPROXY:
        raise DataPlaneError("--data-plane=haproxy: no haproxy binary on PATH; install the haproxy package "
                             "or use --data-plane=python")
    return DataPlane.PYTHON, "--data-plane=auto and no haproxy binary on PATH (install the haproxy package)", None


@dataclass(frozen=True)
class Layout:
    """The files of one HAProxy data plane, all in a 0700 directory private to one public socket."""

    directory: Path

    @classmethod
    def for_public_socket(cls, public: str, root: Path = INTERNAL_ROOT) -> Layout:
        """Named after the public socket, so the next start of the same proxy finds and replaces it."""
        digest = hashlib.sha256(os.path.abspath(public).encode()).hexdigest()[:16]
        return cls(root / digest)

    @property
    def hooked_socket(self) -> Path:
        return self.directory / "hooked.sock"

    @property
    def stats_socket(self) -> Path:
        return self.directory / "stats.sock"

    @property
    def config(self) -> Path:
        return self.directory / "haproxy.cfg"

    def errorfile(self, backend: str, status: int) -> Path:
        return self.directory / f"{backend}-{status}.http"

    def prepare(self) -> None:
        """A fresh private directory: whatever a killed run left there is removed."""
        self.directory.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        try:
            st = self.directory.lstat()
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                raise DataPlaneError(f"{self.directory} exists and is not a directory owned by us; refusing to use it")
            shutil.rmtree(self.directory)
        self.directory.mkdir(mode=0o700)
        os.chmod(self.directory, 0o700)  # mkdir's mode is masked by the umask

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass(frozen=True)
class Routes:
    """Where HAProxy sends calls: the public socket it serves, and its three upstreams."""

    public_socket: str
    hooked_paths: Sequence[str]
    runtime_endpoint: str
    image_endpoint: str


_BACKEND_NAMES = {"hooks": "the proxy's hook server", "runtime": "the runtime service", "image": "the image service"}


def errorfile_text(status: int, message: str) -> str:
    """A gRPC-shaped answer for an HTTP error of HAProxy's own: a client must see a gRPC status, never HTTP 503.

    HTTP 200 with ``grpc-status`` in the headers is gRPC's Trailers-Only response.
    """
    code = _DEADLINE_EXCEEDED if status == 504 else _UNAVAILABLE
    safe = "".join(c if 0x20 <= ord(c) < 0x7f and c != "%" else "?" for c in message)
    return ("HTTP/1.1 200 OK\r\n"
            "content-type: application/grpc\r\n"
            f"grpc-status: {code}\r\n"
            f"grpc-message: {safe}\r\n"
            "content-length: 0\r\n"
            "\r\n")


def render_config(routes: Routes, layout: Layout) -> str:
    """HAProxy's configuration for ``routes``."""
    for path in routes.hooked_paths:
        if not path.startswith("/") or any(c.isspace() or c in "#\\'\"" for c in path):
            raise ValueError(f"hooked path {path!r} cannot be written into an HAProxy configuration")
    for endpoint in (routes.public_socket, routes.runtime_endpoint, routes.image_endpoint):
        if any(c.isspace() or c in "#\\'\"" for c in endpoint):
            raise ValueError(f"socket path {endpoint!r} cannot be written into an HAProxy configuration")
    servers = {"hooks": str(layout.hooked_socket), "runtime": routes.runtime_endpoint, "image": routes.image_endpoint}
    lines = [
        "# Written by koord-runtime-proxy at every start from its flags; edits are lost.",
        "global",
        f"    hard-stop-after {HARD_STOP_AFTER:.0f}s",
        "    maxconn 4096",
        f"    tune.h2.max-concurrent-streams {MAX_STREAMS}",
        f"    tune.h2.initial-window-size {WINDOW_BYTES}",
        # level operator: below it `show table` hides the per-path counts.
        f"    stats socket {layout.stats_socket} mode 600 level operator",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 1s",
        # Connection failures are retried twice (a second apart at most), then the errorfile answers.
        "    retries 2",
        f"    timeout client {IDLE_TIMEOUT}",
        f"    timeout server {IDLE_TIMEOUT}",
        f"    timeout tunnel {IDLE_TIMEOUT}",
        f"    timeout http-keep-alive {IDLE_TIMEOUT}",
        "",
        "frontend cri",
        f"    bind unix@{routes.public_socket} mode 660 proto h2",
        # grpc-go before 1.57 (old kubelets, crictl 1.26) sends the socket path as :authority, which
        # makes the URI http:///path.sock/<service>/<method>; keep only the service and method.
        "    http-request set-uri http://localhost/%[path,field(-2,/)]/%[path,field(-1,/)]"
        " if { req.hdr(host) -m beg / }",
        "    http-request track-sc0 path table paths",
        "    acl hooked path " + " ".join(routes.hooked_paths),
        "    acl image path_beg /runtime.v1.ImageService/ /runtime.v1alpha2.ImageService/",
        "    use_backend hooks if hooked",
        "    use_backend image if image",
        "    default_backend runtime",
        "",
        # Per-path request counts for /metrics; least recently used paths are dropped when full.
        "backend paths",
        "    stick-table type string len 128 size 1k store http_req_cnt",
    ]
    for name, server in servers.items():
        lines += ["", f"backend {name}", "    http-reuse always",
                  f"    server {name} unix@{server} proto h2"]
        lines += [f"    errorfile {status} {layout.errorfile(name, status)}" for status in (502, 503, 504)]
    return "\n".join(lines) + "\n"


def write_config(routes: Routes, layout: Layout) -> None:
    for name, what in _BACKEND_NAMES.items():
        for status in (502, 503, 504):
            reason = "timed out" if status == 504 else "unavailable"
            layout.errorfile(name, status).write_text(
                errorfile_text(status, f"koord-runtime-proxy: {what} is {reason} (HTTP {status} from HAProxy)"))
    layout.config.write_text(render_config(routes, layout))


def _libc_prctl() -> Callable[..., int]:
    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


class Supervisor:
    """Runs HAProxy as a child of this process, restarts it when it dies, stops it on request.

    The child gets PR_SET_PDEATHSIG=SIGKILL, so a Python side killed with SIGKILL takes
    HAProxy with it: no orphan keeps serving a socket whose hooked calls nobody answers.
    """

    def __init__(self, binary: str, layout: Layout, public_socket: str,
                 on_restart: Callable[[], None] = lambda: None) -> None:
        self.binary = binary
        self.layout = layout
        self.public_socket = public_socket
        self._on_restart = on_restart
        self._proc: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self._prctl = _libc_prctl()  # resolved here: the child must not load libraries between fork and exec

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def command(self) -> list[str]:
        return [self.binary, "-db", "-f", str(self.layout.config)]

    def _in_child(self) -> None:
        parent = os.getppid()
        self._prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    async def start(self) -> None:
        """Starts HAProxy and returns once it serves the public socket; DataPlaneError if it cannot."""
        await self._spawn()
        self._watcher = asyncio.create_task(self._watch(), name="haproxy-supervisor")

    async def _spawn(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self.command(), stdin=asyncio.subprocess.DEVNULL, preexec_fn=self._in_child, process_group=0)
        deadline = time.monotonic() + READY_TIMEOUT
        while not _accepts(self.public_socket):
            if self._proc.returncode is not None:
                raise DataPlaneError(f"haproxy exited with code {self._proc.returncode} before serving "
                                     f"{self.public_socket} (its messages are in this log; config "
                                     f"{self.layout.config})")
            if time.monotonic() > deadline:
                self._proc.kill()
                await self._proc.wait()
                raise DataPlaneError(f"haproxy did not serve {self.public_socket} within {READY_TIMEOUT:.0f}s")
            await asyncio.sleep(0.01)
        log.info("haproxy (pid %d) serves %s", self._proc.pid, self.public_socket)

    async def _watch(self) -> None:
        delay = RESTART_BACKOFF[0]
        while True:
            assert self._proc is not None
            started = time.monotonic()
            code = await self._proc.wait()
            if self._stopping:
                return
            if time.monotonic() - started >= STABLE_SECONDS:
                delay = RESTART_BACKOFF[0]
            log.error("haproxy (pid %d) exited with code %d; restarting it in %.1fs", self._proc.pid, code, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_BACKOFF[1])
            try:
                await self._spawn()
            except (DataPlaneError, OSError) as exc:
                log.error("restarting haproxy failed: %s", exc)
            self._on_restart()

    async def stop(self) -> None:
        """Soft stop (no new connections, in-flight calls finish) bounded by hard-stop-after, then SIGKILL."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGUSR1)
        try:
            await asyncio.wait_for(proc.wait(), STOP_KILL_AFTER)
        except TimeoutError:
            log.warning("haproxy (pid %d) ignored its hard-stop-after; killing it", proc.pid)
            proc.kill()
            await proc.wait()
        log.info("haproxy stopped (code %s)", proc.returncode)


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


# ------------------------------------------------------------ metrics from HAProxy's stats socket

STATS_TIMEOUT = 1.0
MAX_STATS_BYTES = 4 << 20


def stats_command(path: Path, command: str) -> str:
    """One command on HAProxy's stats socket; its whole answer, bounded."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(STATS_TIMEOUT)
        s.connect(str(path))
        s.sendall(command.encode() + b"\n")
        chunks, size = [], 0
        while chunk := s.recv(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_STATS_BYTES:
                raise ValueError(f"haproxy's answer to {command!r} exceeds {MAX_STATS_BYTES} bytes")
    return b"".join(chunks).decode("utf-8", "replace")


def parse_path_counts(text: str) -> Iterator[tuple[str, int]]:
    """(path, requests) from ``show table paths``: lines like ``0x..: key=/a/B use=0 exp=0 http_req_cnt=3``."""
    for line in text.splitlines():
        if " key=" not in line:
            continue
        fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
        with contextlib.suppress(KeyError, ValueError):
            yield fields["key"], int(fields["http_req_cnt"])


def parse_backend_stats(text: str) -> Iterator[dict[str, str]]:
    """The BACKEND rows of ``show stat`` (CSV whose header line starts with ``# ``)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        return
    header = lines[0][2:].split(",")
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("svname") == "BACKEND" and row.get("pxname") in _BACKEND_NAMES:
            yield row


class HAProxyCollector(Collector):
    """Folds HAProxy's counters into the proxy's /metrics at scrape time.

    HAProxy sees HTTP, not gRPC: it knows each call's path and its backend's timings, not
    its gRPC status code (a trailer).  So pass-through calls are counted per path, and
    their durations are HAProxy's per-backend averages over the last 1024 calls.
    """

    def __init__(self, layout: Layout, restarts: Callable[[], int]) -> None:
        self.layout = layout
        self.restarts = restarts

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        restarts = CounterMetricFamily("koord_runtime_proxy_haproxy_restarts",
                                       "Times the supervisor restarted a dead HAProxy.")
        restarts.add_metric([], self.restarts())
        yield restarts
        up = GaugeMetricFamily("koord_runtime_proxy_haproxy_up", "1 when HAProxy's stats socket answered this scrape.")
        try:
            table = stats_command(self.layout.stats_socket, "show table paths")
            stat_csv = stats_command(self.layout.stats_socket, "show stat")
        except (OSError, ValueError) as exc:
            log.debug("haproxy stats socket: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        paths = CounterMetricFamily(
            "koord_runtime_proxy_haproxy_requests",
            "CRI calls HAProxy received, by method path (hooked ones included); any gRPC status.",
            labels=["method"])
        for path, count in parse_path_counts(table):
            paths.add_metric([path.lstrip("/")], count)
        yield paths
        requests = CounterMetricFamily("koord_runtime_proxy_haproxy_backend_requests",
                                       "Calls HAProxy sent to each backend (hooks, runtime, image).",
                                       labels=["backend"])
        average = GaugeMetricFamily("koord_runtime_proxy_haproxy_backend_average_seconds",
                                    "Average duration of a backend's last 1024 calls, as HAProxy measured it.",
                                    labels=["backend"])
        errors = CounterMetricFamily("koord_runtime_proxy_haproxy_backend_connection_errors",
                                     "Connections HAProxy failed to open to each backend (each answered UNAVAILABLE).",
                                     labels=["backend"])
        for row in parse_backend_stats(stat_csv):
            with contextlib.suppress(ValueError):
                requests.add_metric([row["pxname"]], int(row.get("req_tot") or 0))
                average.add_metric([row["pxname"]], int(row.get("ttime") or 0) / 1000.0)
                errors.add_metric([row["pxname"]], int(row.get("econ") or 0))
        yield requests
        yield average
        yield errors

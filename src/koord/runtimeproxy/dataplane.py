"""The HAProxy data plane: HAProxy serves kubelet's socket, Python serves only the hooked calls.

grpc-python costs about a millisecond of latency and CPU per proxied call whatever the
tuning; HAProxy forwards a call for a tenth of that.  So HAProxy owns the public socket and
routes each HTTP/2 stream by its ``:path``: the lifecycle paths the CRI server intercepts and
the event streams (see ``criserver.python_paths``) go to the Python server on an internal
socket, everything else (lists, status, stats, exec, images, methods nobody knows yet) goes
straight to the backend.

The Python process supervises: it renders the configuration from its own flags, starts
HAProxy as a child that the kernel kills when Python dies, restarts it with backoff when it
dies, and stops it first on shutdown.  Every setting in ``render_config`` answers a failure
seen with real clients; the comments there say which.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
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

from .config import DEFAULT_DATA_PLANE_IDLE_TIMEOUT, DEFAULT_DATA_PLANE_START_TIMEOUT, DataPlane
from .haproxylog import relay_haproxy_output

log = logging.getLogger(__name__)

INTERNAL_ROOT = Path("/run/koord-runtimeproxy")
"""Where internal directories live: root-owned, so no other user can pre-create them, and short,
because a unix socket path must fit in 107 bytes."""

MAX_STREAMS = 10000
"""kubelet multiplexes every call on one connection; HAProxy's default of 100 streams queues the rest."""

WINDOW_BYTES = 1 << 20
"""HTTP/2 flow-control window: the 64 KiB default doubles the time of an 8 MiB ListContainers."""


IDLE_MARGIN = 10.0
"""How much longer than the idle timeout HAProxy keeps an idle stream (see ``render_config``)."""

HARD_STOP_AFTER = 10.0
"""A soft stop waits for every open stream; an event stream would hold it forever."""

STOP_KILL_AFTER = HARD_STOP_AFTER + 2.0
"""SIGKILL if HAProxy has not exited this long after its soft stop began."""

RESTART_BACKOFF = (0.1, 5.0)
"""First and longest wait before restarting a dead HAProxy; the wait doubles while it keeps dying."""

STABLE_SECONDS = 30.0
"""A HAProxy that ran this long is healthy again: the next restart waits the shortest time."""

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

    @property
    def routes_map(self) -> Path:
        return self.directory / "routes.map"

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
    """Where HAProxy sends calls: the public socket it serves, and its three upstreams.

    ``python_paths`` go to the Python server (the hooked calls and the event streams); each of
    the other ``known_paths`` gets a backend of its own (to the runtime or the image service),
    so HAProxy's statistics count and time every CRI method; unknown paths go to the runtime
    or image service by service.
    """

    public_socket: str
    python_paths: Sequence[str]
    known_paths: Sequence[str]
    runtime_endpoint: str
    image_endpoint: str

    def backends(self) -> dict[str, str]:
        """Backend name of every known path: ``hooks``, or the method path in dots (HAProxy's name rules)."""
        hooked = set(self.python_paths)
        return {path: "hooks" if path in hooked else path.strip("/").replace("/", ".")
                for path in sorted(set(self.known_paths) | hooked)}


UPSTREAMS = {"hooks": "the proxy's hook server", "runtime": "the runtime service", "image": "the image service"}
_IMAGE_SERVICES = ("/runtime.v1.ImageService/", "/runtime.v1alpha2.ImageService/")
_UNSAFE = re.compile(r"[\s#\\'\"]")
_BACKEND_NAME = re.compile(r"[A-Za-z0-9_.:-]+")


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


def _check(value: str, what: str) -> str:
    if _UNSAFE.search(value):
        raise ValueError(f"{what} {value!r} cannot be written into an HAProxy configuration")
    return value


def render_map(routes: Routes) -> str:
    """The path -> backend map HAProxy routes by."""
    lines = []
    for path, backend in routes.backends().items():
        if not path.startswith("/") or not _BACKEND_NAME.fullmatch(backend):
            raise ValueError(f"method path {path!r} cannot be written into an HAProxy map")
        lines.append(f"{_check(path, 'method path')} {backend}")
    return "\n".join(lines) + "\n"


def render_config(routes: Routes, layout: Layout, idle_timeout: float = DEFAULT_DATA_PLANE_IDLE_TIMEOUT) -> str:
    """HAProxy's configuration for ``routes``; the map it names is ``render_map``'s.

    ``idle_timeout`` (seconds, ``--data-plane-idle-timeout``) bounds a call or stream that
    carries nothing: a quiet GetContainerEvents stream and a StopContainer with a long grace
    period must not be cut before it. HAProxy waits ``IDLE_MARGIN`` longer, so that the Python
    side ends a quiet stream first, with a gRPC status (HAProxy would close it without one).
    """
    idle = f"{round((idle_timeout + IDLE_MARGIN) * 1000)}ms"
    servers = {"hooks": str(layout.hooked_socket),
               "runtime": _check(routes.runtime_endpoint, "socket path"),
               "image": _check(routes.image_endpoint, "socket path")}
    route = f"path,map_str({layout.routes_map})"
    lines = [
        "# Written by koord-runtime-proxy at every start from its flags; edits are lost.",
        "global",
        f"    hard-stop-after {HARD_STOP_AFTER:.0f}s",
        "    maxconn 4096",
        f"    tune.h2.max-concurrent-streams {MAX_STREAMS}",
        f"    tune.h2.initial-window-size {WINDOW_BYTES}",
        f"    stats socket {layout.stats_socket} mode 600 level user",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 1s",
        # Connection failures are retried twice (a second apart at most), then the errorfile answers.
        "    retries 2",
        f"    timeout client {idle}",
        f"    timeout server {idle}",
        f"    timeout tunnel {idle}",
        f"    timeout http-keep-alive {idle}",
        "",
        "frontend cri",
        f"    bind unix@{_check(routes.public_socket, 'socket path')} mode 660 proto h2",
        # grpc-go before 1.57 (old kubelets, crictl 1.26) sends the socket path as :authority, which
        # makes the URI http:///path.sock/<service>/<method>; keep only the service and method.
        "    http-request set-uri http://localhost/%[path,field(-2,/)]/%[path,field(-1,/)]"
        " if { req.hdr(host) -m beg / }",
        f"    use_backend %[{route}] if {{ {route} -m found }}",
        "    use_backend image if { path_beg " + " ".join(_IMAGE_SERVICES) + " }",
        "    default_backend runtime",
    ]
    for upstream in UPSTREAMS:
        lines += ["", f"http-errors {upstream}-errors"]
        lines += [f"    errorfile {status} {layout.errorfile(upstream, status)}" for status in (502, 503, 504)]
    backends = {name: ("hooks" if name == "hooks" else
                       "image" if path.startswith(_IMAGE_SERVICES) else "runtime")
                for path, name in routes.backends().items()}
    backends.update(runtime="runtime", image="image")
    for name, upstream in backends.items():
        lines += ["", f"backend {name}", "    http-reuse always",
                  f"    server {upstream} unix@{servers[upstream]} proto h2",
                  f"    errorfiles {upstream}-errors"]
    return "\n".join(lines) + "\n"


def write_config(routes: Routes, layout: Layout, idle_timeout: float = DEFAULT_DATA_PLANE_IDLE_TIMEOUT) -> None:
    for name, what in UPSTREAMS.items():
        for status in (502, 503, 504):
            reason = "timed out" if status == 504 else "unavailable"
            layout.errorfile(name, status).write_text(
                errorfile_text(status, f"koord-runtime-proxy: {what} is {reason} (HTTP {status} from HAProxy)"))
    layout.routes_map.write_text(render_map(routes))
    layout.config.write_text(render_config(routes, layout, idle_timeout))


class Supervisor:
    """Runs HAProxy as a child of this process, restarts it when it dies, stops it on request.

    The child gets PR_SET_PDEATHSIG=SIGKILL, so a Python side killed with SIGKILL takes
    HAProxy with it: no orphan keeps serving a socket whose hooked calls nobody answers.
    util-linux's ``setpriv --pdeathsig`` sets it and execs HAProxy, because a Python
    ``preexec_fn`` forces fork() in a process full of grpc threads, whose fork handlers
    then broke grpc's poller and aborted the child now and then; without ``preexec_fn``
    the child is started with vfork and runs no Python at all.
    """

    def __init__(self, binary: str, layout: Layout, public_socket: str,
                 ready_timeout: float = DEFAULT_DATA_PLANE_START_TIMEOUT) -> None:
        self.binary = binary
        self.layout = layout
        self.public_socket = public_socket
        self.ready_timeout = ready_timeout
        self.restarts = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._relay: asyncio.Task[None] | None = None
        self._stopping = False
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise DataPlaneError("no setpriv binary on PATH (util-linux): it ties HAProxy's life to the proxy's")
        self._setpriv = setpriv

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def command(self) -> list[str]:
        return [self._setpriv, "--pdeathsig", "KILL", "--", self.binary, "-db", "-f", str(self.layout.config)]

    async def start(self) -> None:
        """Starts HAProxy and returns once it serves the public socket; DataPlaneError if it cannot."""
        await self._spawn()
        self._watcher = asyncio.create_task(self._watch(), name="haproxy-supervisor")

    async def _spawn(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self.command(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        assert self._proc.stdout is not None
        self._relay = asyncio.create_task(relay_haproxy_output(self._proc.stdout), name="haproxy-output")
        deadline = time.monotonic() + self.ready_timeout
        while not _accepts(self.public_socket):
            if self._proc.returncode is not None:
                raise DataPlaneError(f"haproxy exited with code {self._proc.returncode} before serving "
                                     f"{self.public_socket} (its messages are in this log; config "
                                     f"{self.layout.config})")
            if time.monotonic() > deadline:
                self._proc.kill()
                await self._proc.wait()
                raise DataPlaneError(f"haproxy did not serve {self.public_socket} within {self.ready_timeout:g}s "
                                     "(--data-plane-start-timeout)")
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
            self.restarts += 1

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
        if self._relay is not None:
            await self._relay  # its last lines (the proxies it stopped) before the line below
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


def parse_backend_stats(text: str) -> Iterator[dict[str, str]]:
    """The BACKEND rows of ``show stat`` (CSV whose header line starts with ``# ``)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        return
    header = lines[0][2:].split(",")
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("svname") == "BACKEND":
            yield row


def method_labels(routes: Routes) -> dict[str, str]:
    """The ``method`` label of each backend: the method path, or what the catch-all backends carry."""
    labels = {name: path.lstrip("/") for path, name in routes.backends().items() if name != "hooks"}
    labels.update(hooks="hooked methods (Python)", runtime="unknown methods (runtime service)",
                  image="unknown methods (image service)")
    return labels


class HAProxyCollector(Collector):
    """Folds HAProxy's per-backend statistics into the proxy's /metrics at scrape time.

    Every pass-through CRI method has a backend of its own, so these are per method.
    HAProxy sees HTTP, not gRPC: it cannot tell a call's gRPC status code (a trailer), and
    it keeps an average duration of each backend's last 1024 calls, not a histogram.
    """

    def __init__(self, layout: Layout, routes: Routes, restarts: Callable[[], int]) -> None:
        self.layout = layout
        self.labels = method_labels(routes)
        self.restarts = restarts

    @staticmethod
    def describe() -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Every family, empty: what the proxy's metrics documentation lists (no stats read)."""
        yield CounterMetricFamily("koord_runtime_proxy_haproxy_restarts",
                                  "Times the supervisor restarted a dead HAProxy.")
        yield GaugeMetricFamily("koord_runtime_proxy_haproxy_up", "1 when HAProxy's stats socket answered this scrape.")
        yield CounterMetricFamily(
            "koord_runtime_proxy_haproxy_requests",
            "CRI calls through HAProxy by method (any gRPC status; hooked ones are counted together "
            "here and per method by koord_runtime_proxy_cri_requests_total).", labels=["method"])
        yield GaugeMetricFamily(
            "koord_runtime_proxy_haproxy_average_duration_seconds",
            "Average duration of the method's last 1024 calls through HAProxy.", labels=["method"])
        yield CounterMetricFamily(
            "koord_runtime_proxy_haproxy_connection_errors",
            "Connections HAProxy failed to open for the method (each call answered UNAVAILABLE).", labels=["method"])

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        restarts, up, requests, average, errors = self.describe()
        restarts.add_metric([], self.restarts())
        yield restarts
        try:
            stat_csv = stats_command(self.layout.stats_socket, "show stat")
        except (OSError, ValueError) as exc:
            log.debug("haproxy stats socket: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for row in parse_backend_stats(stat_csv):
            label = self.labels.get(row.get("pxname", ""))
            if label is None:
                continue
            with contextlib.suppress(ValueError):
                total = int(row.get("req_tot") or 0)
                mean = int(row.get("ttime") or 0) / 1000.0
                failed = int(row.get("econ") or 0)
                requests.add_metric([label], total)
                average.add_metric([label], mean)
                errors.add_metric([label], failed)
        yield requests
        yield average
        yield errors

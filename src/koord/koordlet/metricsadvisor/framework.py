"""What every collector shares: paths, the pod source, the metric cache, the latest node
and pod totals (for the system collector), counters for rates, and log-once problems."""

from __future__ import annotations

import logging
import posixpath
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..metriccache import MetricCache, Sample
from ..resourceexecutor.executor import MAX_CACHED_PATHS, CgroupError, CgroupExecutor
from ..resources import KubeQoS
from ..statesinformer.meta import CGROUPFS, SYSTEMD, ContainerMeta, PodMeta, pod_cgroup_dir
from .config import AdvisorConfig
from .openfiles import OpenFiles
from .parsers import SMALL_FILE_BYTES, FileProblem

T = TypeVar("T")


class PodSource(Protocol):
    """The part of the states informer the advisor needs."""

    def get_all_pods(self) -> list[PodMeta]: ...

    def get_node_slo(self) -> Any: ...

    def has_synced(self) -> bool: ...


class Problems:
    """Logs each distinct problem once, not every tick, and again only after it cleared
    or was not seen for ``forget_after`` seconds (so a fixed-then-broken file is reported)."""

    def __init__(self, logger: logging.Logger, forget_after: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._seen: dict[Hashable, float] = {}
        self._forget_after = forget_after
        self._clock = clock

    def report(self, key: Hashable, message: str, *args: object, level: int = logging.WARNING,
               exc_info: bool = False) -> bool:
        """Logs unless ``key`` was reported recently; True when it logged."""
        now = self._clock()
        last = self._seen.get(key)
        self._seen[key] = now
        if last is not None and now - last < self._forget_after:
            return False
        if len(self._seen) > 10_000:  # bounded: drop what has not recurred for a while
            self._seen = {k: t for k, t in self._seen.items() if now - t < self._forget_after}
        self._log.log(level, message, *args, exc_info=exc_info)
        return True

    def clear(self, key: Hashable) -> None:
        self._seen.pop(key, None)


class Rates:
    """Per-second rates of monotonically increasing counters. ``what`` names the counter in a
    log line (a callable is called only then). The first value of a key only primes it; a
    counter that went backwards (a recreated cgroup, a wrapped counter) gives no sample, is
    logged once per key, and primes again; entries not updated for ``ttl`` seconds are
    forgotten, so a pod that comes back starts fresh."""

    def __init__(self, ttl: float, problems: Problems | None = None) -> None:
        self._prev: dict[Hashable, tuple[Any, float]] = {}
        self._ttl = ttl
        self._problems = problems
        self._last_prune = 0.0

    def _backwards(self, key: Hashable, what: str | Callable[[], str], old: object, new: object) -> None:
        if self._problems is not None:
            self._problems.report(("backwards", key), "%s went backwards (%s -> %s); no sample, counting anew",
                                  (what() if callable(what) else what) or key, old, new)

    def rate(self, key: Hashable, value: float, now: float, what: str | Callable[[], str] = "") -> float | None:
        """(value - previous) / (now - previous time); None on the first value of a key."""
        prev = self._prev.get(key)
        self._prev[key] = (value, now)
        if prev is None or now - prev[1] > self._ttl:
            return None
        dv, dt = value - prev[0], now - prev[1]
        if dv < 0:
            self._backwards(key, what, prev[0], value)
            return None
        if dt <= 0:
            return None
        return dv / dt

    def delta(self, key: Hashable, values: tuple[float, ...], now: float,
              what: str | Callable[[], str] = "") -> tuple[float, ...] | None:
        """Differences of several counters read together (e.g. periods and throttled)."""
        prev = self._prev.get(key)
        self._prev[key] = (values, now)
        if prev is None or now - prev[1] > self._ttl:
            return None
        diff = tuple(a - b for a, b in zip(values, prev[0], strict=True))
        if any(d < 0 for d in diff):
            self._backwards(key, what, prev[0], values)
            return None
        return diff

    def prune(self, now: float) -> None:
        if now - self._last_prune < self._ttl:
            return
        self._last_prune = now
        self._prev = {k: v for k, v in self._prev.items() if now - v[1] <= self._ttl}


@dataclass
class Point:
    cpu: float  # cores
    memory: float  # bytes
    timestamp: float


@dataclass
class SharedState:
    """The latest totals, written by node/pod/host-app collectors, read by the system one."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    node: Point | None = None
    pods: dict[str, Point] = field(default_factory=dict)  # by collector name
    host_apps: Point | None = None

    def set_node(self, point: Point) -> None:
        with self.lock:
            self.node = point

    def set_pods(self, collector: str, point: Point) -> None:
        with self.lock:
            self.pods[collector] = point

    def set_host_apps(self, point: Point) -> None:
        with self.lock:
            self.host_apps = point

    def snapshot(self) -> tuple[Point | None, dict[str, Point], Point | None]:
        with self.lock:
            return self.node, dict(self.pods), self.host_apps


class Env:
    """Everything a collector needs, built once by the advisor."""

    def __init__(self, config: AdvisorConfig, pods: PodSource, cache: MetricCache,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.pods = pods
        self.cache = cache
        self.clock = clock
        self.cgroups = CgroupExecutor(config.cgroup_root, driver=config.cgroup_driver)
        self.shared = SharedState()
        self.files = OpenFiles()
        self._file_names: dict[tuple[str, str], str] = {}

    @property
    def proc(self) -> Path:
        return self.config.proc_root

    @property
    def sys(self) -> Path:
        return self.config.sys_root

    def cgroup_file(self, cgroup_dir: str, resource: str) -> Path:
        try:
            return self.cgroups.path(cgroup_dir, resource)  # resolved once, cached there
        except CgroupError as exc:
            raise FileProblem(Path(self.config.cgroup_root) / cgroup_dir, str(exc)) from None

    def all_pods(self) -> list[PodMeta]:
        """The informer's pods (shared, read-only objects)."""
        return self.pods.get_all_pods()

    def read_cgroup(self, cgroup_dir: str, resource: str, parser: Callable[[str], T]) -> T:
        """``parser`` on the text of a cgroup file; FileProblem naming the file when it cannot
        be read or parsed. The hot path of every collector: about 1200 calls a second at 100
        pods, so the file is named by a str looked up once per (dir, resource)."""
        name = self._file_names.get((cgroup_dir, resource))
        if name is None:
            if len(self._file_names) >= MAX_CACHED_PATHS:
                self._file_names.clear()
            name = self._file_names[(cgroup_dir, resource)] = str(self.cgroup_file(cgroup_dir, resource))
        text = self.files.read(name, SMALL_FILE_BYTES)
        try:
            return parser(text)
        except ValueError as exc:
            raise FileProblem(Path(name), str(exc)) from None

    def kube_qos_dir(self, qos: str) -> str:
        """The cgroup dir of a kube QoS class under ``--cgroup-kube-dir``: the parent of any
        pod dir of that class, as the states informer lays pods out (either driver)."""
        driver = self.config.cgroup_driver or (
            SYSTEMD if self.cgroups.kube_qos_dir(KubeQoS.GUARANTEED).endswith(".slice") else CGROUPFS)
        return posixpath.dirname(pod_cgroup_dir(self.config.cgroup_kube_dir, qos, "x", driver))


class Collector:
    """One collector: ``collect`` is one tick and returns the samples to store. It may raise;
    the runner logs and carries on. Per-pod problems are handled inside, per pod."""

    name = "collector"

    def __init__(self, env: Env) -> None:
        self.env = env
        self.problems = Problems(logging.getLogger(f"koordlet.metricsadvisor.{self.name}"))

    @property
    def interval(self) -> float:
        return self.env.config.collect_res_used_interval

    def enabled(self) -> bool:
        return True

    def collect(self, now: float) -> Iterable[Sample]:
        raise NotImplementedError

    def pod_cgroups(self) -> Iterator[tuple[PodMeta, ContainerMeta | None]]:
        """(pod, None) for every running pod with a cgroup dir, then (pod, container) for
        each of its running containers with an id and a cgroup dir."""
        for pod in self.env.all_pods():
            if not pod.running or not pod.cgroup_dir:
                continue
            yield pod, None
            for container in pod.containers:
                if container.running and container.id and container.cgroup_dir:
                    yield pod, container

    @staticmethod
    def who(pod: PodMeta, container: ContainerMeta | None) -> str:
        return f"pod {pod.namespace}/{pod.name}" + (f" container {container.name}" if container else "")

    def pod_problem(self, pod: PodMeta, container: ContainerMeta | None, exc: FileProblem) -> None:
        """One log line per pod (and container), file and reason; a vanished cgroup is normal
        while a pod stops, so it is logged at debug level."""
        level = logging.DEBUG if exc.missing else logging.WARNING
        self.problems.report((pod.uid, container and container.id, str(exc.path), exc.reason),
                             "%s: %s: %s; no sample", self.who(pod, container), exc.path, exc.reason, level=level)

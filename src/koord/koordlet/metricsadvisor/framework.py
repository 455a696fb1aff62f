"""What every collector shares: paths, the pod source and its cgroups, the metric cache, the
latest node and pod totals (for the system collector), counters for rates, and log-once
problems (``koord.logonce``)."""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector as PromCollector

from ...logonce import LogOnce
from ..metriccache import MetricCache, Samples
from ..resourceexecutor.executor import CgroupError, CgroupExecutor
from ..resourceexecutor.pathcache import CgroupFileCache
from ..slo import NodeSLO
from ..statesinformer.meta import ContainerMeta, PodMeta
from .config import AdvisorConfig
from .openfiles import OpenFiles
from .parsers import SMALL_FILE_BYTES, FileProblem

T = TypeVar("T")


class PodSource(Protocol):
    """The part of the states informer the advisor needs."""

    def get_all_pods(self) -> list[PodMeta]: ...

    def get_node_slo(self) -> NodeSLO | None: ...

    def has_synced(self) -> bool: ...


def collector_problems(logger: logging.Logger) -> LogOnce:
    """A collector's log-once problems: a file fixed and broken again unnoticed is said
    again once it was not seen for ten minutes; many files' problems are held at once."""
    return LogOnce(logger, forget_after=600.0, max_keys=10_000)


class Rates:
    """Per-second rates of monotonically increasing counters. ``what`` names the counter's
    owner in a log line (a callable is called only then), ``counter`` the counter. The first
    value of a key only primes it; a counter that went backwards (a recreated cgroup, a
    wrapped counter) gives no sample, is logged once per key, and primes again; entries not
    updated for ``ttl`` seconds are forgotten, so a pod that comes back starts fresh."""

    def __init__(self, ttl: float, problems: LogOnce | None = None, counter: str = "") -> None:
        self._prev: dict[Hashable, tuple[Any, float]] = {}
        self._ttl = ttl
        self._problems = problems
        self._counter = counter
        self._last_prune = 0.0

    def _backwards(self, key: Hashable, what: str | Callable[[], str], old: object, new: object) -> None:
        if self._problems is not None:
            owner = (what() if callable(what) else what) or str(key)
            self._problems.say(("backwards", key), "%s went backwards (%s -> %s); no sample, counting anew",
                                  f"{owner}: {self._counter}" if self._counter else owner, old, new)

    def rate(self, key: Hashable, value: float, now: float, what: str | Callable[[], str] = "") -> float | None:
        """(value - previous) / (now - previous time); None on the first value of a key."""
        return self.rates((key,), (value,), now, (what,))[0]

    def rates(self, keys: Sequence[Hashable], values: Sequence[float], now: float,
              whats: Sequence[str | Callable[[], str]]) -> list[float | None]:
        """``rate`` of each key's counter, in order, in one call: a tick's hundreds of pod
        and container counters cost one call, not one each."""
        prev, ttl = self._prev, self._ttl
        out: list[float | None] = []
        append = out.append
        for key, value, what in zip(keys, values, whats, strict=True):
            last = prev.get(key)
            prev[key] = (value, now)
            if last is None or now - last[1] > ttl:
                append(None)
            elif value < last[0]:
                self._backwards(key, what, last[0], value)
                append(None)
            elif now <= last[1]:
                append(None)
            else:
                append((value - last[0]) / (now - last[1]))
        return out

    def deltas(self, keys: Sequence[Hashable], values: Sequence[tuple[int, int]], now: float,
               whats: Sequence[str | Callable[[], str]]) -> list[tuple[int, int] | None]:
        """The differences of each key's pair of counters read together (e.g. periods and
        throttled) since its previous pair, in order, in one call; None as for ``rate``."""
        prev, ttl = self._prev, self._ttl
        out: list[tuple[int, int] | None] = []
        append = out.append
        for key, (a, b), what in zip(keys, values, whats, strict=True):
            last = prev.get(key)
            prev[key] = ((a, b), now)
            if last is None or now - last[1] > ttl:
                append(None)
                continue
            da, db = a - last[0][0], b - last[0][1]
            if da < 0 or db < 0:
                self._backwards(key, what, last[0], (a, b))
                append(None)
            else:
                append((da, db))
        return out

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


PSIRow = tuple["CgroupTarget", tuple[tuple[str, dict[str, tuple[float, float, float]]], ...]]
"""A pod or container and, per resource (``cpu``, ``mem``, ``io``), its pressure file:
degree -> (avg10, avg60, avg300)."""
HostAppRow = tuple[str, str, str, float, float]
"""(name, priority class, QoS class as NodeSLO spells them, CPU cores, memory bytes)."""


@dataclass
class SharedState:
    """The latest totals, written by node/pod/host-app collectors, read by the system one."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    node: Point | None = None
    pods: dict[str, Point] = field(default_factory=dict)  # by collector name
    host_apps: Point | None = None
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)
    """(what was collected, "succeeded"/"failed") -> times, for upstream's status counters."""
    psi: tuple[PSIRow, ...] = ()
    """The PSI collector's last tick, each pod and container it read; replaced whole (one
    assignment, read without the lock), so a pod that left is gone from the next tick."""
    host_app_usage: tuple[HostAppRow, ...] = ()
    """The host-application collector's last tick, each app with a CPU rate; replaced whole."""

    def count(self, what: str, ok: bool) -> None:
        key = (what, "succeeded" if ok else "failed")
        with self.lock:
            self.outcomes[key] = self.outcomes.get(key, 0) + 1

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


NODE_CPU_INFO, NODE_NUMA_INFO = "node_cpu_info", "node_numa_info"
"""What ``SharedState.count`` counts, the middle of upstream's ``koordlet_collect_<what>_status``."""


class AdvisorMetrics(PromCollector):
    """Upstream's metrics of the advisor's collectors, read from ``SharedState`` at scrape
    time: the real-time node usage (the NodeResource collector's latest tick, nothing before
    its first CPU rate) and how often the node's CPU and NUMA info were collected."""

    def __init__(self, shared: SharedState, node: str) -> None:
        self.shared, self.node = shared, node

    @staticmethod
    def describe() -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Every family, empty."""
        yield GaugeMetricFamily("koordlet_node_used_cpu_cores", "Number of cpu cores used by node in realtime",
                                labels=["node"])
        yield GaugeMetricFamily("koordlet_node_used_memory_bytes", "Memory used by node in realtime",
                                labels=["node"])
        for what, upstream in ((NODE_CPU_INFO, "CPU"), (NODE_NUMA_INFO, "NUMA")):
            yield CounterMetricFamily(f"koordlet_collect_{what}_status",
                                      f"the count of CollectNode{upstream}Info status", labels=["node", "status"])

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        cpu, memory, cpu_info, numa_info = self.describe()
        with self.shared.lock:
            point, outcomes = self.shared.node, dict(self.shared.outcomes)
        if point is not None:
            cpu.add_metric([self.node], point.cpu)
            memory.add_metric([self.node], point.memory)
        for (what, status), times in outcomes.items():
            (cpu_info if what == NODE_CPU_INFO else numa_info).add_metric([self.node, status], times)
        yield from (cpu, memory, cpu_info, numa_info)


@dataclass(frozen=True, slots=True)
class CgroupTarget:
    """A running pod's or container's cgroup, as the pod collectors read it every tick."""

    pod: PodMeta
    container: ContainerMeta | None
    cgroup_dir: str
    id: str
    """The pod's uid or the container's id: its series' label, and its counters' key."""
    who: str
    """"pod ns/name" or "pod ns/name container c", for log lines."""


class PerTarget(Generic[T]):
    """What a collector derives from each target (its series keys), made again only when
    ``Env.pod_targets`` hands out a new list."""

    def __init__(self, make: Callable[[CgroupTarget], T]) -> None:
        self._make = make
        self._held: tuple[list[CgroupTarget], list[T]] = ([], [])

    def __call__(self, targets: list[CgroupTarget]) -> list[T]:
        if self._held[0] is not targets:
            self._held = (targets, [self._make(t) for t in targets])
        return self._held[1]


class Env:
    """Everything a collector needs, built once by the advisor. ``cgroups`` is the agent's
    executor: the advisor only reads, through its layout and file names."""

    def __init__(self, config: AdvisorConfig, pods: PodSource, cache: MetricCache,
                 cgroups: CgroupExecutor, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.pods = pods
        self.cache = cache
        self.clock = clock
        self.cgroups = cgroups
        self.shared = SharedState()
        self.files = OpenFiles()
        self._file_names: CgroupFileCache[tuple[str, str], str] = CgroupFileCache(lambda _, name: name)
        self._targets: tuple[list[PodMeta], list[CgroupTarget]] = ([], [])
        self._names_of: dict[str, tuple[list[CgroupTarget], list[str], dict[int, FileProblem]]] = {}
        self._tick = threading.local()

    @property
    def proc(self) -> Path:
        return self.config.proc_root

    @property
    def sys(self) -> Path:
        return self.config.sys_root

    def cgroup_file(self, cgroup_dir: str, resource: str, keep: bool = True) -> Path:
        """The file's Path (cached by the executor unless ``keep`` is False); FileProblem
        when the resource has no file here."""
        try:
            return self.cgroups.path(cgroup_dir, resource, keep)
        except CgroupError as exc:
            raise FileProblem(self.cgroups.root / cgroup_dir, str(exc)) from None

    def all_pods(self) -> list[PodMeta]:
        """The informer's pods (shared, read-only objects)."""
        return self.pods.get_all_pods()

    def pod_targets(self) -> list[CgroupTarget]:
        """Every running pod with a cgroup dir, each followed by its running containers with
        an id and a cgroup dir. Built again only when the informer's pods changed (it hands
        out the same immutable objects until a sync changes them); the same list otherwise,
        which a collector may key what it derives from the targets by."""
        pods = self.pods.get_all_pods()
        held = self._targets
        if len(held[0]) == len(pods) and all(map(operator.is_, held[0], pods)):
            return held[1]
        targets = []
        for pod in pods:
            if not pod.running or not pod.cgroup_dir:
                continue
            who = f"pod {pod.namespace}/{pod.name}"
            targets.append(CgroupTarget(pod, None, pod.cgroup_dir, pod.uid, who))
            targets.extend(CgroupTarget(pod, c, c.cgroup_dir, c.id, f"{who} container {c.name}")
                           for c in pod.containers if c.running and c.id and c.cgroup_dir)
        self._targets = (pods, targets)  # one assignment: a reader on another thread sees either
        return targets

    def file_name(self, cgroup_dir: str, resource: str) -> str:
        """The path of a cgroup file as a str, looked up once per (dir, resource) (a Path
        hashes in Python code); FileProblem when the resource has no file here."""
        key = (cgroup_dir, resource)
        name = self._file_names.get(key)
        if name is None:
            name = str(self.cgroup_file(cgroup_dir, resource, keep=False))
            self._file_names.put(key, name)
        return name

    def read_cgroup(self, cgroup_dir: str, resource: str, parser: Callable[[str], T]) -> T:
        """``parser`` on the text of a cgroup file; FileProblem naming the file when it cannot
        be read or parsed."""
        name = self.file_name(cgroup_dir, resource)
        text = self.files.read(name, SMALL_FILE_BYTES)
        try:
            return parser(text)
        except ValueError as exc:
            raise FileProblem(Path(name), str(exc)) from None

    def begin_tick(self) -> None:
        """A tick starts on this thread: until ``end_tick``, a file ``read_cgroups`` read for
        one collector is handed to the next one that asks for it (on cgroup v2, CPU time and
        throttling are both in ``cpu.stat``: read once a tick, not twice)."""
        self._tick.reads = {}

    def end_tick(self) -> None:
        self._tick.reads = None

    def _names(self, targets: list[CgroupTarget], resource: str) -> tuple[list[str], dict[int, FileProblem]]:
        """The file of ``resource`` of every target (and the targets without one, by index),
        made again only when ``pod_targets`` hands out a new list."""
        held = self._names_of.get(resource)
        if held is not None and held[0] is targets:
            return held[1], held[2]
        names = []
        problems: dict[int, FileProblem] = {}
        for i, target in enumerate(targets):
            try:
                names.append(self.file_name(target.cgroup_dir, resource))
            except FileProblem as exc:
                problems[i] = exc
        self._names_of[resource] = (targets, names, problems)
        return names, problems

    def read_cgroups(self, targets: list[CgroupTarget], resource: str) -> list[bytes | FileProblem]:
        """One file of every target as read (its bytes) or the FileProblem that stopped it,
        in order: a tick's hundreds of reads in one call (see ``OpenFiles.read_all``)."""
        names, problems = self._names(targets, resource)
        reads = getattr(self._tick, "reads", None)
        if reads is not None and names:
            held = reads.get(names[-1])
            if held is not None and held[0] == names:
                read = held[1]
            else:
                read = self.files.read_all(names, SMALL_FILE_BYTES)
                reads[names[-1]] = (names, read)
        else:
            read = self.files.read_all(names, SMALL_FILE_BYTES)
        if not problems:
            return read
        found = iter(read)
        return [problems[i] if i in problems else next(found) for i in range(len(targets))]

    def parse_cgroups(self, targets: list[CgroupTarget], resource: str,
                      parser: Callable[[bytes], T]) -> list[T | FileProblem]:
        """``parser`` on one file of every target as read (``read_cgroups``), in order; a
        file that could not be read or parsed gives the FileProblem naming it instead."""
        read = self.read_cgroups(targets, resource)
        if set(map(type, read)) <= {bytes}:
            try:  # every file read and well-formed (the common case): one pass in C
                return list(map(parser, read))  # type: ignore[arg-type]
            except ValueError:
                pass  # the loop below names the file
        out: list[T | FileProblem] = []
        for target, data in zip(targets, read, strict=True):
            if isinstance(data, FileProblem):
                out.append(data)
                continue
            try:
                out.append(parser(data))
            except ValueError as exc:
                out.append(FileProblem(Path(self.file_name(target.cgroup_dir, resource)), str(exc)))
        return out

    def kube_qos_dir(self, qos: str) -> str:
        """The cgroup dir of a kube QoS class under ``--cgroup-kube-dir`` (either driver)."""
        return self.cgroups.layout.kube_qos_dir(qos)


class Collector:
    """One collector: ``collect`` is one tick and returns the samples to store. It may raise;
    the runner logs and carries on. Per-pod problems are handled inside, per pod."""

    name = "collector"

    def __init__(self, env: Env) -> None:
        self.env = env
        self.problems = collector_problems(logging.getLogger(f"koordlet.metricsadvisor.{self.name}"))

    @property
    def interval(self) -> float:
        return self.env.config.collect_res_used_interval

    def enabled(self) -> bool:
        return True

    def collect(self, now: float) -> Samples:
        raise NotImplementedError

    def readable(self, targets: list[CgroupTarget], *columns: list[Any]) -> tuple[list[Any], ...]:
        """``targets`` and ``columns`` (one item per target, in order) without the targets
        for which a column holds a FileProblem, each logged (``target_problem``); the same
        lists when there is none, as on nearly every tick."""
        if all(FileProblem not in set(map(type, column)) for column in columns):
            return (targets, *columns)
        keep = []
        for i, target in enumerate(targets):
            problem = next((c[i] for c in columns if isinstance(c[i], FileProblem)), None)
            if problem is None:
                keep.append(i)
            else:
                self.target_problem(target, problem)
        return tuple([column[i] for i in keep] for column in (targets, *columns))

    def target_problem(self, target: CgroupTarget, exc: FileProblem) -> None:
        """One log line per pod (and container), file and reason; a vanished cgroup is normal
        while a pod stops, so it is logged at debug level."""
        level = logging.DEBUG if exc.missing else logging.WARNING
        self.problems.say((target.id, str(exc.path), exc.reason),
                             "%s: %s: %s; no sample", target.who, exc.path, exc.reason, level=level)

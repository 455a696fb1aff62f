"""Reads and writes a pod's or container's real cgroup files on either hierarchy, for tests,
demos and benchmarks.

A test asks for a value ("the CFS quota", "the memory limit") and gets it in one unit
whatever the kernel mounts: cgroup v1 keeps each controller in its own tree
(``<root>/<subsystem>/<dir>/<file>``), v2 has one tree whose files carry other names and
formats (``cpu.max`` holds quota and period, ``cpu.weight`` replaces ``cpu.shares``,
``memory.max`` says ``max`` when unlimited). Nothing here hard-codes a v1 path, so the same
test passes in the native lane and in the cgroup v2 VM lane.

This is deliberately written apart from koordlet's executor: a test that read values
through the code under test could not catch that code's mistakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUPFS, SYSTEMD = "cgroupfs", "systemd"


def cgroup_version(root: Path = CGROUP_ROOT) -> int:
    """2 when ``root`` is a unified (v2) hierarchy, else 1."""
    return 2 if (Path(root) / "cgroup.controllers").exists() else 1


def shares_to_weight(shares: int) -> int:
    """cgroup v2 ``cpu.weight`` for v1 ``cpu.shares`` (runc's and kubelet's formula)."""
    return 1 + ((shares - 2) * 9999) // 262142


def systemd_slice_path(slice_name: str) -> str:
    """A systemd slice name expanded into its nesting, as systemd creates it:
    ``a-b-c.slice`` -> ``a.slice/a-b.slice/a-b-c.slice``."""
    parts = slice_name.removesuffix(".slice").split("-")
    return "/".join("-".join(parts[:i]) + ".slice" for i in range(1, len(parts) + 1))


def pod_dir(cgroup_parent: str) -> str:
    """kubelet's pod cgroup parent (a cgroupfs path or a systemd slice name) as a dir
    relative to the hierarchy root."""
    parent = cgroup_parent.strip("/")
    if "/" not in parent and parent.endswith(".slice"):
        return systemd_slice_path(parent)
    return parent


def container_dir(cgroup_parent: str, container_id: str) -> str:
    """A container's cgroup dir: ``<pod>/<id>`` under cgroupfs, ``<pod>/cri-containerd-<id>.scope``
    when the pod's dir is a systemd slice."""
    pod = pod_dir(cgroup_parent)
    if pod.endswith(".slice"):
        return f"{pod}/cri-containerd-{container_id}.scope"
    return f"{pod}/{container_id}"


@dataclass(frozen=True)
class Cgroup:
    """One cgroup dir (relative to the hierarchy root, e.g. ``kubepods/besteffort``)."""

    rel: str
    root: Path = CGROUP_ROOT

    @classmethod
    def of_pod(cls, cgroup_parent: str, root: Path = CGROUP_ROOT) -> Cgroup:
        return cls(pod_dir(cgroup_parent), Path(root))

    @classmethod
    def of_container(cls, cgroup_parent: str, container_id: str, root: Path = CGROUP_ROOT) -> Cgroup:
        return cls(container_dir(cgroup_parent, container_id), Path(root))

    @property
    def version(self) -> int:
        return cgroup_version(self.root)

    def dir(self, subsystem: str) -> Path:
        """The dir holding ``subsystem``'s files (v2: the one dir of every controller)."""
        rel = self.rel.strip("/")
        return self.root / subsystem / rel if self.version == 1 else self.root / rel

    def file(self, subsystem: str, v1_name: str, v2_name: str | None = None) -> Path:
        if self.version == 1:
            return self.dir(subsystem) / v1_name
        return self.dir(subsystem) / (v2_name or v1_name)

    def read(self, subsystem: str, v1_name: str, v2_name: str | None = None) -> str:
        return self.file(subsystem, v1_name, v2_name).read_text().strip()

    def write(self, subsystem: str, v1_name: str, v2_name: str | None, value: str) -> None:
        self.file(subsystem, v1_name, v2_name).write_text(value)

    def exists(self) -> bool:
        return self.dir("cpu").is_dir()

    # The files a person looks at, by what they hold: (subsystem, v1 name, v2 name).
    SHOWN = {"cpuset": ("cpuset", "cpuset.cpus", "cpuset.cpus"),
             "quota": ("cpu", "cpu.cfs_quota_us", "cpu.max"),
             "shares": ("cpu", "cpu.shares", "cpu.weight"),
             "memory": ("memory", "memory.limit_in_bytes", "memory.max")}

    def shown(self, what: str) -> tuple[Path, str]:
        """``(file, its raw content)`` of one of ``SHOWN`` on this hierarchy, for demos that
        show the real file rather than a converted value."""
        path = self.file(*self.SHOWN[what])
        return path, path.read_text().strip()

    # ---- CPU --------------------------------------------------------------------------

    def cpu_weight(self) -> int:
        """v2 ``cpu.weight``; on v1 ``cpu.shares`` converted the way runc converts it, so one
        expectation (``shares_to_weight(n)``) holds in both lanes."""
        if self.version == 1:
            return shares_to_weight(int(self.read("cpu", "cpu.shares")))
        return int(self.read("cpu", "cpu.weight"))

    def cpu_shares_v1(self) -> int | None:
        """The exact v1 ``cpu.shares``; None on v2, where only the lossy weight exists."""
        return int(self.read("cpu", "cpu.shares")) if self.version == 1 else None

    def set_cpu_weight_from_shares(self, shares: int) -> None:
        if self.version == 1:
            self.write("cpu", "cpu.shares", None, str(shares))
        else:
            self.write("cpu", "cpu.weight", None, str(shares_to_weight(shares)))

    def cpu_max(self) -> tuple[int, int]:
        """``(quota, period)`` in µs; quota -1 when unlimited (v1's spelling of v2's ``max``)."""
        if self.version == 1:
            return int(self.read("cpu", "cpu.cfs_quota_us")), int(self.read("cpu", "cpu.cfs_period_us"))
        quota, _, period = self.read("cpu", "cpu.max").partition(" ")
        return (-1 if quota == "max" else int(quota)), int(period)

    def cpu_quota(self) -> int:
        return self.cpu_max()[0]

    def cpu_period(self) -> int:
        return self.cpu_max()[1]

    def set_cpu_max(self, quota: int, period: int = 100000) -> None:
        """Sets quota and period as kubelet does (v1: period first, so a small quota is accepted)."""
        if self.version == 1:
            self.write("cpu", "cpu.cfs_period_us", None, str(period))
            self.write("cpu", "cpu.cfs_quota_us", None, str(quota))
        else:
            self.write("cpu", "cpu.max", None, f"{'max' if quota < 0 else quota} {period}")

    def cpu_stat(self) -> dict[str, int]:
        text = self.read("cpu", "cpu.stat")
        return {k: int(v) for k, v in (line.split() for line in text.splitlines() if line.strip())}

    def cpu_usage_ns(self) -> int:
        """Cumulative CPU time: v1 ``cpuacct.usage``, v2 ``cpu.stat`` usage_usec × 1000."""
        if self.version == 1:
            return int(self.read("cpuacct", "cpuacct.usage"))
        return self.cpu_stat()["usage_usec"] * 1000

    def throttling(self) -> tuple[int, int]:
        """``(nr_periods, nr_throttled)`` from ``cpu.stat`` (the same keys in both versions)."""
        stat = self.cpu_stat()
        return stat["nr_periods"], stat["nr_throttled"]

    def cpuset_cpus(self) -> str:
        return self.read("cpuset", "cpuset.cpus")

    # ---- memory -----------------------------------------------------------------------

    def memory_limit(self) -> int | None:
        """Bytes; None when unlimited (v2 ``max``; v1's page-rounded LONG_MAX)."""
        text = self.read("memory", "memory.limit_in_bytes", "memory.max")
        if text == "max":
            return None
        value = int(text)
        return None if value >= (1 << 62) else value

    def memory_qos(self) -> dict[str, int] | None:
        """``{"min", "low", "high"}`` in bytes (high -1 when ``max``/unlimited) where the kernel
        has the files: cgroup v2, or v1 on an Anolis kernel; None elsewhere."""
        if not self.file("memory", "memory.min").exists():
            return None
        out = {}
        for name in ("min", "low", "high"):
            text = self.read("memory", f"memory.{name}")
            out[name] = -1 if text == "max" or int(text) >= (1 << 62) else int(text)
        return out

    def memory_usage(self) -> int:
        return int(self.read("memory", "memory.usage_in_bytes", "memory.current"))

    def procs(self) -> list[int]:
        return [int(p) for p in self.read("cpu", "cgroup.procs").split()]

    def threads(self) -> list[int]:
        """Thread ids in the cgroup: v1 ``tasks``, v2 ``cgroup.threads``."""
        return [int(p) for p in self.read("cpu", "tasks", "cgroup.threads").split()]


def enable_v2_controllers(rel: str, root: Path = CGROUP_ROOT,
                          controllers: tuple[str, ...] = ("cpuset", "cpu", "io", "memory", "pids")) -> None:
    """On v2, turns ``controllers`` on in ``cgroup.subtree_control`` of the root and of every
    level down to ``rel`` (creating the dirs), as systemd and kubelet do on a node; without it
    child cgroups have no ``cpu.max``, ``cpuset.cpus`` or ``memory.max``. No-op on v1."""
    root = Path(root)
    if cgroup_version(root) != 2:
        return
    wanted = " ".join(f"+{c}" for c in controllers
                      if c in (root / "cgroup.controllers").read_text().split())
    current = root
    for part in [""] + [p for p in rel.strip("/").split("/") if p]:
        if part:
            current = current / part
            current.mkdir(exist_ok=True)
        (current / "cgroup.subtree_control").write_text(wanted)


def hierarchies(root: Path = CGROUP_ROOT) -> list[Path]:
    """The dirs under which a relative cgroup dir exists: each v1 controller's mount
    (``cpu``, ``memory``, ...), or the one v2 root."""
    root = Path(root)
    if cgroup_version(root) == 2:
        return [root]
    return [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()] if root.is_dir() else []


def remove_tree(rel: str, root: Path = CGROUP_ROOT) -> list[str]:
    """Removes the cgroup dir ``rel`` and every dir below it in every hierarchy, deepest first,
    as kubelet does once the pods in it are gone; returns the dirs that stayed (busy)."""
    stayed: list[str] = []
    for hierarchy in hierarchies(root):
        top = hierarchy / rel.strip("/")
        if not top.is_dir():
            continue
        children = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for directory in [*children, top]:
            try:
                directory.rmdir()
            except OSError as err:
                stayed.append(f"{directory}: {err.strerror}")
    return stayed


@dataclass(frozen=True)
class PodLimits:
    """What kubelet writes into a pod's cgroup when it creates it, before RunPodSandbox: the
    sum of the containers' requests and limits (shares from the cpu request, CFS quota from
    the cpu limit, the memory limit)."""

    cpu_shares: int = 2
    cpu_quota: int = -1
    cpu_period: int = 100000
    memory_limit: int | None = None


def create_pod_cgroup(cgroup_parent: str, limits: PodLimits, root: Path = CGROUP_ROOT) -> Cgroup:
    """Creates the pod's cgroup with ``limits`` as kubelet does before it asks the runtime for
    the sandbox (v1: in the cpu, cpuacct and memory hierarchies; v2: controllers enabled down
    to it); the runtime creates the remaining hierarchies and the containers below it."""
    rel = pod_dir(cgroup_parent)
    root = Path(root)
    if cgroup_version(root) == 2:
        enable_v2_controllers(str(Path(rel).parent), root)
        (root / rel).mkdir(exist_ok=True)
    else:
        for subsystem in ("cpu", "cpuacct", "memory"):
            (root / subsystem / rel).mkdir(parents=True, exist_ok=True)
    cg = Cgroup(rel, root)
    cg.set_cpu_weight_from_shares(limits.cpu_shares)
    cg.set_cpu_max(limits.cpu_quota, limits.cpu_period)
    if limits.memory_limit is not None:
        cg.write("memory", "memory.limit_in_bytes", "memory.max", str(limits.memory_limit))
    return cg

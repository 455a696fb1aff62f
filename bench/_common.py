"""Shared set-up for the benchmarks: a private containerd and a proxy process, torn down after."""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from koord_testing.containerd import Containerd
from koord_testing.proxy import RuntimeProxy


@contextlib.contextmanager
def containerd() -> Iterator[tuple[Containerd, Path]]:
    work = Path(tempfile.mkdtemp(prefix="koord-bench-"))
    backend = Containerd(work / "containerd").start()
    try:
        yield backend, work
    finally:
        backend.stop()


@contextlib.contextmanager
def proxy(backend: Containerd, work: Path, hook_dir: Path, name: str = "proxy",
          data_plane: str = "auto") -> Iterator[RuntimeProxy]:
    """A proxy process in front of ``backend`` (its pids: ``proxy_pids``), at the default log
    level: it logs nothing per call, and ``RuntimeProxy.start`` waits for its info-level
    "serving" line."""
    instance = RuntimeProxy(work / name, backend.endpoint, hook_config_dir=hook_dir, data_plane=data_plane).start()
    try:
        yield instance
    finally:
        instance.stop()


def proxy_pids(instance: RuntimeProxy) -> list[int]:
    """The proxy's processes: Python and, with the HAProxy data plane, HAProxy."""
    assert instance.pid is not None
    return [instance.pid, *instance.children()]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process, from /proc (no psutil needed)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] if q < 100 else max(samples)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.0f}"

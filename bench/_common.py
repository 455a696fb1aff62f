"""Shared set-up for the benchmarks: a private containerd and a proxy process, torn down after."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from koord.testing.containerd import Containerd


@contextlib.contextmanager
def containerd() -> Iterator[tuple[Containerd, Path]]:
    work = Path(tempfile.mkdtemp(prefix="koord-bench-"))
    backend = Containerd(work / "containerd").start()
    try:
        yield backend, work
    finally:
        backend.stop()


@contextlib.contextmanager
def proxy(backend: Containerd, work: Path, hook_dir: Path, name: str = "proxy") -> Iterator[tuple[str, int]]:
    """Starts ``python -m koord.runtimeproxy``; yields (socket, pid)."""
    sock = work / f"{name}.sock"
    hook_dir.mkdir(parents=True, exist_ok=True)
    log = open(work / f"{name}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "koord.runtimeproxy", "--koord-runtimeproxy-endpoint", str(sock),
         "--remote-runtime-service-endpoint", backend.endpoint, "--runtime-hook-config-dir", str(hook_dir),
         "--metrics-bind-address", "", "--log-level", "warning"], stderr=log)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"proxy did not start: {(work / f'{name}.log').read_text()[-2000:]}")
            time.sleep(0.05)
        yield str(sock), proc.pid
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process, from /proc (no psutil needed)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] if q < 100 else max(samples)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.0f}"

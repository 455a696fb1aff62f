"""A ``/proc`` for koordlet's ``--proc-root-dir`` whose node CPU usage is one kube dir's pods."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from koord_testing.cgroups import Cgroup


class PodsOnlyProcStat:
    """A ``--proc-root-dir`` whose ``stat`` counts only the CPU time of the test's kube dir.

    Test machines are shared: other test runs (and the cgroup v2 lane's emulator beside the
    native lane) keep the cpus busy, so the real node is never idle, koordlet (rightly) counts
    that as system usage, and a test of what koordlet does on an idle node could not pass.
    The node koordlet sees here is the test's pods alone: their real cgroup CPU time,
    rewritten every 0.2 s as /proc/stat ticks; cpuinfo and meminfo are the host's.
    """

    def __init__(self, root: Path, kube: str) -> None:
        self.root, self.kube = root, Cgroup(kube)
        root.mkdir(parents=True, exist_ok=True)
        for name in ("cpuinfo", "meminfo"):
            shutil.copyfile(f"/proc/{name}", root / name)
        self.cpus = os.cpu_count() or 1
        self.tck = os.sysconf("SC_CLK_TCK")
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        try:
            busy = self.kube.cpu_usage_ns() * self.tck // 10**9
        except (OSError, ValueError):
            busy = 0
        total = int((time.monotonic() - self.start + 1000) * self.cpus * self.tck)
        lines = [f"cpu  {busy} 0 0 {max(total - busy, 0)} 0 0 0 0 0 0"]
        lines += [f"cpu{i} {busy // self.cpus} 0 0 {max(total - busy, 0) // self.cpus} 0 0 0 0 0 0"
                  for i in range(self.cpus)]
        tmp = self.root / "stat.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.root / "stat")

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._write()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

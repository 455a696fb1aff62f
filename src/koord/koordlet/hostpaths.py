"""Where koordlet finds the host by default: the defaults of ``--proc-root-dir``,
``--sys-root-dir``, ``--sys-fs-root-dir`` and ``--containerd-endpoint``, stated here once for
the flags and for the configs the modules build without a command line (tests, benchmarks)."""

from __future__ import annotations

from pathlib import Path

PROC_ROOT = Path("/proc")
SYS_ROOT = Path("/sys")
SYS_FS_ROOT = Path("/sys/fs")
CONTAINERD_SOCKET = "/var/run/containerd/containerd.sock"

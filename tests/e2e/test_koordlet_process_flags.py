"""Upstream's process flags on ``koordlet`` itself: ``-enable-pprof`` serves thread stacks
and a heap snapshot on ``-pprof-addr``; a flag whose non-default value this koordlet
cannot honour (the audit log, another runtime) stops it at start with exit 2 and a line
naming the flag; the ignored ones it names in its start-up warning."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from koord_testing import klogparse
from koord_testing.containerd import Containerd
from koord_testing.koordlet import KoordletProcess
from koord_testing.wait import wait_for

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()
    except OSError:
        return None


def test_pprof_served_and_ignored_flags_named(containerd: Containerd, tmp_path: Path) -> None:
    port = free_port()
    koordlet = KoordletProcess(tmp_path / "koordlet", [
        "--containerd-endpoint", containerd.endpoint, "--runtime-hooks-reconcile-interval", "0",
        "-enable-pprof", f"-pprof-addr=127.0.0.1:{port}", "-disable-no-deepcopy", "-audit-verbose=3",
        "-kube-api-qps=10", "-kube-api-burst=5"]).start()
    try:
        stacks = wait_for(lambda: page(f"http://127.0.0.1:{port}/debug/pprof/goroutine?debug=2"),
                          "koordlet's pprof thread stacks", 30)
        assert "thread MainThread" in stacks and "thread pprof" in stacks
        heap = page(f"http://127.0.0.1:{port}/debug/pprof/heap")
        assert heap is not None and heap.startswith("VmRSS:")
        assert "ignored: --audit-verbose, --disable-no-deepcopy" in koordlet.logs(400)
    finally:
        koordlet.stop()


@pytest.mark.parametrize("flag, named", [
    ("-audit-log-dir=/tmp/koordlet-audit", "argument --audit-log-dir: '/tmp/koordlet-audit' refused"),
    ("-audit-verbose=5", "argument --audit-verbose: '5' refused: there is no audit log here"),
    ("-docker-endpoint=/var/run/docker.sock", "argument --docker-endpoint"),
    ("-qos-extension-plugins=x=y", "argument --qos-extension-plugins"),
])
def test_flags_that_would_change_behaviour_are_refused(flag: str, named: str) -> None:
    done = subprocess.run([sys.executable, "-m", "koord.koordlet", flag], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert named in done.stderr.splitlines()[-1]


def test_koordlet_logs_klog_lines(containerd: Containerd, tmp_path: Path) -> None:
    """Every line koordlet writes is klog's, the main thread's id being the process id as
    klog's header shows it, the modules' threads with their own."""
    koordlet = KoordletProcess(tmp_path / "koordlet", [
        "--containerd-endpoint", containerd.endpoint, "--runtime-hooks-reconcile-interval", "0", "-v=4"]).start()
    pid = koordlet.pid
    koordlet.stop()
    entries = klogparse.parse(koordlet.log_path.read_text())
    assert {(e.severity, e.thread) for e in entries if e.file == "cli.py"} >= {("I", pid)}
    assert len({e.thread for e in entries}) > 1

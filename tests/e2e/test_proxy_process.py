"""The proxy as a process: socket handling, waiting for the backend, clean shutdown."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as cri

from koord_testing import klogparse
from koord_testing.containerd import Containerd
from koord_testing.kubelet import KubeletClient
from koord_testing.proxy import RuntimeProxy
from koord_testing.runtimes import ContainerdRuntime

pytestmark = pytest.mark.e2e


def test_socket_mode_dir_creation_and_clean_shutdown(containerd: Containerd, tmp_path: Path) -> None:
    proxy = RuntimeProxy(tmp_path / "deep" / "dir", containerd.endpoint).start()
    mode = stat.S_IMODE(os.stat(proxy.endpoint).st_mode)
    assert mode == 0o660
    assert proxy.stop() == 0
    assert not Path(proxy.endpoint).exists(), "the socket must be removed on SIGTERM"


def test_stale_socket_is_replaced(containerd: Containerd, tmp_path: Path) -> None:
    proxy = RuntimeProxy(tmp_path / "p", containerd.endpoint)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(proxy.endpoint)  # a socket file nobody listens on, as a killed proxy leaves
    stale.close()
    proxy.start()
    try:
        with KubeletClient(proxy.endpoint) as client:
            assert client.runtime.Version(cri.VersionRequest()).runtime_name == "containerd"
    finally:
        proxy.stop()


def test_sigkill_leaves_socket_and_restart_recovers(containerd: Containerd, tmp_path: Path) -> None:
    proxy = RuntimeProxy(tmp_path / "p", containerd.endpoint).start()
    proxy.kill()
    assert Path(proxy.endpoint).exists()
    proxy.start()
    proxy.stop()


def test_waits_for_backend_then_serves(tmp_path: Path, containerd_runtime: ContainerdRuntime) -> None:
    backend = Containerd(tmp_path / "late", runtime=containerd_runtime)
    proxy = RuntimeProxy(tmp_path / "p", backend.endpoint)
    proxy_proc = None
    try:
        # Start the proxy first: it must wait (and say so) rather than exit or serve early.
        proxy_proc = subprocess.Popen(proxy.command(), stderr=subprocess.PIPE, text=True)
        time.sleep(6)
        assert proxy_proc.poll() is None, "the proxy must keep waiting for its backend"
        assert not Path(proxy.endpoint).exists(), "it must not serve before the store is rebuilt"
        backend.start()
        deadline = time.monotonic() + 15
        while not Path(proxy.endpoint).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        with KubeletClient(proxy.endpoint) as client:
            assert client.runtime.Version(cri.VersionRequest()).runtime_name == "containerd"
        proxy_proc.terminate()
        _, err = proxy_proc.communicate(timeout=15)
        assert proxy_proc.returncode == 0
        assert "waiting for backend" in err
    finally:
        if proxy_proc is not None and proxy_proc.poll() is None:
            proxy_proc.kill()
        backend.stop()



WATCHING = "pluginsmanager: watching "
"""A DEBUG record every start logs: shown at --v=4, not at 0."""


@pytest.mark.parametrize("data_plane", ["python", "haproxy"])
def test_logs_klog_lines_at_v4(containerd: Containerd, tmp_path: Path, data_plane: str) -> None:
    """Every line of the proxy's stderr is klog's (HAProxy's output included), and --v=4 shows
    the DEBUG records."""
    proxy = RuntimeProxy(tmp_path / "p", containerd.endpoint, data_plane=data_plane, extra_args=["--v=4"]).start()
    pid = proxy.pid
    assert proxy.stop() == 0
    entries = klogparse.parse(proxy.logs())
    serving = [e for e in entries if e.message.startswith("serving CRI on ")]
    assert [(e.severity, e.thread, e.file) for e in serving] == [("I", pid, "cli.py")]
    assert [e.file for e in entries if e.message.startswith(WATCHING)] == ["filewatch.py"]


def test_logs_json_lines(containerd: Containerd, tmp_path: Path) -> None:
    """--logging-format=json: one JSON object a line; the default --v=0 hides DEBUG records."""
    proxy = RuntimeProxy(tmp_path / "p", containerd.endpoint, extra_args=["--logging-format=json"]).start()
    started = time.time()
    assert proxy.stop() == 0
    entries = [json.loads(line) for line in proxy.logs().splitlines()]
    serving = [e for e in entries if e["msg"].startswith("serving CRI on ")]
    assert [(e["caller"].split(":")[0], e["v"]) for e in serving] == [("runtimeproxy/cli.py", 0)]
    assert all(abs(e["ts"] / 1000 - started) < 120 for e in entries)
    assert not [e for e in entries if e["msg"].startswith(WATCHING) or e.get("v") == 4]

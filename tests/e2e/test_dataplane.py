"""The HAProxy data plane as a process tree: supervision, shutdown, failure answers, fallback."""

from __future__ import annotations

import os
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri

from koord.runtimeproxy.dataplane import Layout
from koord_testing.containerd import Containerd, wait_cri_ready
from koord_testing.fakecri import FakeCRI
from koord_testing.kubelet import KubeletClient, grpc_target
from koord_testing.proxy import RuntimeProxy
from koord_testing.wait import wait_for

pytestmark = pytest.mark.e2e


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # dead, waiting for whoever adopted it to reap it


def _haproxy_pid(proxy: RuntimeProxy) -> int:
    children = proxy.children()
    assert len(children) == 1, f"expected HAProxy as the proxy's only child, found {children}"
    assert Path(f"/proc/{children[0]}/comm").read_text().strip() == "haproxy"
    return children[0]


@pytest.fixture
def haproxy_proxy(containerd: Containerd, tmp_path: Path) -> Iterator[RuntimeProxy]:
    port = _free_port()
    instance = RuntimeProxy(tmp_path / "p", containerd.endpoint, data_plane="haproxy",
                            metrics_bind_address=f"127.0.0.1:{port}")
    try:
        instance.start()
        yield instance
    finally:
        instance.stop()
        print("--- runtime proxy log ---\n" + instance.logs(tail=100))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(proxy: RuntimeProxy, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{proxy.metrics_bind_address}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_killed_haproxy_is_restarted(haproxy_proxy: RuntimeProxy) -> None:
    first = _haproxy_pid(haproxy_proxy)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: haproxy_proxy.children() not in ([], [first]), "a new HAProxy")
    wait_cri_ready(haproxy_proxy.endpoint, 10.0)
    assert haproxy_proxy.running
    assert f"haproxy (pid {first}) exited with code" in haproxy_proxy.logs()


def test_killed_python_side_takes_haproxy_along(containerd: Containerd, tmp_path: Path) -> None:
    proxy = RuntimeProxy(tmp_path / "p", containerd.endpoint, data_plane="haproxy").start()
    haproxy = _haproxy_pid(proxy)
    proxy.kill()
    wait_for(lambda: _gone(haproxy), "HAProxy to die with its parent")
    assert Path(proxy.endpoint).exists(), "a killed proxy leaves its socket behind"
    proxy.start()  # and the next start replaces it
    try:
        with KubeletClient(proxy.endpoint) as client:
            assert client.runtime.Version(cri.VersionRequest()).runtime_name == "containerd"
    finally:
        assert proxy.stop() == 0
    assert not Path(proxy.endpoint).exists()
    assert not Layout.for_public_socket(proxy.endpoint).directory.exists()


def test_sigterm_with_open_event_stream(tmp_path: Path) -> None:
    with FakeCRI(tmp_path / "fake.sock") as fake:
        proxy = RuntimeProxy(tmp_path / "p", str(fake.socket), data_plane="haproxy").start()
        haproxy = _haproxy_pid(proxy)
        with grpc.insecure_channel(grpc_target(proxy.endpoint)) as channel:
            events = channel.unary_stream("/runtime.v1.RuntimeService/GetContainerEvents")(b"")
            wait_for(lambda: fake.subscriber_count() == 1, "the event stream to reach the backend")
            # HAProxy's hard-stop-after (10 s) ends the stream; 12 s covers that plus Python's own stop.
            assert proxy.stop(timeout=12) == 0, proxy.logs(tail=40)
            events.cancel()
        assert _gone(haproxy)
        assert not Path(proxy.endpoint).exists()


def test_hooked_call_with_python_side_unreachable_is_unavailable(tmp_path: Path) -> None:
    with FakeCRI(tmp_path / "fake.sock") as fake:
        fake.add_pod("s1", "listed", {}, None)
        proxy = RuntimeProxy(tmp_path / "p", str(fake.socket), data_plane="haproxy").start()
        try:
            # Before any hooked call HAProxy has no connection to Python: removing the socket
            # makes the next one fail to connect, as when the Python side is down.
            Layout.for_public_socket(proxy.endpoint).hooked_socket.unlink()
            with KubeletClient(proxy.endpoint) as client:
                with pytest.raises(grpc.RpcError) as failed:
                    client.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id="s1"), timeout=15)
                assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "koord-runtime-proxy: the proxy's hook server is unavailable" in (failed.value.details() or "")
                assert [p.id for p in client.runtime.ListPodSandbox(cri.ListPodSandboxRequest()).items] == ["s1"]
        finally:
            proxy.stop()


def test_auto_without_haproxy_installed_runs_python(containerd: Containerd, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    proxy = RuntimeProxy(tmp_path / "p", containerd.endpoint, env=env).start()
    try:
        assert proxy.children() == []
        with KubeletClient(proxy.endpoint) as client:
            assert client.runtime.Version(cri.VersionRequest()).runtime_name == "containerd"
    finally:
        proxy.stop()
    lines = [line for line in proxy.logs().splitlines() if "data plane:" in line]
    assert len(lines) == 1 and "data plane: python, because --data-plane=auto and no haproxy" in lines[0], lines


def test_haproxy_required_but_missing_is_a_flag_error(containerd: Containerd, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    proxy = RuntimeProxy(tmp_path / "p", containerd.endpoint, data_plane="haproxy", env=env)
    with pytest.raises(RuntimeError):
        proxy.start(timeout=10)
    assert proxy.returncode == 2
    assert "--data-plane=haproxy: no haproxy binary on PATH" in proxy.logs()


def test_readyz_and_passthrough_metrics(haproxy_proxy: RuntimeProxy) -> None:
    wait_for(lambda: _get(haproxy_proxy, "/readyz")[0] == 200, "/readyz")
    with KubeletClient(haproxy_proxy.endpoint) as client:
        for _ in range(3):
            client.runtime.ListContainers(cri.ListContainersRequest())
    status, text = _get(haproxy_proxy, "/metrics")
    assert status == 200
    assert "koord_runtime_proxy_haproxy_up 1.0" in text
    series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("koord_runtime_proxy_haproxy_")}
    assert series['koord_runtime_proxy_haproxy_requests_total{method="runtime.v1.RuntimeService/ListContainers"}'] == 3
    assert series['koord_runtime_proxy_haproxy_average_duration_seconds{method='
                  '"runtime.v1.RuntimeService/ListContainers"}'] >= 0

    os.kill(_haproxy_pid(haproxy_proxy), signal.SIGSTOP)  # alive, but nothing goes through it
    try:
        wait_for(lambda: _get(haproxy_proxy, "/readyz") == (503, "Version through the public socket was "
                                                                     "not answered\n"), "/readyz to fail", 20)
    finally:
        for pid in haproxy_proxy.children():
            os.kill(pid, signal.SIGCONT)

"""Backend data the proxy cannot read must never stop it from starting or serving.

containerd stores whatever bytes a client sends: a sandbox whose name is not UTF-8 is
accepted, and every later list of sandboxes carries it. No protobuf string field decodes
it, so the proxy must skip that one record (one log line) and serve the rest.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri
from google.protobuf.message import DecodeError

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.runtimehooks.hooks import Hooks
from koord.koordlet.runtimehooks.reconciler import Reconciler
from koord_testing.cgroups import pod_dir, remove_tree
from koord_testing.containerd import Containerd
from koord_testing.fakecri import FakeCRI
from koord_testing.hookplugin import RecordingPlugin
from koord_testing.kubelet import KubeletClient
from koord_testing.proxy import RuntimeProxy

from .rig import eventually, free_port

pytestmark = pytest.mark.e2e

MARKER = "not-utf8-name-marker"
BAD_NAME = b"bad\xff\xfe" + b"x" * (len(MARKER) - 5)


def run_sandbox_with_undecodable_name(kubelet: KubeletClient) -> tuple[str, str]:
    """RunPodSandbox straight at containerd with raw bytes: metadata.name is invalid UTF-8."""
    config = kubelet.sandbox_config("placeholder", namespace="hostile")
    config.metadata.name = MARKER
    raw = cri.RunPodSandboxRequest(config=config).SerializeToString()
    assert raw.count(MARKER.encode()) == 1
    raw = raw.replace(MARKER.encode(), BAD_NAME)
    with pytest.raises(DecodeError):
        cri.RunPodSandboxRequest.FromString(raw)  # really undecodable for protobuf
    with grpc.insecure_channel(f"unix://{kubelet.endpoint}") as channel:
        answer = channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox")(raw, timeout=60)
    return cri.RunPodSandboxResponse.FromString(answer).pod_sandbox_id, config.linux.cgroup_parent


def test_unreadable_sandbox_is_skipped_once_and_the_proxy_serves(
        containerd: Containerd, kubelet: KubeletClient, tmp_path: Path) -> None:
    good = kubelet.run_pod("good", namespace="hostile")
    bad_id, bad_parent = run_sandbox_with_undecodable_name(kubelet)
    proxy = RuntimeProxy(tmp_path / "proxy", containerd.endpoint, hook_config_dir=tmp_path / "hooks")
    try:
        proxy.start()  # before the fix: exit 1 within ~1 s, on every start
        with KubeletClient(proxy.endpoint) as client:
            assert client.runtime.Version(cri.VersionRequest(), timeout=10).runtime_name == "containerd"
            # Pass-through calls stay byte-for-byte: kubelet's own list still works through the proxy.
            with grpc.insecure_channel(f"unix://{proxy.endpoint}") as channel:
                raw = channel.unary_unary("/runtime.v1.RuntimeService/ListPodSandbox")(
                    cri.ListPodSandboxRequest().SerializeToString(), timeout=10)
            assert BAD_NAME in raw and good.encode() in raw
        proxy.stop()
        proxy.start()  # and again: no crash loop
        logs = proxy.logs()
        skipped = [line for line in logs.splitlines() if f"skipping sandbox {bad_id}" in line]
        assert len(skipped) == 2, f"one line per start, naming the sandbox:\n{logs}"
        assert "does not decode" in skipped[0]
        assert f"skipping sandbox {good}" not in logs
    finally:
        proxy.stop()
        kubelet.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=bad_id), timeout=60)
        kubelet.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=bad_id), timeout=60)
        remove_tree(pod_dir(bad_parent))


def test_reconciler_skips_an_unreadable_sandbox_and_reconciles_the_rest(
        containerd: Containerd, kubelet: KubeletClient, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """koordlet's Standalone reconciler lists pods the same way: one bad record must not stop it."""
    good = kubelet.run_pod("good", namespace="hostile")
    bad_id, bad_parent = run_sandbox_with_undecodable_name(kubelet)
    seen: list[str] = []
    hooks = Hooks(FailurePolicy.IGNORE)
    hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, "recorder", "", lambda ctx: seen.append(ctx.request.meta.name))
    reconciler = Reconciler(hooks, CgroupExecutor(CgroupLayout(tmp_path / "cgroup", version=1)), [],
                            containerd.endpoint, interval=3600)
    try:
        with caplog.at_level(logging.WARNING):
            first, second = reconciler.reconcile_once(), reconciler.reconcile_once()
        # Before: every round ended at once with "cannot list pods: INTERNAL: Exception deserializing response!"
        assert "good" in seen, first.errors
        assert any(bad_id in e for e in first.errors) and any(bad_id in e for e in second.errors)
        assert sum(bad_id in r.getMessage() for r in caplog.records) == 1, "logged once, not every round"
        assert kubelet.pods == [good]
    finally:
        reconciler.stop()
        kubelet.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=bad_id), timeout=60)
        kubelet.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=bad_id), timeout=60)
        remove_tree(pod_dir(bad_parent))


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_no_hooks_for_calls_that_cannot_succeed(tmp_path: Path) -> None:
    backend = FakeCRI(tmp_path / "backend.sock").__enter__()
    plugin = RecordingPlugin(tmp_path / "plugin.sock").start()
    port = free_port()
    proxy = RuntimeProxy(tmp_path / "proxy", str(backend.socket), hook_config_dir=tmp_path / "hooks",
                         metrics_bind_address=f"127.0.0.1:{port}")
    plugin.registration(proxy.hook_config_dir, "10-p.json", hooks=["PreRunPodSandbox", "PreCreateContainer"])
    try:
        proxy.start()
        eventually(lambda: _readyz(port) == 200, timeout=10, what="/readyz 200")
        with KubeletClient(proxy.endpoint) as client:
            # No pod / container metadata: the backend must reject it, so no plugin is asked.
            client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(), timeout=10)
            with pytest.raises(grpc.RpcError):  # no such sandbox: the fake says NOT_FOUND
                client.runtime.CreateContainer(cri.CreateContainerRequest(pod_sandbox_id="x"), timeout=10)
            assert plugin.hooks_seen() == []
            # The same plugin is called for a call that has metadata (the test can fail).
            config = cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name="p", namespace="ns", uid="u"))
            client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=10)
            assert plugin.hooks_seen() == ["PreRunPodSandbox"]

            backend.__exit__()
            eventually(lambda: _readyz(port) == 503, timeout=10, what="/readyz 503 with the backend down")
            with pytest.raises(grpc.RpcError) as err:
                client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=10)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            assert plugin.hooks_seen() == ["PreRunPodSandbox"], "no plugin call while the backend is down"
            assert proxy.running

            backend = FakeCRI(tmp_path / "backend.sock").__enter__()

            def run_pod() -> bool:
                try:
                    client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=10)
                    return True
                except grpc.RpcError as err:  # the proxy's channel may still be in reconnect backoff
                    assert err.code() is grpc.StatusCode.UNAVAILABLE
                    return False

            # Kubelet retries; the first call the backend takes again has its hooks.
            eventually(run_pod, timeout=10, what="RunPodSandbox through the proxy again")
            assert plugin.hooks_seen() == ["PreRunPodSandbox"] * 2
    finally:
        proxy.stop()
        plugin.stop()
        backend.__exit__()

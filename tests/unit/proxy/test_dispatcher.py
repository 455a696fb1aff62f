"""The runtime dispatcher against real plugin servers on unix sockets (no backend needed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord.hookapi import HookPoint
from koord.hookapi.registration import Registration
from koord.runtimeproxy.dispatcher import HookFailed, RuntimeDispatcher, Target
from koord.runtimeproxy.metrics import ProxyMetrics
from koord.runtimeproxy.pluginsmanager import PluginsManager
from koord_testing.hookplugin import Behaviour, RecordingPlugin

TARGET = Target("ns/web", "c1")


@pytest.fixture
def env(tmp_path: Path):
    plugins: list[RecordingPlugin] = []
    config_dir = tmp_path / "hookserver.d"
    config_dir.mkdir()

    def add(file_name: str, **registration) -> RecordingPlugin:
        plugin = RecordingPlugin(tmp_path / f"{file_name}.sock", name=file_name).start()
        plugin.registration(config_dir, file_name, **registration)
        plugins.append(plugin)
        return plugin

    yield config_dir, add
    for plugin in plugins:
        plugin.stop()


def _dispatch(config_dir: Path, coro_fn):
    async def main():
        manager = PluginsManager(config_dir, default_timeout=5.0)
        manager.start()
        metrics = ProxyMetrics(CollectorRegistry())
        dispatcher = RuntimeDispatcher(manager, metrics)
        try:
            return await coro_fn(dispatcher), metrics
        finally:
            await dispatcher.close()
            manager.stop()
    return asyncio.run(main())


def _sample(metrics: ProxyMetrics, plugin: str, outcome: str) -> float:
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name.endswith("hook_duration_seconds_count") and s.labels.get("plugin") == plugin \
                    and s.labels.get("outcome") == outcome:
                return s.value
    return 0.0


def test_plugins_are_chained_in_file_order_and_overrides_are_logged(env, caplog) -> None:
    config_dir, add = env
    second = add("20-b.json", hooks=["PreCreateContainer"])
    first = add("10-a.json", hooks=["PreCreateContainer"])
    first.behaviours["PreCreateContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_annotations={"from-a": "1"}, container_resources=hook.LinuxContainerResources(cpu_shares=100)))
    second.behaviours["PreCreateContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(cpu_shares=200)))
    request = hook.ContainerResourceHookRequest(container_meta=hook.ContainerMetadata(name="c1"))
    caplog.set_level(logging.INFO)
    changed, _ = _dispatch(config_dir, lambda d: d.run_pre(HookPoint.PRE_CREATE_CONTAINER, request, TARGET))
    assert changed
    assert request.container_resources.cpu_shares == 200
    assert request.container_annotations["from-a"] == "1"
    assert second.requests("PreCreateContainer")[0].container_annotations["from-a"] == "1"
    assert any("20-b.json overrides container_resources.cpu_shares set by plugin 10-a.json" in r.message
               for r in caplog.records)


def test_timeout_with_ignore_goes_on(env) -> None:
    config_dir, add = env
    slow = add("10-slow.json", hooks=["PreRunPodSandbox"], timeout=0.3)
    slow.behaviours["PreRunPodSandbox"] = Behaviour(delay=3.0)
    fast = add("20-fast.json", hooks=["PreRunPodSandbox"])
    fast.behaviours["PreRunPodSandbox"] = Behaviour(
        answer=lambda req: hook.PodSandboxHookResponse(labels={"fast": "yes"}))
    request = hook.PodSandboxHookRequest()
    start = time.monotonic()
    changed, metrics = _dispatch(config_dir, lambda d: d.run_pre(HookPoint.PRE_RUN_POD_SANDBOX, request, TARGET))
    assert time.monotonic() - start < 2.5, "the hung plugin must be cut off by its timeout"
    assert changed and request.labels["fast"] == "yes"
    assert _sample(metrics, "10-slow.json", "timeout") == 1


class SlowHandshake:
    """A unix socket in front of a plugin that lets each connection through 0.5 s after it
    arrives, as a busy plugin's server answers its first HTTP/2 frames late."""

    def __init__(self, path: Path, target: Path, delay: float = 0.5) -> None:
        self.path, self.target, self.delay = path, target, delay
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(path))
        self._listener.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        time.sleep(self.delay)
        server = socket.socket(socket.AF_UNIX)
        server.connect(str(self.target))
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()


def test_a_plugin_that_answers_its_first_connection_late_is_still_called(env, tmp_path: Path) -> None:
    """A first connection that takes 0.5 s is waited for within the hook's timeout (grpc's
    min_reconnect_backoff_ms would make it fail UNAVAILABLE after 0.1 s instead)."""
    config_dir, add = env
    plugin = add("10-busy.json", hooks=["PreRunPodSandbox"])
    plugin.behaviours["PreRunPodSandbox"] = Behaviour(
        answer=lambda req: hook.PodSandboxHookResponse(labels={"busy": "answered"}))
    slow = SlowHandshake(tmp_path / "slow.sock", plugin.socket)
    try:
        Registration.of("10-busy", str(slow.path), "Ignore", ["PreRunPodSandbox"], None).write(config_dir)
        request = hook.PodSandboxHookRequest()
        changed, metrics = _dispatch(config_dir, lambda d: d.run_pre(HookPoint.PRE_RUN_POD_SANDBOX, request, TARGET))
    finally:
        slow.close()
    assert changed and request.labels["busy"] == "answered"
    assert _sample(metrics, "10-busy.json", "unavailable") == 0


def test_fail_policy_error_names_plugin_hook_and_error(env) -> None:
    config_dir, add = env
    bad = add("10-strict.json", hooks=["PreStartContainer"], failure_policy="Fail")
    bad.behaviours["PreStartContainer"] = Behaviour(error=(grpc.StatusCode.INTERNAL, "no cpus left"))
    with pytest.raises(HookFailed) as err:
        _dispatch(config_dir, lambda d: d.run_pre(HookPoint.PRE_START_CONTAINER,
                                                  hook.ContainerResourceHookRequest(), TARGET))
    text = str(err.value)
    assert "10-strict.json" in text and "PreStartContainer" in text and "no cpus left" in text


def test_invalid_answer_is_an_error_and_never_merged(env) -> None:
    config_dir, add = env
    bad = add("10-bad.json", hooks=["PreCreateContainer"])
    bad.behaviours["PreCreateContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(cpuset_cpus="zero", cpu_shares=7)))
    request = hook.ContainerResourceHookRequest()
    changed, metrics = _dispatch(config_dir, lambda d: d.run_pre(HookPoint.PRE_CREATE_CONTAINER, request, TARGET))
    assert not changed and request.container_resources.cpu_shares == 0
    assert _sample(metrics, "10-bad.json", "invalid") == 1


def test_invalid_answer_with_fail_policy_fails_the_call(env) -> None:
    config_dir, add = env
    bad = add("10-bad.json", hooks=["PreCreateContainer"], failure_policy="Fail")
    bad.behaviours["PreCreateContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_envs={"": "x"}))
    with pytest.raises(HookFailed, match="invalid answer: container_envs"):
        _dispatch(config_dir, lambda d: d.run_pre(HookPoint.PRE_CREATE_CONTAINER,
                                                  hook.ContainerResourceHookRequest(), TARGET))


def test_unreachable_plugin_with_ignore_is_skipped(env, tmp_path) -> None:
    config_dir, add = env
    gone = add("10-gone.json", hooks=["PreRunPodSandbox"])
    gone.stop()
    request = hook.PodSandboxHookRequest()
    changed, metrics = _dispatch(config_dir, lambda d: d.run_pre(HookPoint.PRE_RUN_POD_SANDBOX, request, TARGET))
    assert not changed
    assert _sample(metrics, "10-gone.json", "unavailable") == 1


def test_post_hook_errors_are_never_raised(env) -> None:
    config_dir, add = env
    bad = add("10-strict.json", hooks=["PostStopContainer"], failure_policy="Fail")
    bad.behaviours["PostStopContainer"] = Behaviour(error=(grpc.StatusCode.INTERNAL, "boom"))
    ok = add("20-ok.json", hooks=["PostStopContainer"])
    _, metrics = _dispatch(config_dir, lambda d: d.run_post(HookPoint.POST_STOP_CONTAINER,
                                                            hook.ContainerResourceHookRequest(), TARGET))
    assert len(ok.requests("PostStopContainer")) == 1
    assert _sample(metrics, "10-strict.json", "error") == 1


def test_plugin_without_the_hook_point_is_not_called(env) -> None:
    config_dir, add = env
    only_pod = add("10-pod.json", hooks=["PreRunPodSandbox"])
    _dispatch(config_dir, lambda d: d.run_pre(HookPoint.PRE_CREATE_CONTAINER,
                                              hook.ContainerResourceHookRequest(), TARGET))
    assert only_pod.hooks_seen() == []


# A length-delimited field 1 that claims 5 bytes and has 1: no protobuf message decodes it.
UNDECODABLE = b"\x0a\x05a"


@pytest.mark.parametrize("hook_point, request_type", [
    (HookPoint.PRE_RUN_POD_SANDBOX, hook.PodSandboxHookRequest),
    (HookPoint.PRE_CREATE_CONTAINER, hook.ContainerResourceHookRequest),
])
def test_undecodable_answer_with_ignore_is_that_plugins_error(env, hook_point, request_type) -> None:
    config_dir, add = env
    garbage = add("10-garbage.json", hooks=[hook_point.value])
    garbage.behaviours[hook_point.value] = Behaviour(raw=UNDECODABLE)
    later = add("20-ok.json", hooks=[hook_point.value])
    request = request_type()
    changed, metrics = _dispatch(config_dir, lambda d: d.run_pre(hook_point, request, TARGET))
    assert not changed
    assert len(later.requests(hook_point.value)) == 1, "Ignore goes on to the next plugin"
    assert _sample(metrics, "10-garbage.json", "invalid") == 1


def test_undecodable_answer_with_fail_names_plugin_hook_point_and_reason(env) -> None:
    config_dir, add = env
    garbage = add("10-garbage.json", hooks=["PreCreateContainer"], failure_policy="Fail")
    garbage.behaviours["PreCreateContainer"] = Behaviour(raw=UNDECODABLE)
    with pytest.raises(HookFailed) as err:
        _dispatch(config_dir, lambda d: d.run_pre(HookPoint.PRE_CREATE_CONTAINER,
                                                  hook.ContainerResourceHookRequest(), TARGET))
    text = str(err.value)
    assert "10-garbage.json" in text and "PreCreateContainer" in text and "undecodable answer" in text


def test_call_cancelled_by_the_caller_is_counted_as_cancelled(env) -> None:
    config_dir, add = env
    slow = add("10-slow.json", hooks=["PreRunPodSandbox"])
    slow.behaviours["PreRunPodSandbox"] = Behaviour(delay=2.0)

    async def cancelled(d: RuntimeDispatcher) -> None:
        with pytest.raises(TimeoutError):
            # kubelet's deadline passing cancels the handler task, and with it the hook call.
            await asyncio.wait_for(d.run_pre(HookPoint.PRE_RUN_POD_SANDBOX,
                                             hook.PodSandboxHookRequest(), TARGET), 0.2)

    _, metrics = _dispatch(config_dir, cancelled)
    assert _sample(metrics, "10-slow.json", "ok") == 0
    assert _sample(metrics, "10-slow.json", "cancelled") == 1

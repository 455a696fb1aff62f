"""The CRI server's interception path, in process: a fake CRI backend, real plugin servers, no containers.

Every lifecycle handler is driven through a real grpc.aio server the way kubelet calls it,
with the store hit or missed, the skip label, Fail and Ignore plugins, and no plugin at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord.hookapi import HookPoint
from koord.runtimeproxy.criserver import SERVER_OPTIONS, Backend, CRIServer
from koord.runtimeproxy.dispatcher import RuntimeDispatcher
from koord.runtimeproxy.metrics import ProxyMetrics
from koord.runtimeproxy.pluginsmanager import PluginsManager
from koord.runtimeproxy.store import Store
from koord_testing.fakecri import FakeCRI
from koord_testing.hookplugin import ALL_HOOKS, Behaviour, RecordingPlugin

SKIP = ("runtimeproxy.koordinator.sh/skip-hookserver", "true")
UNKNOWN_FIELD = b"\xf8\x7f\x01"
"""Field 2047, unknown to every CRI message: only the original bytes still carry it."""

POD_CONFIG = cri.PodSandboxConfig(
    metadata=cri.PodSandboxMetadata(name="web", namespace="prod", uid="u1"),
    labels={"app": "web"}, annotations={"a": "1"}, linux=cri.LinuxPodSandboxConfig(cgroup_parent="/kubepods/podu1"))
CONTAINER_CONFIG = cri.ContainerConfig(
    metadata=cri.ContainerMetadata(name="c1"), envs=[cri.KeyValue(key="A", value="1")],
    linux=cri.LinuxContainerConfig(resources=cri.LinuxContainerResources(cpu_shares=2, memory_limit_in_bytes=1 << 30)))


@dataclass
class Proxy:
    """The CRI server under test with its backend, store and plugins."""

    fake: FakeCRI
    store: Store
    channel: grpc.aio.Channel
    plugins: dict[str, RecordingPlugin] = field(default_factory=dict)

    async def call(self, method: str, request: Message, response_type: type[Message], extra: bytes = b"") -> Any:
        rpc = self.channel.unary_unary(f"/runtime.v1.RuntimeService/{method}",
                                       response_deserializer=response_type.FromString)
        return await rpc(request.SerializeToString() + extra, timeout=10)

    async def run_pod(self, config: cri.PodSandboxConfig = POD_CONFIG, extra: bytes = b"") -> str:
        response = await self.call("RunPodSandbox", cri.RunPodSandboxRequest(config=config),
                                   cri.RunPodSandboxResponse, extra)
        return str(response.pod_sandbox_id)

    async def create(self, sid: str, config: cri.ContainerConfig = CONTAINER_CONFIG,
                     sandbox_config: cri.PodSandboxConfig = POD_CONFIG, extra: bytes = b"") -> str:
        request = cri.CreateContainerRequest(pod_sandbox_id=sid, config=config, sandbox_config=sandbox_config)
        return str((await self.call("CreateContainer", request, cri.CreateContainerResponse, extra)).container_id)

    async def start(self, cid: str, extra: bytes = b"") -> None:
        await self.call("StartContainer", cri.StartContainerRequest(container_id=cid), cri.StartContainerResponse,
                        extra)


Plugins = dict[str, tuple[tuple[str, ...], str, dict[str, Behaviour]]]
"""file name -> (hook points, failure policy, behaviours)."""


@asynccontextmanager
async def proxy(socket_dir: Path, plugins: Plugins | None = None) -> AsyncIterator[Proxy]:
    config_dir = socket_dir / "hookserver.d"
    config_dir.mkdir()
    recording: dict[str, RecordingPlugin] = {}
    for file_name, (hooks, policy, behaviours) in (plugins or {}).items():
        plugin = RecordingPlugin(socket_dir / f"{file_name}.sock", name=file_name, behaviours=behaviours).start()
        plugin.registration(config_dir, file_name, hooks=hooks, failure_policy=policy, timeout=5)
        recording[file_name] = plugin
    with FakeCRI(socket_dir / "cri.sock") as fake:
        manager = PluginsManager(config_dir, default_timeout=5.0)
        manager.start()
        backend = Backend(str(fake.socket), str(fake.socket))
        store = Store()
        metrics = ProxyMetrics(CollectorRegistry())
        dispatcher = RuntimeDispatcher(manager, metrics)
        server = grpc.aio.server(options=SERVER_OPTIONS)
        server.add_generic_rpc_handlers((CRIServer(backend, store, dispatcher, metrics, SKIP),))
        server.add_insecure_port(f"unix:{socket_dir}/proxy.sock")
        await server.start()
        channel = grpc.aio.insecure_channel(f"unix:{socket_dir}/proxy.sock")
        try:
            yield Proxy(fake, store, channel, recording)
        finally:
            await channel.close()
            await server.stop(None)
            await dispatcher.close()
            await backend.close()
            manager.stop()
            for plugin in recording.values():
                plugin.stop()


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


# ------------------------------------------------------------------ no plugin: the original bytes

LIFECYCLE = ["RunPodSandbox", "CreateContainer", "StartContainer", "UpdateContainerResources", "StopContainer",
             "RemoveContainer", "StopPodSandbox", "RemovePodSandbox"]


@pytest.mark.parametrize("with_plugin_elsewhere", [False, True], ids=["no-plugin", "plugin-for-no-hook"])
def test_every_lifecycle_call_forwards_the_original_bytes(short_socket_dir: Path, with_plugin_elsewhere) -> None:
    plugins: Plugins = {"10-idle.json": ((), "Fail", {})} if with_plugin_elsewhere else {}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            sid = await p.run_pod(extra=UNKNOWN_FIELD)
            cid = await p.create(sid, extra=UNKNOWN_FIELD)
            await p.start(cid, extra=UNKNOWN_FIELD)
            update = cri.UpdateContainerResourcesRequest(container_id=cid, linux=cri.LinuxContainerResources(
                cpu_shares=4))
            await p.call("UpdateContainerResources", update, cri.UpdateContainerResourcesResponse, UNKNOWN_FIELD)
            await p.call("StopContainer", cri.StopContainerRequest(container_id=cid), cri.StopContainerResponse,
                         UNKNOWN_FIELD)
            await p.call("RemoveContainer", cri.RemoveContainerRequest(container_id=cid),
                         cri.RemoveContainerResponse, UNKNOWN_FIELD)
            await p.call("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=sid),
                         cri.StopPodSandboxResponse, UNKNOWN_FIELD)
            await p.call("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=sid),
                         cri.RemovePodSandboxResponse, UNKNOWN_FIELD)
            for method in LIFECYCLE:
                (raw,) = p.fake.requests(method)
                assert raw.endswith(UNKNOWN_FIELD), f"{method} was re-encoded"
            assert p.store.sizes() == (0, 0)

    run(main)


# ------------------------------------------------------------------ Pre hooks change the request

def test_pre_run_pod_sandbox_answer_reaches_the_backend_and_the_store(short_socket_dir: Path) -> None:
    answer = Behaviour(answer=lambda req: hook.PodSandboxHookResponse(
        labels={"added": "yes"}, cgroup_parent="/kubepods/besteffort/podu1",
        resources=hook.LinuxContainerResources(cpu_shares=512)))
    plugins: Plugins = {"10-a.json": (("PreRunPodSandbox", "PreCreateContainer"), "Ignore",
                                      {"PreRunPodSandbox": answer})}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            sid = await p.run_pod(extra=UNKNOWN_FIELD)
            (raw,) = p.fake.requests("RunPodSandbox")
            sent = cri.RunPodSandboxRequest.FromString(raw)
            assert sent.config.labels == {"app": "web", "added": "yes"}
            assert sent.config.linux.cgroup_parent == "/kubepods/besteffort/podu1"
            assert sent.config.linux.resources.cpu_shares == 512
            stored = p.store.get_pod(sid)
            assert stored is not None and stored.labels["added"] == "yes"
            # Store hit: the container hook gets the pod as the backend got it.
            await p.create(sid)
            (create,) = p.plugins["10-a.json"].requests("PreCreateContainer")
            assert create.pod_labels["added"] == "yes"
            assert create.pod_cgroup_parent == "/kubepods/besteffort/podu1"
            assert create.pod_meta.name == "web" and create.container_meta.name == "c1"
            assert create.container_envs == {"A": "1"}

    run(main)


def test_pre_create_container_answer_is_merged(short_socket_dir: Path) -> None:
    answer = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_envs={"B": "2"}, container_annotations={"x": "y"},
        container_resources=hook.LinuxContainerResources(cpuset_cpus="0-1")))
    plugins: Plugins = {"10-a.json": (("PreCreateContainer",), "Ignore", {"PreCreateContainer": answer})}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            sid = await p.run_pod()
            cid = await p.create(sid)
            (raw,) = p.fake.requests("CreateContainer")
            sent = cri.CreateContainerRequest.FromString(raw).config
            assert [(e.key, e.value) for e in sent.envs] == [("A", "1"), ("B", "2")]
            assert sent.annotations["x"] == "y" and sent.linux.resources.cpuset_cpus == "0-1"
            assert sent.linux.resources.cpu_shares == 2
            record = p.store.get_container(cid)
            assert record is not None and record.sandbox_id == sid
            assert record.info.container_resources.cpuset_cpus == "0-1"

    run(main)


def test_pre_start_changes_resources_through_update_container_resources(short_socket_dir: Path) -> None:
    answer = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(cpu_quota=50000, cpu_period=100000)))
    plugins: Plugins = {"10-a.json": (("PreStartContainer",), "Ignore", {"PreStartContainer": answer})}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            cid = await p.create(await p.run_pod())
            await p.start(cid, extra=UNKNOWN_FIELD)
            methods = [m for m, _ in p.fake.calls]
            assert methods[-2:] == ["UpdateContainerResources", "StartContainer"]
            update = cri.UpdateContainerResourcesRequest.FromString(p.fake.requests("UpdateContainerResources")[0])
            assert (update.container_id, update.linux.cpu_quota, update.linux.cpu_period) == (cid, 50000, 100000)
            assert update.linux.cpu_shares == 2, "the rest of the container's resources is kept"
            assert p.fake.requests("StartContainer")[0].endswith(UNKNOWN_FIELD)
            record = p.store.get_container(cid)
            assert record is not None and record.info.container_resources.cpu_quota == 50000

    run(main)


def test_pre_update_container_resources_answer_is_merged(short_socket_dir: Path) -> None:
    answer = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(cpuset_cpus="3")))
    plugins: Plugins = {"10-a.json": (("PreUpdateContainerResources",), "Ignore",
                                      {"PreUpdateContainerResources": answer})}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            cid = await p.create(await p.run_pod())
            update = cri.UpdateContainerResourcesRequest(container_id=cid, linux=cri.LinuxContainerResources(
                cpu_shares=8))
            await p.call("UpdateContainerResources", update, cri.UpdateContainerResourcesResponse)
            (hooked,) = p.plugins["10-a.json"].requests("PreUpdateContainerResources")
            assert hooked.container_resources.cpu_shares == 8 and hooked.pod_meta.name == "web"
            sent = cri.UpdateContainerResourcesRequest.FromString(p.fake.requests("UpdateContainerResources")[0])
            assert (sent.linux.cpu_shares, sent.linux.cpuset_cpus) == (8, "3")
            record = p.store.get_container(cid)
            assert record is not None and record.info.container_resources.cpuset_cpus == "3"

    run(main)


# ------------------------------------------------------------------ store miss: the backend's verbose status

def test_store_miss_fetches_pod_and_container_from_the_backend(short_socket_dir: Path) -> None:
    plugins: Plugins = {"10-a.json": (("PreStartContainer", "PostStopContainer", "PostStopPodSandbox"), "Ignore",
                                      {})}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            p.fake.add_pod("p1", "behind", {"app": "x"}, "/kubepods/besteffort/podp1", annotations={"k": "v"})
            p.fake.add_container("c1", "p1", "main", envs={"E": "1"},
                                 resources={"cpu_shares": 2, "memory_limit_in_bytes": 1024})
            await p.start("c1")
            (req,) = p.plugins["10-a.json"].requests("PreStartContainer")
            assert (req.pod_meta.namespace, req.pod_meta.name, req.container_meta.id) == ("ns", "behind", "c1")
            assert req.pod_annotations == {"k": "v"} and req.pod_cgroup_parent == "/kubepods/besteffort/podp1"
            assert req.container_envs == {"E": "1"}
            assert req.container_resources.memory_limit_in_bytes == 1024
            assert req.container_resources.memory_swap_limit_in_bytes == 0, "containerd's implicit swap is dropped"
            assert p.store.get_container("c1") is not None and p.store.get_pod("p1") is not None
            await p.call("StopContainer", cri.StopContainerRequest(container_id="c1"), cri.StopContainerResponse)
            await p.call("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id="p1"), cri.StopPodSandboxResponse)
            assert p.plugins["10-a.json"].hooks_seen() == ["PreStartContainer", "PostStopContainer",
                                                           "PostStopPodSandbox"]

    run(main)


def test_unknown_container_gets_no_hooks_and_the_backends_error(short_socket_dir: Path) -> None:
    plugins: Plugins = {"10-a.json": (ALL_HOOKS, "Fail", {})}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await p.start("nope")
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            assert p.plugins["10-a.json"].hooks_seen() == []

    run(main)


# ------------------------------------------------------------------ skip label, failure policy, Post hooks

def test_skip_label_means_no_hook_calls_at_all(short_socket_dir: Path) -> None:
    plugins: Plugins = {"10-a.json": (ALL_HOOKS, "Fail", {})}
    skipped = cri.PodSandboxConfig()
    skipped.CopyFrom(POD_CONFIG)
    skipped.labels[SKIP[0]] = SKIP[1]

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            sid = await p.run_pod(skipped, extra=UNKNOWN_FIELD)
            cid = await p.create(sid, sandbox_config=skipped, extra=UNKNOWN_FIELD)
            await p.start(cid)
            await p.call("StopContainer", cri.StopContainerRequest(container_id=cid), cri.StopContainerResponse)
            await p.call("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=sid), cri.StopPodSandboxResponse)
            assert p.plugins["10-a.json"].hooks_seen() == []
            assert p.fake.requests("RunPodSandbox")[0].endswith(UNKNOWN_FIELD)
            assert p.fake.requests("CreateContainer")[0].endswith(UNKNOWN_FIELD)

    run(main)


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_failing_pre_hook_and_failure_policy(short_socket_dir: Path, policy: str) -> None:
    broken = Behaviour(error=(grpc.StatusCode.INTERNAL, "plugin exploded"))
    plugins: Plugins = {"10-bad.json": (("PreRunPodSandbox",), policy, {"PreRunPodSandbox": broken})}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            if policy == "Fail":
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await p.run_pod(extra=UNKNOWN_FIELD)
                assert info.value.code() == grpc.StatusCode.UNKNOWN
                for part in ("10-bad.json", "PreRunPodSandbox", "plugin exploded", "prod/web"):
                    assert part in (info.value.details() or "")
                assert p.fake.requests("RunPodSandbox") == [], "the backend never saw the call"
                assert p.store.sizes() == (0, 0)
            else:
                sid = await p.run_pod(extra=UNKNOWN_FIELD)
                assert p.fake.requests("RunPodSandbox")[0].endswith(UNKNOWN_FIELD)
                assert p.store.get_pod(sid) is not None

    run(main)


def test_post_hooks_run_after_the_backend_and_never_fail_the_call(short_socket_dir: Path) -> None:
    broken = Behaviour(error=(grpc.StatusCode.INTERNAL, "post exploded"))
    posts = ("PostStartContainer", "PostStopContainer", "PostStopPodSandbox")
    plugins: Plugins = {"10-post.json": (posts, "Fail", dict.fromkeys(posts, broken))}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            sid = await p.run_pod()
            cid = await p.create(sid)
            await p.start(cid)
            await p.call("StopContainer", cri.StopContainerRequest(container_id=cid), cri.StopContainerResponse)
            await p.call("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=sid), cri.StopPodSandboxResponse)
            assert p.plugins["10-post.json"].hooks_seen() == list(posts)
            assert p.fake.containers[cid].state == cri.CONTAINER_EXITED
            (post_start,) = p.plugins["10-post.json"].requests("PostStartContainer")
            assert post_start.container_meta.id == cid

    run(main)


def test_backend_failure_skips_post_hooks_and_keeps_the_store(short_socket_dir: Path) -> None:
    plugins: Plugins = {"10-a.json": (("PostStartContainer",), "Ignore", {})}

    async def main() -> None:
        async with proxy(short_socket_dir, plugins) as p:
            cid = await p.create(await p.run_pod())
            p.fake.fail["StartContainer"] = (grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await p.start(cid)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")
            assert p.plugins["10-a.json"].hooks_seen() == []
            assert p.store.sizes() == (1, 1)

    run(main)


def test_remove_calls_drop_store_records(short_socket_dir: Path) -> None:
    async def main() -> None:
        async with proxy(short_socket_dir) as p:
            sid = await p.run_pod()
            cid = await p.create(sid)
            await p.create(sid)
            assert p.store.sizes() == (1, 2)
            await p.call("RemoveContainer", cri.RemoveContainerRequest(container_id=cid), cri.RemoveContainerResponse)
            assert p.store.sizes() == (1, 1)
            await p.call("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=sid),
                         cri.RemovePodSandboxResponse)
            assert p.store.sizes() == (0, 0)

    run(main)


def test_hook_points_cover_every_intercepted_method() -> None:
    """Every hook point rides on a method the CRI server intercepts."""
    assert {h.cri_method for h in HookPoint} <= set(LIFECYCLE)

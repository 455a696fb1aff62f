"""RuntimeHookServer over a real socket, called with a client built from our generated stubs."""

import os
import socket
import stat

import grpc
import pytest

from koord.apis.runtime.v1alpha1 import api_pb2, api_pb2_grpc
from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.runtimehooks.hooks import Hooks
from koord.koordlet.runtimehooks.protocol import ContainerContext, PodContext
from koord.koordlet.runtimehooks.server import RuntimeHookServer
from koord.testing.cgroupfs import make_fake_v1_cgroup

META = api_pb2.PodSandboxMetadata(name="web", namespace="prod", uid="u1")
CONTAINER_META = api_pb2.ContainerMetadata(name="c1", id="cid1")
PARENT = "/kubepods/besteffort/podu1"


@pytest.fixture
def serve():
    started = []

    def start(hooks, **kw):
        server = RuntimeHookServer(hooks, **kw)
        server.start()
        started.append(server)
        target = ("unix:" + server.endpoint) if server.network == "unix" else server.endpoint
        channel = grpc.insecure_channel(target)
        started.append(channel)
        return server, api_pb2_grpc.RuntimeHookServiceStub(channel)

    yield start
    for s in reversed(started):
        s.close() if isinstance(s, grpc.Channel) else s.stop(0)


def request_for(stage: HookPoint):
    if stage.is_pod:
        return api_pb2.PodSandboxHookRequest(pod_meta=META, cgroup_parent=PARENT,
                                             labels={"koordinator.sh/qosClass": "BE"})
    return api_pb2.ContainerResourceHookRequest(
        pod_meta=META, container_meta=CONTAINER_META, pod_cgroup_parent=PARENT,
        container_envs={"A": "1"})


def call(stub, stage: HookPoint, request=None):
    return getattr(stub, stage.rpc)(request or request_for(stage), timeout=5)


def recording_hooks(seen: list, policy=FailurePolicy.IGNORE) -> Hooks:
    """One function per stage that answers with the stage's name."""
    hooks = Hooks(policy)
    for stage in HookPoint:
        def fn(ctx, stage=stage):
            seen.append((stage, ctx))
            if isinstance(ctx, PodContext):
                ctx.response.annotations["stage"] = stage.value
            else:
                ctx.response.annotations["stage"] = stage.value
                ctx.response.envs["SEEN"] = ctx.request.envs["A"]
        (hooks.register_pod if stage.is_pod else hooks.register_container)(stage, "recorder", "", fn)
    return hooks


def test_every_rpc_runs_its_stage_and_answers(short_socket_dir, serve):
    seen = []
    _, stub = serve(recording_hooks(seen), addr=str(short_socket_dir / "k.sock"))
    for stage in HookPoint:
        response = call(stub, stage)
        if stage.is_pod:
            assert dict(response.annotations) == {"stage": stage.value}
        else:
            assert dict(response.container_annotations) == {"stage": stage.value}
            assert dict(response.container_envs) == {"SEEN": "1"}
    assert [s for s, _ in seen] == list(HookPoint)
    for stage, ctx in seen:
        assert isinstance(ctx, PodContext if stage.is_pod else ContainerContext)
    assert seen[0][1].request.meta.name == "web"
    assert seen[2][1].request.container_id == "cid1"


def test_pod_rpc_answers_pod_changes(short_socket_dir, serve):
    seen = []
    _, stub = serve(recording_hooks(seen), addr=str(short_socket_dir / "k.sock"))
    response = call(stub, HookPoint.PRE_RUN_POD_SANDBOX)
    assert isinstance(response, api_pb2.PodSandboxHookResponse)
    assert dict(response.annotations) == {"stage": "PreRunPodSandbox"}


def test_disabled_stage_answers_empty_without_running_plugins(short_socket_dir, serve):
    seen = []
    server, stub = serve(recording_hooks(seen), addr=str(short_socket_dir / "k.sock"),
                         disabled_stages={HookPoint.PRE_START_CONTAINER})
    assert call(stub, HookPoint.PRE_START_CONTAINER).ByteSize() == 0
    assert seen == []
    assert HookPoint.PRE_START_CONTAINER not in server.stages()
    assert HookPoint.PRE_CREATE_CONTAINER in server.stages()


def _boom(ctx):
    raise RuntimeError("no gpu left")


def test_fail_policy_turns_plugin_failure_into_grpc_error(short_socket_dir, serve):
    hooks = Hooks(FailurePolicy.FAIL)
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "gpu", "", _boom)
    _, stub = serve(hooks, addr=str(short_socket_dir / "k.sock"))
    with pytest.raises(grpc.RpcError) as err:
        call(stub, HookPoint.PRE_CREATE_CONTAINER)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    for part in ("gpu", "PreCreateContainer", "prod/web", "c1", "no gpu left"):
        assert part in err.value.details()


def test_ignore_policy_answers_with_the_plugins_that_worked(short_socket_dir, serve):
    hooks = Hooks(FailurePolicy.IGNORE)
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "gpu", "", _boom)
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "env", "",
                   lambda ctx: ctx.response.envs.update(B="2"))
    _, stub = serve(hooks, addr=str(short_socket_dir / "k.sock"))
    assert dict(call(stub, HookPoint.PRE_CREATE_CONTAINER).container_envs) == {"B": "2"}


def test_socket_dir_created_mode_0660_and_removed_on_stop(short_socket_dir):
    path = short_socket_dir / "deep" / "dir" / "k.sock"
    server = RuntimeHookServer(Hooks(), addr="unix://" + str(path))
    server.start()
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
    finally:
        server.stop(0)
    assert not path.exists()


def test_stale_socket_is_replaced(short_socket_dir, serve):
    path = short_socket_dir / "k.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    seen = []
    _, stub = serve(recording_hooks(seen), addr=str(path))
    call(stub, HookPoint.PRE_RUN_POD_SANDBOX)
    assert len(seen) == 1


def test_plain_file_at_socket_path_is_refused(short_socket_dir):
    path = short_socket_dir / "k.sock"
    path.write_text("not a socket")
    with pytest.raises(OSError, match="not a socket"):
        RuntimeHookServer(Hooks(), addr=str(path)).start()
    assert path.read_text() == "not a socket"


def test_tcp_reports_the_bound_port(serve):
    seen = []
    server, stub = serve(recording_hooks(seen), network="tcp", addr="127.0.0.1:0")
    assert server.endpoint.startswith("127.0.0.1:") and not server.endpoint.endswith(":0")
    call(stub, HookPoint.POST_STOP_CONTAINER)
    assert [s for s, _ in seen] == [HookPoint.POST_STOP_CONTAINER]


def pod_level_hooks() -> Hooks:
    hooks = Hooks()

    def pod(ctx):
        ctx.response.resources.cpu_bvt_warp_ns = -1
        ctx.response.resources.cpu_shares = 512

    def container(ctx):
        ctx.response.resources.cpu_bvt_warp_ns = -1
        ctx.response.resources.cpuset_cpus = "0"

    hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, "t", "", pod)
    hooks.register_container(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, "t", "", container)
    return hooks


def test_proxy_mode_writes_pod_level_values_when_the_pod_cgroup_exists(short_socket_dir, tmp_path, serve):
    make_fake_v1_cgroup(tmp_path, "kubepods/besteffort/podu1/cid1")
    _, stub = serve(pod_level_hooks(), addr=str(short_socket_dir / "k.sock"),
                    executor=CgroupExecutor(tmp_path, version=1))
    response = call(stub, HookPoint.PRE_RUN_POD_SANDBOX)
    assert response.resources.cpu_shares == 512
    pod = tmp_path / "cpu/kubepods/besteffort/podu1"
    assert (pod / "cpu.bvt_warp_ns").read_text() == "-1"
    assert (pod / "cpu.shares").read_text() == "512"
    response = call(stub, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    assert response.container_resources.cpuset_cpus == "0"
    assert (pod / "cid1" / "cpu.bvt_warp_ns").read_text() == "-1"
    # cpuset travels in the response for the proxy; the server writes only what the proxy cannot
    assert (tmp_path / "cpuset/kubepods/besteffort/podu1/cid1/cpuset.cpus").read_text() == "0-1\n"


def test_proxy_mode_leaves_missing_pod_cgroup_to_the_reconciler(short_socket_dir, tmp_path, serve):
    (tmp_path / "cpu").mkdir()
    _, stub = serve(pod_level_hooks(), addr=str(short_socket_dir / "k.sock"),
                    executor=CgroupExecutor(tmp_path, version=1))
    assert call(stub, HookPoint.PRE_RUN_POD_SANDBOX).resources.cpu_shares == 512
    assert os.listdir(tmp_path / "cpu") == []

"""koord.pluginsdk: decorators -> registration; typed requests -> responses over a socket."""

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from koord.apis.runtime.v1alpha1 import api_pb2, api_pb2_grpc
from koord.pluginsdk import (
    ContainerRequest,
    ContainerResponse,
    HookPoint,
    PodRequest,
    PodResponse,
    Resources,
    RuntimePluginServer,
)
from koord_testing.processes import stop_process

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gpu_env_plugin.py"
WAIT = 20.0

CONTAINER = api_pb2.ContainerResourceHookRequest(
    pod_meta=api_pb2.PodSandboxMetadata(name="train", namespace="ml", uid="u1"),
    container_meta=api_pb2.ContainerMetadata(name="worker"),
    pod_annotations={"scheduling.koordinator.sh/device-allocated":
                     '{"gpu":[{"minor":0},{"minor":3}]}'},
    container_envs={"PATH": "/bin"})
POD = api_pb2.PodSandboxHookRequest(pod_meta=CONTAINER.pod_meta, labels={"app": "x"})


@pytest.fixture
def running(short_socket_dir):
    plugins = []

    def start(plugin):
        plugin.start(short_socket_dir / "hookserver.d")
        plugins.append(plugin)
        channel = grpc.insecure_channel("unix:" + plugin.server.endpoint)
        plugins.append(channel)
        return api_pb2_grpc.RuntimeHookServiceStub(channel)

    yield start
    for p in reversed(plugins):
        p.close() if isinstance(p, grpc.Channel) else p.stop()


def test_registration_lists_exactly_the_decorated_stages(short_socket_dir, running):
    plugin = RuntimePluginServer("demo", endpoint=str(short_socket_dir / "demo.sock"), failure_policy="Fail")

    @plugin.pre_run_pod_sandbox
    def label(req: PodRequest) -> PodResponse:
        return PodResponse(labels={"seen": req.meta.name})

    @plugin.post_start_container
    def nothing(req: ContainerRequest) -> None:
        return None

    running(plugin)
    assert json.loads((short_socket_dir / "hookserver.d" / "demo.json").read_text()) == {
        "remote-endpoint": str(short_socket_dir / "demo.sock"), "failure-policy": "Fail",
        "runtime-hooks": ["PreRunPodSandbox", "PostStartContainer"]}
    assert label.__name__ == "label"  # decorators return the handler unchanged


def test_every_decorator_serves_its_rpc(short_socket_dir, running):
    plugin = RuntimePluginServer("all", endpoint=str(short_socket_dir / "all.sock"))
    decorators = {
        HookPoint.PRE_RUN_POD_SANDBOX: plugin.pre_run_pod_sandbox,
        HookPoint.POST_STOP_POD_SANDBOX: plugin.post_stop_pod_sandbox,
        HookPoint.PRE_CREATE_CONTAINER: plugin.pre_create_container,
        HookPoint.PRE_START_CONTAINER: plugin.pre_start_container,
        HookPoint.POST_START_CONTAINER: plugin.post_start_container,
        HookPoint.POST_STOP_CONTAINER: plugin.post_stop_container,
        HookPoint.PRE_UPDATE_CONTAINER_RESOURCES: plugin.pre_update_container_resources,
    }
    for stage, decorate in decorators.items():
        if stage.is_pod:
            decorate(lambda req, stage=stage: PodResponse(annotations={"stage": stage.value}))
        else:
            decorate(lambda req, stage=stage: ContainerResponse(annotations={"stage": stage.value}))
    stub = running(plugin)
    for stage in HookPoint:
        request = POD if stage.is_pod else CONTAINER
        response = getattr(stub, stage.rpc)(request, timeout=5)
        got = response.annotations if stage.is_pod else response.container_annotations
        assert dict(got) == {"stage": stage.value}


def test_handlers_of_one_stage_merge_in_order(short_socket_dir, running):
    plugin = RuntimePluginServer("two", endpoint=str(short_socket_dir / "two.sock"))

    @plugin.pre_create_container
    def first(req):
        return ContainerResponse(envs={"A": "1", "B": "1"}, resources=Resources(cpu_shares=100))

    @plugin.pre_create_container
    def second(req):
        return ContainerResponse(envs={"B": req.envs["PATH"]})

    response = running(plugin).PreCreateContainerHook(CONTAINER, timeout=5)
    assert dict(response.container_envs) == {"A": "1", "B": "/bin"}
    assert response.container_resources.cpu_shares == 100


def test_handler_failure_and_wrong_return_type_fail_the_call(short_socket_dir, running):
    plugin = RuntimePluginServer("bad", endpoint=str(short_socket_dir / "bad.sock"))

    @plugin.pre_create_container
    def explode(req):
        raise RuntimeError("device plugin down")

    @plugin.pre_run_pod_sandbox
    def wrong(req):
        return ContainerResponse()

    stub = running(plugin)
    with pytest.raises(grpc.RpcError) as err:
        stub.PreCreateContainerHook(CONTAINER, timeout=5)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "device plugin down" in err.value.details() and "ml/train" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.PreRunPodSandboxHook(POD, timeout=5)
    assert "wrong" in err.value.details() and "PodResponse" in err.value.details()


def test_no_handlers_and_bad_names_are_refused(short_socket_dir):
    with pytest.raises(ValueError, match="no handlers"):
        RuntimePluginServer("empty", endpoint=str(short_socket_dir / "e.sock")).start(short_socket_dir)
    with pytest.raises(ValueError, match="plugin name"):
        RuntimePluginServer("../escape", endpoint=str(short_socket_dir / "e.sock"))
    assert not list(short_socket_dir.iterdir())


def test_example_gpu_env_plugin_end_to_end(short_socket_dir):
    config = short_socket_dir / "hookserver.d"
    sock = short_socket_dir / "gpu.sock"
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--endpoint", str(sock),
                             "--config-dir", str(config)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT
        while not (config / "gpu-env.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "example did not register"
            time.sleep(0.05)
        assert json.loads((config / "gpu-env.json").read_text())["runtime-hooks"] == ["PreCreateContainer"]
        with grpc.insecure_channel("unix:" + str(sock)) as channel:
            stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
            response = stub.PreCreateContainerHook(CONTAINER, timeout=5)
            assert dict(response.container_envs) == {"NVIDIA_VISIBLE_DEVICES": "0,3"}
            plain = api_pb2.ContainerResourceHookRequest(pod_meta=CONTAINER.pod_meta)
            assert stub.PreCreateContainerHook(plain, timeout=5).ByteSize() == 0
        assert stop_process(proc, timeout=WAIT) == 0
    finally:
        stop_process(proc, timeout=0)
        proc.stderr.close()
    assert not (config / "gpu-env.json").exists()
    assert not sock.exists()


def test_handlers_see_and_answer_every_resource_field(short_socket_dir, running):
    """Swap, oom_score_adj and hugepages travel both ways, not only the fields koordlet writes."""
    plugin = RuntimePluginServer("full", endpoint=str(short_socket_dir / "full.sock"))
    seen = []

    @plugin.pre_update_container_resources
    def double_swap(req: ContainerRequest) -> ContainerResponse:
        seen.append(req.resources)
        return ContainerResponse(resources=Resources(memory_swap_limit=2 * (req.resources.memory_swap_limit or 0),
                                                     oom_score_adj=-10, hugepage_limits={"1GB": 1 << 30}))

    request = api_pb2.ContainerResourceHookRequest()
    request.CopyFrom(CONTAINER)
    request.container_resources.memory_swap_limit_in_bytes = 4096
    request.container_resources.oom_score_adj = 500
    request.container_resources.hugepage_limits.add(page_size="2MB", limit=1 << 21)
    response = running(plugin).PreUpdateContainerResourcesHook(request, timeout=5)
    assert (seen[0].memory_swap_limit, seen[0].oom_score_adj, seen[0].hugepage_limits) == (4096, 500,
                                                                                          {"2MB": 1 << 21})
    res = response.container_resources
    assert (res.memory_swap_limit_in_bytes, res.oom_score_adj) == (8192, -10)
    assert [(h.page_size, h.limit) for h in res.hugepage_limits] == [("1GB", 1 << 30)]

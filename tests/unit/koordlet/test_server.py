"""RuntimeHookServer over a real socket, called with a client built from our generated stubs."""

import json
import os
import socket
import stat
from pathlib import Path

import grpc
import pytest

from koord.apis.runtime.v1alpha1 import api_pb2, api_pb2_grpc
from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins import build_plugins, implemented_gates, parse_rules
from koord.koordlet.runtimehooks.protocol import ContainerContext, PodContext
from koord.koordlet.runtimehooks.server import RuntimeHookServer
from koord_testing.cgroupfs import make_fake_v1_cgroup

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
                    executor=CgroupExecutor(CgroupLayout(tmp_path, version=1)))
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
                    executor=CgroupExecutor(CgroupLayout(tmp_path, version=1)))
    assert call(stub, HookPoint.PRE_RUN_POD_SANDBOX).resources.cpu_shares == 512
    assert os.listdir(tmp_path / "cpu") == []


# ---- hostile requests: every one is a clean gRPC error or a clean answer, never a crash

def koordlet_hooks(tmp_path: Path, policy=FailurePolicy.IGNORE) -> tuple[Hooks, CgroupExecutor]:
    """koordlet's own plugins, default gates, on a fake v1 tree holding the pod's cgroup."""
    make_fake_v1_cgroup(tmp_path, "kubepods/besteffort/podu1/cid1")
    executor = CgroupExecutor(CgroupLayout(tmp_path, version=1))
    hooks = Hooks(policy)
    for plugin in build_plugins(PluginEnv(executor, tmp_path / "sys", tmp_path / "proc"),
                                dict(implemented_gates())):
        plugin.update_rules(parse_rules(None, None))
        plugin.register(hooks)
    return hooks, executor


def batch_cpu(amount: str) -> dict[str, str]:
    return {"node.koordinator.sh/extended-resource-spec": json.dumps({"containers": {"c1": {
        "requests": {"kubernetes.io/batch-cpu": amount}, "limits": {"kubernetes.io/batch-cpu": amount}}}})}


BE_LABELS = {"koordinator.sh/qosClass": "BE"}


@pytest.mark.parametrize("stage, request_msg, field", [
    (HookPoint.PRE_RUN_POD_SANDBOX, api_pb2.PodSandboxHookRequest(
        pod_meta=META, cgroup_parent="/kubepods/../../../etc", labels=BE_LABELS), "cgroup_parent"),
    (HookPoint.PRE_RUN_POD_SANDBOX, api_pb2.PodSandboxHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="p", namespace="n", uid="../../x"), cgroup_parent=PARENT),
     "pod_meta.uid"),
    (HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, api_pb2.ContainerResourceHookRequest(
        pod_meta=META, container_meta=CONTAINER_META, pod_cgroup_parent="kubepods/..", pod_labels=BE_LABELS),
     "pod_cgroup_parent"),
    (HookPoint.POST_START_CONTAINER, api_pb2.ContainerResourceHookRequest(
        pod_meta=META, container_meta=api_pb2.ContainerMetadata(name="c1", id=".."),
        pod_cgroup_parent=PARENT), "container_meta.id"),
    (HookPoint.PRE_CREATE_CONTAINER, api_pb2.ContainerResourceHookRequest(
        pod_meta=META, container_meta=CONTAINER_META, pod_cgroup_parent="/kubepods/x\x00y"),
     "pod_cgroup_parent"),
])
def test_request_escaping_the_cgroup_root_is_invalid_argument(short_socket_dir, tmp_path, serve, stage, request_msg,
                                                               field):
    hooks, executor = koordlet_hooks(tmp_path)
    _, stub = serve(hooks, addr=str(short_socket_dir / "k.sock"), executor=executor)
    with pytest.raises(grpc.RpcError) as err:
        call(stub, stage, request_msg)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert field in err.value.details()


# 10**40 is beyond int64 (the answer could not even be encoded); 1e15 gave shares 1.024e15.
@pytest.mark.parametrize("amount", ["1e30", str(2**63 - 1), str(10**40), "1e15"])
@pytest.mark.parametrize("stage", [HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES])
def test_huge_batch_cpu_never_reaches_a_cgroup_or_the_answer(short_socket_dir, tmp_path, serve, amount, stage):
    hooks, executor = koordlet_hooks(tmp_path)
    _, stub = serve(hooks, addr=str(short_socket_dir / "k.sock"), executor=executor)
    if stage.is_pod:
        request = api_pb2.PodSandboxHookRequest(pod_meta=META, cgroup_parent=PARENT, labels=BE_LABELS,
                                                annotations=batch_cpu(amount))
        resources = call(stub, stage, request).resources
    else:
        request = api_pb2.ContainerResourceHookRequest(
            pod_meta=META, container_meta=CONTAINER_META, pod_cgroup_parent=PARENT, pod_labels=BE_LABELS,
            pod_annotations=batch_cpu(amount))
        resources = call(stub, stage, request).container_resources
    assert resources.cpu_quota in (0, -1) or 1000 <= resources.cpu_quota < 2**44
    assert 0 <= resources.cpu_shares <= 262144
    quota = (tmp_path / "cpu/kubepods/besteffort/podu1/cpu.cfs_quota_us").read_text().strip()
    assert int(quota) < 2**44


def test_huge_batch_cpu_with_fail_policy_names_the_annotation(short_socket_dir, tmp_path, serve):
    hooks, executor = koordlet_hooks(tmp_path, FailurePolicy.FAIL)
    _, stub = serve(hooks, addr=str(short_socket_dir / "k.sock"), executor=executor)
    request = api_pb2.ContainerResourceHookRequest(
        pod_meta=META, container_meta=CONTAINER_META, pod_cgroup_parent=PARENT, pod_labels=BE_LABELS,
        pod_annotations=batch_cpu("1e30"))
    with pytest.raises(grpc.RpcError) as err:
        call(stub, HookPoint.PRE_CREATE_CONTAINER, request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert "extended-resource-spec" in err.value.details() and "batch-cpu" in err.value.details()


@pytest.mark.parametrize("policy", [FailurePolicy.IGNORE, FailurePolicy.FAIL])
def test_out_of_range_answer_from_a_plugin_is_that_plugins_error(short_socket_dir, serve, policy):
    hooks = Hooks(policy)

    def first(ctx):
        ctx.response.envs["FIRST"] = "1"

    def broken(ctx):
        ctx.response.envs["BROKEN"] = "1"
        ctx.response.resources.cpu_quota = 10**32

    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "first", "", first)
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "broken", "", broken)
    _, stub = serve(hooks, addr=str(short_socket_dir / "k.sock"))
    if policy is FailurePolicy.IGNORE:
        answer = call(stub, HookPoint.PRE_CREATE_CONTAINER)
        assert dict(answer.container_envs) == {"FIRST": "1"}, "none of the broken plugin's changes stay"
        assert answer.container_resources.cpu_quota == 0
        return
    with pytest.raises(grpc.RpcError) as err:
        call(stub, HookPoint.PRE_CREATE_CONTAINER)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "broken" in err.value.details() and "cpu_quota" in err.value.details()
    assert "Exception calling application" not in err.value.details()


RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
# A range of 4e9 cpus used to build a 4e9-element set (OOM); \d used to take Arabic-Indic digits.
HOSTILE_CPUSETS = ["0-4000000000", "٣-٥", "١", "0-3,٤"]


@pytest.mark.parametrize("cpuset", HOSTILE_CPUSETS)
def test_hostile_allocated_cpuset_is_invalid_argument_without_memory_growth(
        short_socket_dir, tmp_path, serve, cpuset):
    import tracemalloc

    hooks, executor = koordlet_hooks(tmp_path, FailurePolicy.FAIL)
    _, stub = serve(hooks, addr=str(short_socket_dir / "k.sock"), executor=executor)
    request = api_pb2.ContainerResourceHookRequest(
        pod_meta=META, container_meta=CONTAINER_META, pod_cgroup_parent=PARENT,
        pod_labels={"koordinator.sh/qosClass": "LSR"},
        pod_annotations={RESOURCE_STATUS: json.dumps({"cpuset": cpuset})})
    tracemalloc.start()
    try:
        with pytest.raises(grpc.RpcError) as err:
            call(stub, HookPoint.PRE_CREATE_CONTAINER, request)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert RESOURCE_STATUS in err.value.details()
    assert peak < 1 << 20, f"parsing {cpuset!r} allocated {peak} bytes"


@pytest.mark.parametrize("cpuset", HOSTILE_CPUSETS)
def test_hostile_allocated_cpuset_with_ignore_answers_without_it(short_socket_dir, tmp_path, serve, cpuset):
    hooks, executor = koordlet_hooks(tmp_path)
    _, stub = serve(hooks, addr=str(short_socket_dir / "k.sock"), executor=executor)
    request = api_pb2.ContainerResourceHookRequest(
        pod_meta=META, container_meta=CONTAINER_META, pod_cgroup_parent=PARENT,
        pod_labels={"koordinator.sh/qosClass": "LSR"},
        pod_annotations={RESOURCE_STATUS: json.dumps({"cpuset": cpuset})})
    assert call(stub, HookPoint.PRE_CREATE_CONTAINER, request).container_resources.cpuset_cpus == ""


def test_every_answer_is_counted_by_status_in_koordlets_metrics(short_socket_dir, tmp_path, serve):
    """OK, INVALID_ARGUMENT (a refused request) and per-plugin durations reach Prometheus."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from koord.koordlet.metrics import KoordletMetrics

    metrics = KoordletMetrics("n1")
    hooks, executor = koordlet_hooks(tmp_path)
    hooks.observe = metrics.record_plugin_call
    _, stub = serve(hooks, addr=str(short_socket_dir / "k.sock"), executor=executor,
                    observe=metrics.record_hook_request)
    call(stub, HookPoint.PRE_RUN_POD_SANDBOX)
    with pytest.raises(grpc.RpcError):
        call(stub, HookPoint.PRE_RUN_POD_SANDBOX, api_pb2.PodSandboxHookRequest(
            pod_meta=api_pb2.PodSandboxMetadata(name="x", namespace="y", uid=".."), cgroup_parent=PARENT))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
               for s in f.samples}
    assert samples[("koordlet_runtime_hook_requests_total",
                    (("code", "OK"), ("node", "n1"), ("stage", "PreRunPodSandbox")))] == 1
    assert samples[("koordlet_runtime_hook_requests_total",
                    (("code", "INVALID_ARGUMENT"), ("node", "n1"), ("stage", "PreRunPodSandbox")))] == 1
    counts = {dict(labels)["hook"] for (name, labels), value in samples.items()
              if name == "koordlet_runtime_hook_invoked_duration_milliseconds_count" and value >= 1
              and dict(labels)["status"] == "succeeded" and dict(labels)["stage"] == "PreRunPodSandbox"}
    assert "GroupIdentity" in counts and "BatchResource" in counts

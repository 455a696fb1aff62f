"""koordlet's NRI mode without a runtime: NRI messages to hook requests and back (tables and
hypothesis), and the server's handlers with recording hooks on a fake cgroup tree."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet import flags
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import Resources
from koord.koordlet.runtimehooks.hooks import HookError, Hooks
from koord.koordlet.runtimehooks.nri import SUBSCRIBED, NriOptions, NriServer
from koord.koordlet.runtimehooks.nriconvert import (
    MAX_ENV,
    NriInputError,
    adjustment,
    container_request,
    linux_resources,
    pod_request,
    resources_of,
    update,
)
from koord.koordlet.runtimehooks.plugins.coresched import CPU_IDLE
from koord.koordlet.runtimehooks.protocol import ContainerContext, ContainerResponse, PodContext
from koord.nri import api_pb2 as api
from koord.nri import events
from koord_testing.cgroupfs import make_fake_v1_cgroup

PARENT = "/kubepods/besteffort/podu1"


def pod(**overrides: object) -> api.PodSandbox:
    msg = api.PodSandbox(id="s1", name="web", namespace="prod", uid="u1", labels={"koordinator.sh/qosClass": "BE"},
                         annotations={"a": "1"}, runtime_handler="runc")
    msg.linux.cgroup_parent = PARENT
    msg.linux.pod_resources.cpu.shares.value = 2
    for key, value in overrides.items():
        setattr(msg, key, value)
    return msg


def container(env: tuple[str, ...] = ("A=1", "B=x=y")) -> api.Container:
    msg = api.Container(id="c1", pod_sandbox_id="s1", name="app", annotations={"c": "2"}, env=list(env),
                        state=api.CONTAINER_RUNNING)
    msg.linux.resources.cpu.shares.value = 2
    msg.linux.resources.cpu.quota.value = 20000
    msg.linux.resources.memory.limit.value = 1 << 30
    msg.linux.oom_score_adj.value = 1000
    return msg


# ------------------------------------------------------------------ conversions


def test_pod_and_container_requests_carry_what_the_proxy_carries() -> None:
    req = pod_request(pod())
    assert (str(req.meta), req.meta.uid, req.cgroup_parent, req.runtime_handler) == ("prod/web", "u1", PARENT, "runc")
    assert req.labels == {"koordinator.sh/qosClass": "BE"} and req.annotations == {"a": "1"}
    assert req.resources.cpu_shares == 2
    creq = container_request(pod(), container())
    assert (creq.container_name, creq.container_id, creq.pod_cgroup_parent) == ("app", "c1", PARENT)
    assert creq.envs == {"A": "1", "B": "x=y"}
    assert creq.container_annotations == {"c": "2"} and creq.pod_annotations == {"a": "1"}
    assert (creq.resources.cpu_shares, creq.resources.cpu_quota, creq.resources.memory_limit,
            creq.resources.oom_score_adj) == (2, 20000, 1 << 30, 1000)
    assert creq.resources.cpu_period is None  # unset in NRI stays unset


def test_an_update_request_carries_the_new_resources() -> None:
    new = api.LinuxResources()
    new.cpu.shares.value = 700
    assert container_request(pod(), container(), new).resources.cpu_shares == 700


@pytest.mark.parametrize(("env", "problem"), [
    (("NOEQUALS",), "is not KEY=VALUE"),
    (("=value",), "is not KEY=VALUE"),
    (("A=1",) * (MAX_ENV + 1), f"more than {MAX_ENV}"),
])
def test_a_malformed_environment_is_refused_naming_the_field(env: tuple[str, ...], problem: str) -> None:
    with pytest.raises(NriInputError, match=f"container.env: .*{problem}"):
        container_request(pod(), container(env))


RESOURCE_CASES = [
    (Resources(), None),
    (Resources(cpu_shares=512, cpu_quota=50000, cpu_period=100000),
     {"cpu": {"shares": {"value": "512"}, "quota": {"value": "50000"}, "period": {"value": "100000"}}}),
    (Resources(cpuset_cpus="0-1", cpuset_mems="0"), {"cpu": {"cpus": "0-1", "mems": "0"}}),
    (Resources(memory_limit=1 << 31, memory_swap_limit=-1),
     {"memory": {"limit": {"value": str(1 << 31)}, "swap": {"value": "-1"}}}),
    (Resources(unified={"memory.high": "100"}, hugepage_limits={"2MB": 4 << 20}),
     {"unified": {"memory.high": "100"}, "hugepageLimits": [{"pageSize": "2MB", "limit": str(4 << 20)}]}),
    # koordlet-only values never travel to the runtime
    (Resources(cpu_bvt_warp_ns=2, files={CPU_IDLE: 1}), None),
]


@pytest.mark.parametrize(("res", "wire"), RESOURCE_CASES)
def test_resources_to_nri_and_back(res: Resources, wire: dict[str, object] | None) -> None:
    from google.protobuf.json_format import MessageToDict

    msg = linux_resources(res)
    assert (MessageToDict(msg) if msg is not None else None) == wire
    if msg is not None and res.cpu_bvt_warp_ns is None:
        assert resources_of(msg) == res


def test_an_adjustment_carries_envs_annotations_resources_oom_score_adj_and_rdt_class() -> None:
    response = ContainerResponse(annotations={"k": "v"}, envs={"E": "1"}, rdt_class="koordlet-u1",
                                 resources=Resources(cpu_shares=512, oom_score_adj=-998), pod_cgroup_parent="/other")
    adj = adjustment(response)
    assert adj.linux.resources.rdt_class.value == "koordlet-u1"
    assert not adjustment(ContainerResponse()).linux.resources.HasField("rdt_class")
    assert [(kv.key, kv.value) for kv in adj.env] == [("E", "1")]
    assert dict(adj.annotations) == {"k": "v"}
    assert adj.linux.resources.cpu.shares.value == 512
    assert adj.linux.oom_score_adj.value == -998
    assert not adj.linux.cgroups_path  # a moved cgroup parent has no NRI form
    assert update("c1", ContainerResponse()) is None
    found = update("c1", response)
    assert found is not None and found.container_id == "c1" and found.linux.resources.cpu.shares.value == 512
    # a running container keeps its class: the reconciler moves its threads, no update moves it
    assert not found.linux.resources.HasField("rdt_class")
    assert update("c1", ContainerResponse(rdt_class="koordlet-u1")) is None


@given(st.binary(max_size=2048), st.binary(max_size=2048))
def test_any_nri_messages_make_a_request_or_a_clear_refusal(pod_bytes: bytes, ctr_bytes: bytes) -> None:
    try:
        p, c = api.PodSandbox.FromString(pod_bytes), api.Container.FromString(ctr_bytes)
    except Exception:
        return  # not a message at all: the wire layer refuses it before koordlet sees it
    pod_request(p)
    try:
        container_request(p, c)
    except NriInputError as exc:
        assert str(exc).startswith("container.env")


# ------------------------------------------------------------------ the server's handlers


def options(**overrides: object) -> NriOptions:
    args = flags.build_parser().parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return NriOptions.from_args(args)


def recording(policy: FailurePolicy = FailurePolicy.IGNORE, fail: bool = False) -> tuple[Hooks, list[HookPoint]]:
    seen: list[HookPoint] = []
    hooks = Hooks(policy)

    def on_pod(ctx: PodContext, stage: HookPoint) -> None:
        seen.append(stage)
        ctx.response.resources = Resources(cpu_shares=1536)

    def on_container(ctx: ContainerContext, stage: HookPoint) -> None:
        seen.append(stage)
        if fail:
            raise RuntimeError("plugin broke")
        ctx.response.resources = Resources(cpu_shares=512, cpu_quota=50000)
        ctx.response.envs["SEEN"] = ctx.request.envs.get("A", "")

    for stage in HookPoint:
        if stage.is_pod:
            hooks.register_pod(stage, "rec", "", lambda ctx, s=stage: on_pod(ctx, s))
        else:
            hooks.register_container(stage, "rec", "", lambda ctx, s=stage: on_container(ctx, s))
    return hooks, seen


def server(tmp_path: Path, hooks: Hooks, **kw: object) -> NriServer:
    return NriServer(hooks, CgroupExecutor(CgroupLayout(tmp_path, version=1)), options(), **kw)  # type: ignore[arg-type]


def test_flags_are_upstreams_and_the_socket_is_joined_under_var_run_root_dir() -> None:
    opts = options()
    assert (opts.enabled, opts.socket_path, opts.plugin_name, opts.plugin_index) == (
        True, "/var/run/nri/nri.sock", "koordlet_nri", "00")
    assert opts.backoff_cap == ((1 << 62) - 1) / 1e9
    assert (opts.connect_timeout, opts.backoff, opts.backoff_factor, opts.backoff_steps) == (6.0, 1.0, 2.0, 2147483647)
    args = flags.parse_args(["-enable-nri-runtime-hook=false", "-var-run-root-dir=/var/run",
                                            "-runtime-hooks-nri-socket-path=/nri/x.sock"])
    assert NriOptions.from_args(args).socket_path == "/var/run/nri/x.sock"
    assert not NriOptions.from_args(args).enabled


def test_inside_upstreams_daemonset_the_socket_is_under_host_var_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("agent_mode", "dsMode")
    args = flags.parse_args(["-cgroup-root-dir=/sys/fs/cgroup"])  # the DaemonSet's /host-cgroup/ is not here
    assert NriOptions.from_args(args).socket_path == "/host-var-run/nri/nri.sock"


@pytest.mark.parametrize("flag", ["-runtime-hooks-nri-plugin-index=1", "-runtime-hooks-nri-plugin-name=a/b",
                                  "-runtime-hooks-nri-backoff-factor=0", "-runtime-hooks-nri-backoff-factor=nan",
                                  "-runtime-hooks-nri-connect-timeout=-1s"])
def test_bad_nri_flags_are_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        flags.parse_args([flag])
    assert flag.split("=")[0].lstrip("-") in capsys.readouterr().err


def test_configure_subscribes_upstreams_events(tmp_path: Path) -> None:
    hooks, _ = recording()
    handlers = server(tmp_path, hooks).stub.handlers
    assert handlers.configure is not None
    assert events.names(handlers.configure(api.ConfigureRequest())) == events.names(SUBSCRIBED) == [
        "RUN_POD_SANDBOX", "REMOVE_POD_SANDBOX", "CREATE_CONTAINER", "UPDATE_CONTAINER"]


def test_create_update_and_synchronize_answer_what_the_plugins_answered(tmp_path: Path) -> None:
    hooks, seen = recording()
    handlers = server(tmp_path, hooks).stub.handlers
    assert handlers.create_container and handlers.update_container and handlers.synchronize
    adj = handlers.create_container(pod(), container())
    assert isinstance(adj, api.ContainerAdjustment)
    assert adj.linux.resources.cpu.shares.value == 512 and [(e.key, e.value) for e in adj.env] == [("SEEN", "1")]
    updates = handlers.update_container(pod(), container(), api.LinuxResources())
    assert [u.linux.resources.cpu.quota.value for u in updates or []] == [50000]
    stopped = container()
    stopped.id, stopped.state = "c2", api.CONTAINER_STOPPED
    synced = handlers.synchronize([pod()], [container(), stopped])
    assert [(u.container_id, u.ignore_failure) for u in synced or []] == [("c1", True)]
    assert seen == [HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES,
                    HookPoint.PRE_CREATE_CONTAINER]


def test_run_pod_sandbox_writes_the_pod_level_and_remove_runs_post_stop(tmp_path: Path) -> None:
    hooks, seen = recording()
    cpu_dir = make_fake_v1_cgroup(tmp_path, "kubepods/besteffort/podu1")
    handlers = server(tmp_path, hooks).stub.handlers
    assert handlers.run_pod_sandbox and handlers.remove_pod_sandbox
    handlers.run_pod_sandbox(pod())
    assert (cpu_dir / "cpu.shares").read_text().strip() == "1536"
    handlers.remove_pod_sandbox(pod())
    assert seen == [HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.POST_STOP_POD_SANDBOX]


@pytest.mark.parametrize(("policy", "raises"), [(FailurePolicy.IGNORE, False), (FailurePolicy.FAIL, True)])
def test_failing_plugin_and_bad_input_follow_the_plugin_failure_policy(
        tmp_path: Path, policy: FailurePolicy, raises: bool, caplog: pytest.LogCaptureFixture) -> None:
    hooks, _ = recording(policy, fail=True)
    handlers = server(tmp_path, hooks).stub.handlers
    assert handlers.create_container is not None
    escaping = pod()
    escaping.linux.cgroup_parent = "/kubepods/../../etc"
    cases = (((pod(), container()), HookError, "plugin broke"), ((escaping, container()), NriInputError, "'..'"),
             ((pod(), container(("BAD",))), NriInputError, "KEY=VALUE"))
    for args, error, message in cases:
        if raises:
            with pytest.raises(error, match=message):
                handlers.create_container(*args)
        else:
            adj = handlers.create_container(*args)
            assert adj is None or not adj.linux.resources.ByteSize()
    with caplog.at_level(logging.WARNING):
        server(tmp_path, recording()[0]).stub.handlers.create_container(escaping, container())  # type: ignore[misc]
    assert "prod/web container app: bad request, no hooks run" in caplog.text and "'..'" in caplog.text


def test_a_disabled_stage_answers_no_changes(tmp_path: Path) -> None:
    hooks, seen = recording()
    handlers = server(tmp_path, hooks, disabled_stages=[HookPoint.PRE_CREATE_CONTAINER]).stub.handlers
    assert handlers.create_container is not None
    assert handlers.create_container(pod(), container()) is None
    assert seen == []


"""Hooks framework: registration order is run order; the plugin failure policy."""

import pytest

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.runtimehooks.hooks import HookError, Hooks
from koord.koordlet.runtimehooks.protocol import (
    ContainerContext,
    ContainerRequest,
    HookPodMeta,
    PodContext,
    PodRequest,
)


def _ctx() -> ContainerContext:
    return ContainerContext(ContainerRequest(pod_meta=HookPodMeta(name="web", namespace="prod"),
                                             container_name="c1"))


def test_functions_run_in_registration_order_and_later_refines():
    hooks = Hooks()
    calls = []
    for name in ("first", "second", "third"):
        def fn(ctx, name=name):
            calls.append(name)
            ctx.response.envs["WHO"] = name
        hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, name, "", fn)
    ctx = _ctx()
    assert hooks.run(HookPoint.PRE_CREATE_CONTAINER, ctx) == []
    assert calls == ["first", "second", "third"]
    assert ctx.response.envs == {"WHO": "third"}


def test_only_the_stage_functions_run():
    hooks = Hooks()
    calls = []
    hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, "p", "", lambda ctx: calls.append("pod"))
    hooks.register_container(HookPoint.PRE_START_CONTAINER, "p", "", lambda ctx: calls.append("start"))
    hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, PodContext(PodRequest()))
    assert calls == ["pod"]
    assert hooks.stages() == {HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_START_CONTAINER}
    assert hooks.registrations(HookPoint.PRE_START_CONTAINER) == [("p", "")]


def _boom(ctx):
    raise RuntimeError("boom")


def test_ignore_policy_runs_the_rest_and_reports():
    hooks = Hooks(FailurePolicy.IGNORE)
    calls = []
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "bad", "", _boom)
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "good", "", lambda ctx: calls.append("good"))
    errors = hooks.run(HookPoint.PRE_CREATE_CONTAINER, _ctx())
    assert calls == ["good"]
    assert [(p, str(e)) for p, e in errors] == [("bad", "boom")]


def test_fail_policy_stops_at_first_failure_naming_plugin_stage_and_pod():
    hooks = Hooks(FailurePolicy.FAIL)
    calls = []
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "bad", "", _boom)
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "good", "", lambda ctx: calls.append("good"))
    with pytest.raises(HookError) as err:
        hooks.run(HookPoint.PRE_CREATE_CONTAINER, _ctx())
    assert calls == []
    for part in ("bad", "PreCreateContainer", "prod/web", "c1", "boom"):
        assert part in str(err.value)


def test_stage_names_match_registration_and_rpc_names():
    assert [s.value for s in HookPoint if s.is_pod] == ["PreRunPodSandbox", "PostStopPodSandbox"]
    assert HookPoint.PRE_UPDATE_CONTAINER_RESOURCES.rpc == "PreUpdateContainerResourcesHook"
    assert len(HookPoint) == 7


@pytest.mark.parametrize("stage", list(HookPoint), ids=lambda s: s.value)
def test_a_function_of_the_wrong_kind_is_refused_at_registration(stage):
    hooks = Hooks()
    wrong = hooks.register_container if stage.is_pod else hooks.register_pod
    with pytest.raises(ValueError, match=f"plugin p: {stage.value} is a {'pod' if stage.is_pod else 'container'}"):
        wrong(stage, "p", "", lambda ctx: None)
    assert hooks.stages() == set()


def test_running_a_stage_on_the_wrong_context_is_a_type_error():
    hooks = Hooks()
    with pytest.raises(TypeError, match="PreRunPodSandbox runs on a PodContext"):
        hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, _ctx())


def test_observer_is_told_each_plugin_call_and_cannot_change_the_answer():
    seen = []

    def observe(plugin, stage, ok, seconds):
        seen.append((plugin, stage, ok))
        assert seconds >= 0
        raise RuntimeError("metrics exploded")

    hooks = Hooks(FailurePolicy.IGNORE, observe=observe)
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "bad", "", _boom)
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "good", "",
                             lambda ctx: ctx.response.envs.update(WHO="good"))
    ctx = _ctx()
    errors = hooks.run(HookPoint.PRE_CREATE_CONTAINER, ctx)
    assert seen == [("bad", HookPoint.PRE_CREATE_CONTAINER, False), ("good", HookPoint.PRE_CREATE_CONTAINER, True)]
    assert [p for p, _ in errors] == ["bad"]
    assert ctx.response.envs == {"WHO": "good"}


def _scribble_and_fail(ctx):
    """Changes every level of the answer, then fails: none of it may stay."""
    res = ctx.response.resources
    ctx.response.annotations["a"] = "changed"
    ctx.response.envs["E"] = "changed"
    ctx.response.pod_cgroup_parent = "/elsewhere"
    res.cpu_shares, res.cpuset_cpus = 2, "9"
    res.unified["memory.high"] = "changed"
    res.hugepage_limits["2MB"] = 0
    raise RuntimeError("boom")


def test_a_failed_plugins_changes_at_any_depth_are_dropped():
    hooks = Hooks(FailurePolicy.IGNORE)

    def first(ctx):
        ctx.response.annotations["a"] = "1"
        ctx.response.envs["E"] = "1"
        ctx.response.resources.unified["memory.high"] = "1G"
        ctx.response.resources.hugepage_limits["2MB"] = 1 << 21
        ctx.response.resources.cpu_shares = 512
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "first", "", first)
    hooks.register_container(HookPoint.PRE_CREATE_CONTAINER, "bad", "", _scribble_and_fail)
    ctx = _ctx()
    hooks.run(HookPoint.PRE_CREATE_CONTAINER, ctx)
    want = _ctx()
    first(want)
    assert ctx.response == want.response

"""Property-based: random annotations, cpusets, quantities and NodeSLO/Node documents fed to
the shared parsers and to every koordlet plugin through the hooks framework and the server.

The property is the same everywhere: a valid value or a clean, named error; never an
unexpected exception, never an answer or cgroup write outside what the kernel accepts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koord import cgrouplimits, documents
from koord.apis.runtime.v1alpha1 import api_pb2
from koord.hookapi import FailurePolicy, HookPoint, parse_cpuset
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupError, CgroupExecutor
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins import build_plugins, implemented_gates, parse_rules
from koord.koordlet.runtimehooks.plugins.cpusetrule import CPUSET
from koord.koordlet.runtimehooks.plugins.groupidentity import GROUP_IDENTITY
from koord.koordlet.runtimehooks.protocol import ContainerContext, ContainerRequest, HookPodMeta
from koord.koordlet.runtimehooks.rule import RuleError
from koord.koordlet.runtimehooks.server import RuntimeHookServer
from koord.runtimeproxy import convert
from koord_testing.cgroupfs import make_fake_v1_cgroup

PARENT = "kubepods/besteffort/poduid1"
CONTAINER_ID = "cid1"
SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ---- strategies -------------------------------------------------------------------------

cpu_texts = st.one_of(
    st.text(alphabet="0123456789-, ١٣٥\n", max_size=30),
    st.builds(lambda a, b: f"{a}-{b}", st.integers(0, 2**40), st.integers(0, 2**40)),
    st.sampled_from(["0-4000000000", "٣-٥", "١", "0-3,5", "", "7"]),
)
quantities = st.one_of(
    st.text(alphabet="0123456789.eE+-mkKMGTPiun", max_size=20),
    st.integers(-(2**70), 2**70),
    st.integers(0, 2**63 - 1).map(str),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(1, 99), st.integers(0, 40)),
    st.sampled_from(["1e30", str(2**63 - 1), str(10**40), "1e15", "500", "2Gi", "1e999999999", "١٠٠"]),
    st.floats(allow_nan=True), st.none(), st.booleans(),
)
# Well-formed and within int64, so they reach BatchResource's arithmetic; many are huge.
valid_quantities = st.one_of(
    st.integers(0, 2**63 - 1).map(str),
    st.integers(0, 10**6).map(str),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(1, 9), st.integers(0, 18)),
    st.sampled_from(["1e15", str(2**63 - 1), "500m", "2Gi", "8Ei", "1"]),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


def _dumps(value: object) -> str:
    return json.dumps(value, allow_nan=True)


@st.composite
def pod_annotations(draw: st.DrawFn) -> dict[str, str]:
    """Koordinator's annotations, each either absent, well-shaped with hostile values, or random JSON."""
    def amounts() -> dict[str, object]:
        # Each amount may be missing: one malformed amount fails the plugin before it computes.
        return {key: draw(valid_quantities if draw(st.booleans()) else quantities)
                for key in ("kubernetes.io/batch-cpu", "kubernetes.io/batch-memory") if draw(st.booleans())}

    batch = {"containers": {"c1": {"requests": amounts(), "limits": amounts()}}}
    shaped = {
        "node.koordinator.sh/extended-resource-spec": batch,
        "scheduling.koordinator.sh/resource-status": {"cpuset": draw(cpu_texts)},
        "scheduling.koordinator.sh/device-allocated": {"gpu": [{"minor": draw(json_values)}]},
        "koordinator.sh/cpuQOS": {"enable": draw(json_values), "groupIdentity": draw(json_values)},
        "node.koordinator.sh/resctrl": {"llc": {"schemata": {"range": draw(json_values)}},
                                        "mb": {"schemata": {"percent": draw(json_values)}}},
    }
    out = {}
    for key, value in shaped.items():
        kind = draw(st.sampled_from(["shaped", "shaped", "shaped", "absent", "random", "text"]))
        if kind == "shaped":
            out[key] = _dumps(value)
        elif kind == "random":
            out[key] = _dumps(draw(json_values))
        elif kind == "text":
            out[key] = draw(st.text(max_size=20))
    return out


# BE twice: BatchResource, the plugin turning quantities into cgroup values, serves only BE pods.
qos_labels = st.sampled_from(["BE", "BE", "LSE", "LSR", "LS", "SYSTEM", "", "bogus"]).map(
    lambda q: {"koordinator.sh/qosClass": q} if q else {})


# ---- a koordlet with every plugin on a fake node ------------------------------------------

def node_with_everything(root: Path) -> CgroupExecutor:
    make_fake_v1_cgroup(root / "cgroup", f"{PARENT}/{CONTAINER_ID}")
    make_fake_v1_cgroup(root / "cgroup", "kubepods")  # group identity is supported here
    resctrl = root / "sys" / "fs" / "resctrl"
    (resctrl / "info" / "L3").mkdir(parents=True, exist_ok=True)
    (resctrl / "info" / "L3" / "cbm_mask").write_text("fff\n")
    (resctrl / "schemata").write_text("L3:0=fff\nMB:0=100\n")
    return CgroupExecutor(CgroupLayout(root / "cgroup", version=1))


def all_plugin_hooks(root: Path, policy: FailurePolicy, node: dict | None = None) -> tuple[Hooks, CgroupExecutor]:
    executor = node_with_everything(root)
    hooks = Hooks(policy)
    gates = {name: True for name in implemented_gates()}
    rules = parse_rules(None, node)
    for plugin in build_plugins(PluginEnv(executor, root / "sys" / "fs", root / "proc"), gates):
        plugin.update_rules(rules)
        plugin.register(hooks)
    return hooks, executor


NODE = {"metadata": {"annotations": {
    "node.koordinator.sh/cpu-shared-pools": '[{"socket":0,"node":0,"cpuset":"0-7"}]',
    "node.koordinator.sh/cpu-normalization-ratio": "1.5"}}}


def assert_answer_within_kernel_limits(resources) -> None:
    assert resources.problems("resources") == []
    for name in ("cpuset_cpus", "cpuset_mems"):
        value = getattr(resources, name)
        if value is not None:
            parse_cpuset(value)  # ASCII, bounded: raises if not


def written_values_within_limits(executor: CgroupExecutor, cgroup_dir: str) -> None:
    for resource, kind in (("cpu_shares", cgrouplimits.Kind.SHARES), ("cpu_quota", cgrouplimits.Kind.QUOTA),
                           ("cpu_period", cgrouplimits.Kind.PERIOD), ("cpu_bvt_warp_ns", cgrouplimits.Kind.BVT)):
        assert cgrouplimits.problem(kind, int(executor.read(cgroup_dir, resource))) is None
    parse_cpuset(executor.read(cgroup_dir, "cpuset_cpus"))


# ---- properties ---------------------------------------------------------------------------

@pytest.mark.parametrize("policy", [FailurePolicy.IGNORE, FailurePolicy.FAIL])
@SETTINGS
@given(annotations=pod_annotations(), labels=qos_labels,
       stage=st.sampled_from([HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER,
                              HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, HookPoint.POST_START_CONTAINER]))
def test_every_plugin_answers_within_limits_or_fails_cleanly(tmp_path_factory, policy, annotations, labels,
                                                             stage) -> None:
    root = tmp_path_factory.mktemp("node")
    hooks, executor = all_plugin_hooks(root, policy, NODE)
    server = RuntimeHookServer(hooks, addr=str(root / "unused.sock"), executor=executor)
    meta = api_pb2.PodSandboxMetadata(name="p", namespace="ns", uid="uid1")
    if stage.is_pod:
        request = api_pb2.PodSandboxHookRequest(pod_meta=meta, labels=labels, annotations=annotations,
                                                cgroup_parent="/" + PARENT)
    else:
        request = api_pb2.ContainerResourceHookRequest(
            pod_meta=meta, container_meta=api_pb2.ContainerMetadata(name="c1", id=CONTAINER_ID),
            pod_labels=labels, pod_annotations=annotations, pod_cgroup_parent="/" + PARENT,
            container_resources=api_pb2.LinuxContainerResources(cpu_period=100000, cpu_quota=200000))

    class Aborted(Exception):
        pass

    class Context:
        code: grpc.StatusCode | None = None

        def abort(self, code: grpc.StatusCode, message: str) -> None:
            self.code = code
            raise Aborted(message)

    context = Context()
    try:
        answer = server.handle(stage, request, context)  # type: ignore[arg-type]
    except Aborted as exc:
        # Clean, named refusals only: bad input, or a plugin's error under Fail.
        assert context.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL)
        assert not str(exc).startswith("koordlet "), f"unexpected exception: {exc}"  # the catch-all's prefix
        return
    resources = answer.resources if stage.is_pod else answer.container_resources
    for name, kind in (("cpu_shares", cgrouplimits.Kind.SHARES), ("cpu_quota", cgrouplimits.Kind.QUOTA),
                       ("cpu_period", cgrouplimits.Kind.PERIOD), ("memory_limit_in_bytes", cgrouplimits.Kind.MEMORY)):
        value = getattr(resources, name)
        assert value == 0 or cgrouplimits.problem(kind, value) is None, (name, value)
    if resources.cpuset_cpus:
        parse_cpuset(resources.cpuset_cpus)
    assert convert.validate_pod_response(answer) == [] if stage.is_pod else (
        convert.validate_container_response(answer) == [])
    written_values_within_limits(executor, PARENT)
    written_values_within_limits(executor, f"{PARENT}/{CONTAINER_ID}")


@SETTINGS
@given(annotations=pod_annotations(), labels=qos_labels)
def test_hooks_framework_never_lets_an_out_of_range_value_through(tmp_path_factory, annotations, labels) -> None:
    root = tmp_path_factory.mktemp("node")
    hooks, executor = all_plugin_hooks(root, FailurePolicy.IGNORE, NODE)
    ctx = ContainerContext(ContainerRequest(pod_meta=HookPodMeta(name="p", namespace="ns", uid="uid1"),
                                            container_name="c1", container_id=CONTAINER_ID,
                                            pod_labels=labels, pod_annotations=annotations,
                                            pod_cgroup_parent="/" + PARENT))
    hooks.run(HookPoint.PRE_CREATE_CONTAINER, ctx)
    assert_answer_within_kernel_limits(ctx.response.resources)
    try:
        executor.apply(executor.container_dir(PARENT, CONTAINER_ID), ctx.response.resources)
    except CgroupError:
        pass
    written_values_within_limits(executor, f"{PARENT}/{CONTAINER_ID}")


@SETTINGS
@given(st.integers(-(2**63), 2**63 - 1), st.sampled_from(list(cgrouplimits.Kind)),
       st.sampled_from(["cpu_shares", "cpu_quota", "cpu_period", "memory_limit", "cpu_bvt_warp_ns"]))
def test_executor_writes_only_what_the_kernel_accepts(tmp_path_factory, value, _kind, resource) -> None:
    root = tmp_path_factory.mktemp("cg")
    executor = node_with_everything(root)
    try:
        executor.write(PARENT, resource, value)
    except CgroupError as exc:
        assert str(root) in str(exc)  # names the file
        return
    kind = {"cpu_shares": cgrouplimits.Kind.SHARES, "cpu_quota": cgrouplimits.Kind.QUOTA,
            "cpu_period": cgrouplimits.Kind.PERIOD, "memory_limit": cgrouplimits.Kind.MEMORY,
            "cpu_bvt_warp_ns": cgrouplimits.Kind.BVT}[resource]
    assert cgrouplimits.problem(kind, value) is None


@SETTINGS
@given(st.builds(api_pb2.LinuxContainerResources,
                 cpu_period=st.integers(-(2**63), 2**63 - 1), cpu_quota=st.integers(-(2**63), 2**63 - 1),
                 cpu_shares=st.integers(-(2**63), 2**63 - 1),
                 memory_limit_in_bytes=st.integers(-(2**63), 2**63 - 1),
                 cpuset_cpus=cpu_texts, cpuset_mems=cpu_texts))
def test_proxy_accepts_only_answers_the_kernel_accepts(resources) -> None:
    answer = api_pb2.ContainerResourceHookResponse(container_resources=resources)
    if convert.validate_container_response(answer):
        return
    for name, kind in (("cpu_shares", cgrouplimits.Kind.SHARES), ("cpu_quota", cgrouplimits.Kind.QUOTA),
                       ("cpu_period", cgrouplimits.Kind.PERIOD), ("memory_limit_in_bytes", cgrouplimits.Kind.MEMORY)):
        value = getattr(resources, name)
        assert value == 0 or cgrouplimits.problem(kind, value) is None
    for text in (resources.cpuset_cpus, resources.cpuset_mems):
        parse_cpuset(text)


node_slo_documents = st.one_of(
    json_values,
    st.fixed_dictionaries({"spec": st.fixed_dictionaries({"resourceQOSStrategy": st.dictionaries(
        st.sampled_from(["lsrClass", "lsClass", "beClass", "systemClass", "policies"]),
        st.fixed_dictionaries({"cpuQOS": st.dictionaries(
            st.sampled_from(["enable", "groupIdentity"]), json_values)}) | json_values)})}),
)
node_documents = st.fixed_dictionaries({"metadata": st.fixed_dictionaries({"annotations": st.dictionaries(
    st.sampled_from(["node.koordinator.sh/cpu-shared-pools", "node.koordinator.sh/be-cpu-shared-pools",
                     "node.koordinator.sh/cpu-normalization-ratio", "kubelet.koordinator.sh/cpu-manager-policy"]),
    st.one_of(st.text(max_size=20), json_values.map(_dumps),
              st.lists(st.fixed_dictionaries({"socket": json_values, "node": json_values, "cpuset": cpu_texts}),
                       max_size=3).map(_dumps)))})})


@SETTINGS
@given(slo=node_slo_documents, node=node_documents, as_json=st.booleans())
def test_node_slo_and_node_files_give_rules_or_a_named_error(slo, node, as_json) -> None:
    loaded = []
    for obj in (slo, node):
        raw = (json.dumps(obj) if as_json else yaml.safe_dump(obj)).encode()
        try:
            loaded.append(documents.load_object(raw))
        except documents.DocumentError:
            return
    try:
        rules = parse_rules(*loaded)
    except RuleError:
        return
    for pool in rules[CPUSET].cpu_shared_pools + rules[CPUSET].be_cpu_shared_pools:
        parse_cpuset(pool.cpuset)
    for klass in (rules[GROUP_IDENTITY].lsr, rules[GROUP_IDENTITY].ls, rules[GROUP_IDENTITY].be,
                  rules[GROUP_IDENTITY].system):
        assert cgrouplimits.problem(cgrouplimits.Kind.BVT, klass.bvt) is None


@SETTINGS
@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_any_bytes_are_an_object_or_a_document_error(raw) -> None:
    try:
        assert isinstance(documents.load_object(raw), dict)
    except documents.DocumentError:
        pass


def test_the_strategies_reach_real_answers(tmp_path, caplog) -> None:
    """The properties above are not vacuous: a plain BE pod gets batch limits through the same path."""
    hooks, executor = all_plugin_hooks(tmp_path, FailurePolicy.FAIL, NODE)
    ctx = ContainerContext.from_proto(api_pb2.ContainerResourceHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="p", namespace="ns", uid="uid1"),
        container_meta=api_pb2.ContainerMetadata(name="c1", id=CONTAINER_ID),
        pod_labels={"koordinator.sh/qosClass": "BE"}, pod_cgroup_parent="/" + PARENT,
        pod_annotations={"node.koordinator.sh/extended-resource-spec": json.dumps({"containers": {"c1": {
            "requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "500"}}}})}))
    with caplog.at_level(logging.WARNING):
        hooks.run(HookPoint.PRE_CREATE_CONTAINER, ctx)
    # the batch quota is scaled by the node's normalization ratio 1.5 too: ceil(50000 / 1.5)
    assert ctx.response.resources.cpu_shares == 512 and ctx.response.resources.cpu_quota == 33334

"""Resctrl through Hooks on a fake resctrl tree: group, schemata, tasks, removal."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import pytest

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet import flags
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resctrlfs import ResctrlError
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.runtimehooks.hooks import HookError, Hooks, PluginEnv, RunningPod
from koord.koordlet.runtimehooks.nri import NriOptions, NriServer
from koord.koordlet.runtimehooks.plugins.resctrl import Resctrl, l3_mask
from koord.koordlet.runtimehooks.protocol import (
    ContainerContext,
    ContainerRequest,
    HookPodMeta,
    PodContext,
    PodRequest,
)
from koord.nri import api_pb2 as api
from koord.nri.stub import NriStub
from koord_testing.nri import FakeRuntime
from koord_testing.resctrltree import RDT_FLAGS, make_cpuinfo, make_resctrl_tree

ANNOTATION = "node.koordinator.sh/resctrl"
PARENT = "/kubepods/besteffort/poduid1"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return make_node(tmp_path)


def make_node(tmp_path: Path) -> Path:
    """sys/fs/resctrl with two L3 caches of 12 ways and two MB domains; one container's cgroup."""
    resctrl = tmp_path / "sys" / "fs" / "resctrl"
    (resctrl / "info" / "L3").mkdir(parents=True)
    (resctrl / "info" / "L3" / "cbm_mask").write_text("fff\n")
    (resctrl / "schemata").write_text("    L3:0=fff;1=fff\n    MB:0=100;1=100\n")
    container = tmp_path / "cgroup" / "cpu" / PARENT.strip("/") / "cid1"
    container.mkdir(parents=True)
    (container / "tasks").write_text("101\n102\n")
    return tmp_path


def hooks_for(root: Path) -> Hooks:
    env = PluginEnv(CgroupExecutor(CgroupLayout(root / "cgroup")), root / "sys" / "fs", root / "proc")
    hooks = Hooks(FailurePolicy.FAIL)
    Resctrl(env).register(hooks)
    return hooks


def pod_ctx(annotations: dict, uid: str = "uid1") -> PodContext:
    return PodContext(PodRequest(meta=HookPodMeta(name="p", namespace="ns", uid=uid),
                                 annotations=annotations, cgroup_parent=PARENT))


def container_ctx(annotations: dict, container_id: str = "cid1") -> ContainerContext:
    return ContainerContext(ContainerRequest(
        pod_meta=HookPodMeta(name="p", namespace="ns", uid="uid1"), container_name="c1",
        container_id=container_id, pod_annotations=annotations, pod_cgroup_parent=PARENT))


def group(root: Path) -> Path:
    return root / "sys" / "fs" / "resctrl" / "koordlet-uid1"


@pytest.mark.parametrize("config, schemata", [
    # 12 ways, [20%, 80%) -> ways 3..9 -> 0x3f8
    ({"llc": {"schemata": {"range": [20, 80]}}}, "L3:0=3f8;1=3f8\n"),
    ({"mb": {"schemata": {"percent": 20}}}, "MB:0=20;1=20\n"),
    ({"llc": {"schemata": {"range": [20, 80]}}, "mb": {"schemata": {"percent": 20}}},
     "L3:0=3f8;1=3f8\nMB:0=20;1=20\n"),
    ({"llc": {"schemata": {"range": [0, 50]}, "schemataPerCache": [{"cacheID": 1, "range": [50, 100]}]},
      "mb": {"schemataPerCache": [{"cacheID": 0, "percent": 30}]}},
     "L3:0=3f;1=fc0\nMB:0=30\n"),
    ({"LLC": {"schemata": {"range": [0, 100]}}, "MB": {"schemata": {"percent": 100}}},
     "L3:0=fff;1=fff\nMB:0=100;1=100\n"),
    ({"llc": {"schemataPerCache": [{"cacheID": 7, "range": [0, 50]}]}}, None),  # no such cache
])
def test_pod_group_schemata(node: Path, config: dict, schemata: str | None) -> None:
    ctx = pod_ctx({ANNOTATION: json.dumps(config)})
    hooks_for(node).run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
    assert group(node).is_dir()
    written = group(node) / "schemata"
    assert (written.read_text() if written.exists() else None) == schemata
    assert ctx.response.resources.is_empty()


def test_lifecycle(node: Path) -> None:
    hooks = hooks_for(node)
    annotations = {ANNOTATION: '{"llc":{"schemata":{"range":[0,50]}}}'}
    hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, pod_ctx(annotations))
    hooks.run(HookPoint.POST_START_CONTAINER, container_ctx(annotations))
    assert (group(node) / "tasks").read_text().split() == ["101", "102"]
    hooks.run(HookPoint.POST_STOP_POD_SANDBOX, pod_ctx(annotations))
    assert not group(node).exists()
    assert (node / "sys" / "fs" / "resctrl" / "schemata").exists()


def test_post_start_creates_a_missing_group(node: Path) -> None:
    """A pod created before koordlet started still gets its group when its container starts."""
    hooks_for(node).run(HookPoint.POST_START_CONTAINER,
                        container_ctx({ANNOTATION: '{"mb":{"schemata":{"percent":40}}}'}))
    assert (group(node) / "schemata").read_text() == "MB:0=40;1=40\n"
    assert (group(node) / "tasks").read_text().split() == ["101", "102"]


def test_pods_without_annotation_are_ignored(node: Path) -> None:
    hooks = hooks_for(node)
    hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, pod_ctx({}))
    hooks.run(HookPoint.POST_START_CONTAINER, container_ctx({}))
    hooks.run(HookPoint.POST_STOP_POD_SANDBOX, pod_ctx({}))
    assert sorted(p.name for p in (node / "sys" / "fs" / "resctrl").iterdir()) == ["info", "schemata"]


def fake_mount(works: bool):
    def mount(target: Path) -> None:
        if not works:
            raise ResctrlError(f"mount -t resctrl resctrl {target}: No such device")
        make_resctrl_tree(target.parent)
    return mount


@pytest.mark.parametrize("name, cpu_flags, resctrl_dir, mount_works, says", [
    ("no cpuinfo", None, True, True, "cannot tell whether the CPU has RDT"),
    ("CPU without RDT", ("sse2",), True, True, "lack cat_l3 and mba"),
    ("kernel without resctrl", RDT_FLAGS, False, True, "does not exist (a kernel without resctrl?)"),
    ("mount refused", RDT_FLAGS, True, False, "No such device"),
    ("mounted by the plugin", RDT_FLAGS, True, True, "mounted resctrl at"),
])
def test_support_and_mount(tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, cpu_flags: tuple | None,
                           resctrl_dir: bool, mount_works: bool, says: str) -> None:
    if cpu_flags is not None:
        make_cpuinfo(tmp_path / "proc", flags=cpu_flags)
    if resctrl_dir:
        (tmp_path / "sys" / "fs" / "resctrl").mkdir(parents=True)
    plugin = Resctrl(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path / "cgroup")), tmp_path / "sys" / "fs",
                               tmp_path / "proc"))
    plugin.mount = fake_mount(mount_works)
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, pod_ctx({ANNOTATION: '{"mb":{"schemata":{"percent":20}}}'}))
    assert sum(says in r.message for r in caplog.records) == 1
    assert group(tmp_path).is_dir() == (says == "mounted resctrl at")


def test_this_machine_says_in_one_line_why_not(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The real /proc/cpuinfo; a sys-fs root without resctrl, so nothing is ever mounted here."""
    plugin = Resctrl(PluginEnv(CgroupExecutor(CgroupLayout(tmp_path / "cgroup")), tmp_path / "sys-fs", Path("/proc")))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, pod_ctx({ANNOTATION: '{"mb":{"schemata":{"percent":20}}}'}))
            assert plugin.reconcile_pods([], complete=True) == []
    said = [r.message for r in caplog.records if "resctrl unavailable" in r.message]
    print(said)
    assert len(said) == 1
    assert not (tmp_path / "sys-fs").exists()


def running(uid: str, annotations: dict, container_ids: tuple[str, ...] = ("cid1",),
            sandbox_id: str = "sb1") -> RunningPod:
    return RunningPod(HookPodMeta(name="p", namespace="ns", uid=uid), annotations, PARENT, sandbox_id, container_ids)


def test_reconcile_moves_container_and_sandbox_tasks_once(node: Path) -> None:
    sandbox = node / "cgroup" / "cpu" / PARENT.strip("/") / "sb1"
    sandbox.mkdir()
    (sandbox / "tasks").write_text("100\n")
    plugin = Resctrl(PluginEnv(CgroupExecutor(CgroupLayout(node / "cgroup")), node / "sys" / "fs", node / "proc"))
    pods = [running("uid1", {ANNOTATION: '{"mb":{"schemata":{"percent":40}}}'}, ("cid1", "cid-gone"))]
    assert plugin.reconcile_pods(pods, complete=True) == []
    assert (group(node) / "schemata").read_text() == "MB:0=40;1=40\n"
    assert (group(node) / "tasks").read_text().split() == ["101", "102", "100"]
    assert plugin.reconcile_pods(pods, complete=True) == []
    assert (group(node) / "tasks").read_text().split() == ["101", "102", "100"], "tasks written twice"


@pytest.mark.parametrize("name, complete, left", [
    ("complete list: groups of pods gone or unannotated removed", True, ["BE", "info", "koordlet-uid1"]),
    ("incomplete list: nothing removed", False, ["BE", "info", "koordlet-gone", "koordlet-uid1", "koordlet-uid2"]),
])
def test_reconcile_removes_groups_of_pods_gone(node: Path, name: str, complete: bool, left: list[str]) -> None:
    root = node / "sys" / "fs" / "resctrl"
    for leftover in ("koordlet-gone", "koordlet-uid2", "BE"):
        (root / leftover).mkdir()
        (root / leftover / "schemata").write_text("")
    plugin = Resctrl(PluginEnv(CgroupExecutor(CgroupLayout(node / "cgroup")), node / "sys" / "fs", node / "proc"))
    pods = [running("uid1", {ANNOTATION: '{"mb":{"schemata":{"percent":40}}}'}), running("uid2", {})]
    assert plugin.reconcile_pods(pods, complete) == []
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == left


def test_reconcile_names_the_pod_of_a_bad_annotation(node: Path) -> None:
    plugin = Resctrl(PluginEnv(CgroupExecutor(CgroupLayout(node / "cgroup")), node / "sys" / "fs", node / "proc"))
    problems = plugin.reconcile_pods([running("uid1", {ANNOTATION: "{"})], complete=True)
    assert len(problems) == 1 and "pod ns/p" in problems[0] and "bad JSON" in problems[0]
    assert not group(node).exists()


@pytest.mark.parametrize("annotation, reason", [
    ("{", "bad JSON"),
    ('{"llc":{"schemata":{"range":[80,20]}}}', "llc.schemata.range"),
    ('{"llc":{"schemata":{"range":[0,101]}}}', "llc.schemata.range"),
    ('{"llc":{"schemata":{"range":[10,11]}}}', "covers no cache way"),
    ('{"mb":{"schemata":{"percent":0}}}', "mb.schemata.percent"),
    ('{"mb":{"schemataPerCache":[{"percent":10}]}}', "mb.schemataPerCache[0].cacheID"),
    ('{"mb":{"schemataPerCache":{"cacheID":0}}}', "mb.schemataPerCache: want a list"),
])
def test_bad_annotation(node: Path, annotation: str, reason: str) -> None:
    with pytest.raises(HookError, match=re.escape(reason)) as info:
        hooks_for(node).run(HookPoint.PRE_RUN_POD_SANDBOX, pod_ctx({ANNOTATION: annotation}))
    assert "ns/p" in str(info.value)
    assert not group(node).exists()


def test_missing_container_cgroup_is_an_error(node: Path) -> None:
    with pytest.raises(HookError, match="missing"):
        hooks_for(node).run(HookPoint.POST_START_CONTAINER,
                            container_ctx({ANNOTATION: '{"mb":{"schemata":{"percent":20}}}'}, "gone"))


def test_missing_cbm_mask_is_an_error_for_llc_only(node: Path) -> None:
    (node / "sys" / "fs" / "resctrl" / "info" / "L3" / "cbm_mask").unlink()
    hooks = hooks_for(node)
    hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, pod_ctx({ANNOTATION: '{"mb":{"schemata":{"percent":20}}}'}))
    with pytest.raises(HookError, match="cbm_mask"):
        hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, pod_ctx({ANNOTATION: '{"llc":{"schemata":{"range":[0,50]}}}'}))


@pytest.mark.parametrize("cbm, start, end, mask", [
    (0x3ff, 10, 80, "fe"),     # upstream's examples
    (0x7ff, 10, 50, "3c"),
    (0x7ff, 0, 30, "f"),
    (0xfffff, 0, 100, "fffff"),
])
def test_l3_mask(cbm: int, start: int, end: int, mask: str) -> None:
    assert l3_mask(cbm, start, end) == mask


def test_l3_mask_rejects_non_contiguous_root() -> None:
    with pytest.raises(HookError, match="contiguous"):
        l3_mask(0b1011, 0, 50)


@pytest.mark.parametrize("annotations, tree, rdt_class", [
    ({ANNOTATION: '{"llc":{"schemata":{"range":[0,50]}}}'}, True, "koordlet-uid1"),
    ({ANNOTATION: "{}"}, True, "koordlet-uid1"),
    ({}, True, None),
    ({ANNOTATION: '{"llc":{"schemata":{"range":[0,50]}}}'}, False, None),  # no resctrl here
])
def test_pre_create_names_the_pods_group_as_the_rdt_class(tmp_path: Path, annotations: dict, tree: bool,
                                                         rdt_class: str | None) -> None:
    """The runtime puts a new container straight into its pod's group (NRI carries the class),
    so the group exists before the answer names it."""
    root = make_node(tmp_path) if tree else tmp_path  # without a tree or a cpuinfo: unsupported
    hooks = hooks_for(root)
    ctx = container_ctx(annotations)
    hooks.run(HookPoint.PRE_CREATE_CONTAINER, ctx)
    assert ctx.response.rdt_class == rdt_class
    assert group(root).is_dir() == (rdt_class is not None)


def test_through_nri_a_new_container_is_created_in_its_pods_group(tmp_path: Path, short_socket_dir: Path) -> None:
    """koordlet's NRI server over a real ttrpc socket: the runtime's CreateContainer for a pod
    with the annotation is answered with the pod's group as the container's RDT class."""
    root = make_node(tmp_path)
    server = NriServer(hooks_for(root), CgroupExecutor(CgroupLayout(root / "cgroup", version=1)),
                       NriOptions.from_args(flags.build_parser().parse_args([])))
    sandbox = api.PodSandbox(id="s1", name="p", namespace="ns", uid="uid1",
                             annotations={ANNOTATION: '{"mb":{"schemata":{"percent":30}}}'})
    sandbox.linux.cgroup_parent = PARENT
    plain = api.PodSandbox(id="s2", name="q", namespace="ns", uid="uid2")
    plain.linux.cgroup_parent = "/kubepods/besteffort/poduid2"
    answers: list[api.CreateContainerResponse] = []

    async def main() -> None:
        fake = await FakeRuntime(str(short_socket_dir / "nri.sock")).start()
        stub = NriStub("koordlet", "00", server.stub.handlers, socket_path=fake.socket_path, handler_timeout=5)
        serving = asyncio.ensure_future(stub.run_once())
        try:
            await fake.wait_registered()
            await fake.call("Configure", fake.configure_request, api.ConfigureResponse)
            await fake.call("Synchronize", api.SynchronizeRequest(), api.SynchronizeResponse)
            for pod in (sandbox, plain):
                ctr = api.Container(id=f"c-{pod.id}", pod_sandbox_id=pod.id, name="app")
                answers.append(await fake.call("CreateContainer", api.CreateContainerRequest(pod=pod, container=ctr),
                                               api.CreateContainerResponse))
        finally:
            stub.stop(timeout=0)
            await asyncio.wait_for(serving, 5)
            await fake.close()

    asyncio.run(main())
    annotated, unannotated = (a.adjust.linux.resources for a in answers)
    assert annotated.rdt_class.value == "koordlet-uid1"
    assert (group(root) / "schemata").read_text() == "MB:0=30;1=30\n"
    assert not unannotated.HasField("rdt_class")

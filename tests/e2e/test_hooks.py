"""Runtime hooks end to end: kubelet-like client -> proxy process -> real containerd, with
real plugin servers speaking runtime.v1alpha1 on unix sockets.

What a plugin answers is checked where it matters: in the container's cgroup files, the
OCI spec containerd generated, the process environment, and CRI status.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri
from prometheus_client.parser import text_string_to_metric_families

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord_testing.cgroups import shares_to_weight
from koord_testing.hookplugin import ALL_HOOKS, Behaviour, RecordingPlugin
from koord_testing.kubelet import pod_cgroup_parent

from .rig import LIFECYCLE_HOOKS, SKIP_LABEL, MiB, Rig, cgroup, eventually, free_port, only_keys, record_order, spec_env

pytestmark = pytest.mark.e2e


def test_all_hooks_reach_all_plugins_in_file_order_and_land_in_the_container(rig: Rig) -> None:
    order: list[tuple[str, str]] = []
    # Created second-first: the call order must come from the file names, not creation time.
    b = rig.plugin("20-b.json")
    a = rig.plugin("10-a.json")
    record_order(order, a, {
        "PreRunPodSandbox": lambda req: hook.PodSandboxHookResponse(
            labels={"hook.a/label": "a"}, annotations={"hook.a/ann": "a", "hook/shared": "a"}),
        "PreCreateContainer": lambda req: hook.ContainerResourceHookResponse(
            container_envs={"A_SECOND": "from-a", "ZED": "a", "FROM_A": "1"},
            container_annotations={"hook.a/ctr": "a", "hook/shared": "a"},
            container_resources=hook.LinuxContainerResources(cpu_shares=300)),
        "PreUpdateContainerResources": lambda req: hook.ContainerResourceHookResponse(
            container_resources=hook.LinuxContainerResources(cpu_quota=70000)),
    })
    record_order(order, b, {
        "PreRunPodSandbox": lambda req: hook.PodSandboxHookResponse(
            annotations={"hook/shared": "b", "hook.b/ann": "b"}),
        "PreCreateContainer": lambda req: hook.ContainerResourceHookResponse(
            container_envs={"ALPHA": "b"}, container_annotations={"hook/shared": "b"},
            container_resources=hook.LinuxContainerResources(
                cpu_shares=512, cpu_period=100000, cpu_quota=50000, memory_limit_in_bytes=64 * MiB)),
        "PreUpdateContainerResources": lambda req: hook.ContainerResourceHookResponse(
            container_resources=hook.LinuxContainerResources(memory_limit_in_bytes=128 * MiB)),
    })
    rig.start_proxy()
    kubelet = rig.kubelet()

    sid = kubelet.run_pod("order", labels={"app": "order"}, annotations={"team": "t"})
    pod = kubelet.pod_status(sid).status
    assert pod.labels["hook.a/label"] == "a" and pod.labels["app"] == "order"
    assert pod.annotations["hook/shared"] == "b", "the later plugin's answer wins"
    assert pod.annotations["hook.a/ann"] == "a" and pod.annotations["hook.b/ann"] == "b"
    assert pod.annotations["team"] == "t"
    seen_by_b = b.requests("PreRunPodSandbox")[0]
    assert seen_by_b.labels["hook.a/label"] == "a" and seen_by_b.annotations["hook/shared"] == "a"

    cid = kubelet.create_container(sid, "app", rig.containerd.image,
                                   envs=[("Z_FIRST", "1"), ("A_SECOND", "2"), ("M_THIRD", "3")],
                                   annotations={"orig": "x"}, resources={"cpu_shares": 128})
    seen_by_b = b.requests("PreCreateContainer")[0]
    assert seen_by_b.container_envs["A_SECOND"] == "from-a" and seen_by_b.container_envs["FROM_A"] == "1"
    assert seen_by_b.container_resources.cpu_shares == 300
    assert seen_by_b.container_annotations["hook.a/ctr"] == "a"
    kubelet.start_container(cid)

    cg = cgroup(kubelet, sid, cid)
    assert cg.cpu_weight() == shares_to_weight(512)
    assert cg.cpu_max() == (50000, 100000)
    assert cg.memory_limit() == 64 * MiB
    # Original order kept with values updated in place; new keys appended sorted.
    expected_env = ["Z_FIRST=1", "A_SECOND=from-a", "M_THIRD=3", "ALPHA=b", "FROM_A=1", "ZED=a"]
    keys = {kv.partition("=")[0] for kv in expected_env}
    assert only_keys(spec_env(kubelet, cid), keys) == expected_env
    process_env = kubelet.exec_sync(cid, ["/pause", "env"]).stdout.decode().splitlines()
    assert only_keys(process_env, keys) == expected_env
    annotations = kubelet.container_status(cid).status.annotations
    assert annotations["hook/shared"] == "b" and annotations["hook.a/ctr"] == "a" and annotations["orig"] == "x"

    kubelet.update_resources(cid, {"cpu_shares": 600, "cpu_period": 100000, "cpu_quota": 50000,
                                   "memory_limit_in_bytes": 64 * MiB})
    seen_by_b = b.requests("PreUpdateContainerResources")[0]
    assert seen_by_b.container_resources.cpu_shares == 600
    assert seen_by_b.container_resources.cpu_quota == 70000, "b must see a's change"
    assert cg.cpu_weight() == shares_to_weight(600)
    assert cg.cpu_quota() == 70000
    assert cg.memory_limit() == 128 * MiB

    kubelet.stop_container(cid, grace=5)
    kubelet.stop_pod(sid)
    assert order == [(h, p) for h in LIFECYCLE_HOOKS for p in ("10-a.json", "20-b.json")]


def test_start_and_update_hooks_carry_full_pod_and_container_info(rig: Rig) -> None:
    a = rig.plugin("10-a.json", hooks=["PreRunPodSandbox", "PreCreateContainer", "PreStartContainer"])
    b = rig.plugin("20-b.json", hooks=["PreStartContainer", "PreUpdateContainerResources"])
    a.behaviours["PreRunPodSandbox"] = Behaviour(answer=lambda req: hook.PodSandboxHookResponse(
        labels={"hook/label": "1"}, annotations={"hook/pod-ann": "1"}))
    a.behaviours["PreCreateContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_annotations={"hook/ctr-ann": "1"}, container_envs={"HOOK_ENV": "1"},
        container_resources=hook.LinuxContainerResources(cpu_shares=300)))
    # Changes resources of a created container: must reach the cgroup before the start.
    a.behaviours["PreStartContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(cpu_shares=1000, memory_limit_in_bytes=96 * MiB)))
    rig.start_proxy()
    kubelet = rig.kubelet()

    uid = "0f5b3a8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
    sid = kubelet.run_pod("info", namespace="ns-info", uid=uid, qos="burstable",
                          labels={"app": "web", "koordinator.sh/qosClass": "LS"}, annotations={"team": "x"})
    cid = kubelet.create_container(sid, "app", rig.containerd.image, envs=[("E1", "1"), ("E2", "2")],
                                   annotations={"orig-ann": "y"},
                                   resources={"cpu_shares": 256, "cpu_period": 100000, "cpu_quota": 40000,
                                              "memory_limit_in_bytes": 200 * MiB})
    kubelet.start_container(cid)

    def check_common(req) -> None:
        assert (req.pod_meta.name, req.pod_meta.namespace, req.pod_meta.uid, req.pod_meta.attempt) == \
            ("info", "ns-info", uid, 0)
        assert (req.container_meta.name, req.container_meta.id, req.container_meta.attempt) == ("app", cid, 0)
        assert {"app": "web", "koordinator.sh/qosClass": "LS", "hook/label": "1",
                "io.kubernetes.pod.uid": uid}.items() <= dict(req.pod_labels).items()
        assert {"team": "x", "hook/pod-ann": "1"}.items() <= dict(req.pod_annotations).items()
        assert {"orig-ann": "y", "hook/ctr-ann": "1"}.items() <= dict(req.container_annotations).items()
        assert dict(req.container_envs) == {"E1": "1", "E2": "2", "HOOK_ENV": "1"}
        assert req.pod_cgroup_parent == pod_cgroup_parent("burstable", uid)

    start = b.requests("PreStartContainer")
    assert len(start) == 1
    check_common(start[0])
    # a ran first and changed shares and memory: b sees that, the rest is from creation.
    res = start[0].container_resources
    assert (res.cpu_shares, res.cpu_period, res.cpu_quota, res.memory_limit_in_bytes) == \
        (1000, 100000, 40000, 96 * MiB)
    assert a.requests("PreStartContainer")[0].container_resources.cpu_shares == 300
    cg = cgroup(kubelet, sid, cid)
    assert cg.cpu_weight() == shares_to_weight(1000)
    assert cg.memory_limit() == 96 * MiB
    assert cg.cpu_quota() == 40000

    kubelet.update_resources(cid, {"cpu_shares": 700, "cpu_period": 100000, "cpu_quota": 60000,
                                   "memory_limit_in_bytes": 150 * MiB})
    update = b.requests("PreUpdateContainerResources")
    assert len(update) == 1
    check_common(update[0])
    res = update[0].container_resources
    assert (res.cpu_shares, res.cpu_period, res.cpu_quota, res.memory_limit_in_bytes) == \
        (700, 100000, 60000, 150 * MiB)
    assert cgroup(kubelet, sid, cid).cpu_weight() == shares_to_weight(700)


def test_post_hooks_run_after_success_and_their_failure_never_fails_the_call(rig: Rig) -> None:
    post = rig.plugin("10-post.json", failure_policy="Fail",
                      hooks=["PostStartContainer", "PostStopContainer", "PostStopPodSandbox"])
    direct = rig.direct()
    observed: list[tuple[str, int]] = []

    def failing(hook_name: str, state_of: Callable):
        def serve(req):
            observed.append((hook_name, state_of(req)))
            raise RuntimeError(f"{hook_name} plugin exploded")
        return serve

    container_state = lambda req: direct.container_status(req.container_meta.id).status.state  # noqa: E731

    def pod_state(req) -> int:
        """The pod's state as the backend lists it. containerd 2.x updates its sandbox list from
        the exit event, just after StopPodSandbox has returned: a READY is asked again for up
        to 2 s. A hook called before the stop would still see READY: the proxy waits for it."""
        def listed() -> int:
            return next(p.state for p in direct.runtime.ListPodSandbox(cri.ListPodSandboxRequest()).items
                        if p.metadata.uid == req.pod_meta.uid)
        deadline = time.monotonic() + 2
        while (state := listed()) == cri.PodSandboxState.SANDBOX_READY and time.monotonic() < deadline:
            time.sleep(0.05)
        return state
    post.behaviours["PostStartContainer"] = Behaviour(answer=failing("PostStartContainer", container_state))
    post.behaviours["PostStopContainer"] = Behaviour(answer=failing("PostStopContainer", container_state))
    post.behaviours["PostStopPodSandbox"] = Behaviour(answer=failing("PostStopPodSandbox", pod_state))
    rig.start_proxy()
    kubelet = rig.kubelet()

    sid = kubelet.run_pod("post")
    cid = kubelet.run_container(sid, "app", rig.containerd.image)
    with pytest.raises(grpc.RpcError) as failed:
        kubelet.start_container(cid)  # already running: the backend refuses
    assert "CONTAINER_RUNNING" in failed.value.details(), "the backend's own error must come back"
    kubelet.stop_container(cid, grace=5)
    kubelet.stop_pod(sid)

    assert observed == [
        ("PostStartContainer", cri.ContainerState.CONTAINER_RUNNING),
        ("PostStopContainer", cri.ContainerState.CONTAINER_EXITED),
        ("PostStopPodSandbox", cri.PodSandboxState.SANDBOX_NOTREADY),
    ], "each post hook runs once, after the backend succeeded, never after a failed call"
    stop_req = post.requests("PostStopContainer")[0]
    assert (stop_req.pod_meta.name, stop_req.container_meta.name, stop_req.container_meta.id) == ("post", "app", cid)
    assert post.requests("PostStopPodSandbox")[0].pod_meta.name == "post"


def test_skip_label_means_no_hook_calls_for_the_pod_nor_its_containers(rig: Rig) -> None:
    plugin = rig.plugin("10-a.json", failure_policy="Fail")
    rig.start_proxy()
    kubelet = rig.kubelet()

    def lifecycle(name: str, labels: dict[str, str]) -> None:
        sid = kubelet.run_pod(name, labels=labels)
        cid = kubelet.run_container(sid, "app", rig.containerd.image)
        kubelet.update_resources(cid, {"cpu_shares": 400})
        kubelet.stop_container(cid, grace=5)
        kubelet.stop_pod(sid)

    lifecycle("skipped", {SKIP_LABEL: "true"})
    assert plugin.hooks_seen() == []
    # The same lifecycle without the label reaches the plugin: the registration is live.
    lifecycle("hooked", {SKIP_LABEL: "false"})
    assert plugin.hooks_seen() == list(LIFECYCLE_HOOKS)
    assert {req.pod_meta.name for _, req in plugin.calls} == {"hooked"}


def test_hung_plugin_times_out_with_ignore_and_is_called_again_next_time(rig: Rig) -> None:
    hung = rig.plugin("10-hung.json", hooks=["PreRunPodSandbox"], timeout=1)
    after = rig.plugin("20-b.json", hooks=["PreRunPodSandbox"])
    hung.behaviours["PreRunPodSandbox"] = Behaviour(
        delay=3, answer=lambda req: hook.PodSandboxHookResponse(labels={"from-hung": "1"}))
    after.behaviours["PreRunPodSandbox"] = Behaviour(
        answer=lambda req: hook.PodSandboxHookResponse(labels={"from-b": "1"}))
    rig.start_proxy()
    kubelet = rig.kubelet()

    started = time.monotonic()
    sid = kubelet.run_pod("hung")
    elapsed = time.monotonic() - started
    # Generous bound: this checks that the 1 s timeout works at all (no timing claims).
    assert elapsed < 4, f"RunPodSandbox took {elapsed:.1f}s with a 1s plugin timeout"
    labels = kubelet.pod_status(sid).status.labels
    assert labels["from-b"] == "1", "with Ignore the call goes on to the next plugin"
    assert "from-hung" not in labels, "a late answer must not be applied"

    hung.behaviours["PreRunPodSandbox"] = Behaviour(
        answer=lambda req: hook.PodSandboxHookResponse(labels={"from-hung": "1"}))
    sid2 = kubelet.run_pod("hung-again")
    assert kubelet.pod_status(sid2).status.labels["from-hung"] == "1", "a plugin that timed out once is not dropped"
    assert len(hung.requests("PreRunPodSandbox")) == 2


def test_fail_policy_error_names_plugin_file_hook_point_and_plugin_error(rig: Rig) -> None:
    plugin = rig.plugin("10-strict.json", failure_policy="Fail",
                        hooks=["PreRunPodSandbox", "PreCreateContainer", "PreStartContainer",
                               "PreUpdateContainerResources"])
    rig.start_proxy()
    kubelet = rig.kubelet()
    direct = rig.direct()

    def fails(hook_name: str, call: Callable[[], object]) -> None:
        plugin.behaviours[hook_name] = Behaviour(
            error=(grpc.StatusCode.PERMISSION_DENIED, f"quota-exhausted-in-{hook_name}"))
        with pytest.raises(grpc.RpcError) as failed:
            call()
        plugin.behaviours.pop(hook_name)
        message = failed.value.details()
        for part in ("10-strict.json", hook_name, f"quota-exhausted-in-{hook_name}"):
            assert part in message, f"{part!r} missing from the CRI error {message!r}"

    fails("PreRunPodSandbox", lambda: kubelet.run_pod("strict"))
    assert not [p for p in direct.runtime.ListPodSandbox(cri.ListPodSandboxRequest()).items
                if p.metadata.name == "strict"], "a failed Pre hook must stop the call before the backend"
    sid = kubelet.run_pod("strict")

    fails("PreCreateContainer", lambda: kubelet.create_container(sid, "app", rig.containerd.image))
    listed = direct.runtime.ListContainers(cri.ListContainersRequest(
        filter=cri.ContainerFilter(pod_sandbox_id=sid))).containers
    assert listed == []
    cid = kubelet.create_container(sid, "app", rig.containerd.image, resources={"cpu_shares": 256})

    fails("PreStartContainer", lambda: kubelet.start_container(cid))
    assert direct.container_status(cid).status.state == cri.ContainerState.CONTAINER_CREATED
    kubelet.start_container(cid)

    fails("PreUpdateContainerResources", lambda: kubelet.update_resources(cid, {"cpu_shares": 900}))
    assert cgroup(kubelet, sid, cid).cpu_weight() == shares_to_weight(256)


def test_unreachable_plugins_with_ignore_do_not_stop_pods(rig: Rig) -> None:
    (rig.hook_dir / "10-gone.json").write_text(json.dumps(
        {"remote-endpoint": str(rig.root / "nobody-here.sock"), "runtime-hooks": list(ALL_HOOKS)}))
    stale = rig.root / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))  # a socket file that nobody listens on, as a crashed plugin leaves
    (rig.hook_dir / "15-stale.json").write_text(json.dumps(
        {"remote-endpoint": f"unix://{stale}", "failure-policy": "Ignore", "runtime-hooks": list(ALL_HOOKS)}))
    good = rig.plugin("20-good.json")
    good.behaviours["PreRunPodSandbox"] = Behaviour(
        answer=lambda req: hook.PodSandboxHookResponse(labels={"from-good": "1"}))
    rig.start_proxy()
    kubelet = rig.kubelet()

    sid = kubelet.run_pod("unreachable")
    cid = kubelet.run_container(sid, "app", rig.containerd.image)
    kubelet.update_resources(cid, {"cpu_shares": 300})
    kubelet.stop_container(cid, grace=5)
    kubelet.stop_pod(sid)
    assert kubelet.pod_status(sid).status.labels["from-good"] == "1"
    assert good.hooks_seen() == list(LIFECYCLE_HOOKS)


def test_registration_files_added_renamed_and_removed_take_effect_while_running(rig: Rig) -> None:
    rig.start_proxy()
    kubelet = rig.kubelet()
    sid = kubelet.run_pod("watch")
    cid = kubelet.run_container(sid, "app", rig.containerd.image)
    plugin = RecordingPlugin(rig.root / "late.sock", name="10-late.json").start()
    rig.plugins.append(plugin)

    def calls() -> int:
        return len(plugin.requests("PreUpdateContainerResources"))

    def update_reaches_plugin() -> bool:
        before = calls()
        kubelet.update_resources(cid, {"cpu_shares": 300})
        return calls() > before

    kubelet.update_resources(cid, {"cpu_shares": 300})
    assert calls() == 0
    path = plugin.registration(rig.hook_dir, "10-late.json", hooks=["PreUpdateContainerResources"])
    eventually(update_reaches_plugin, what="a new registration being called")

    disabled = path.with_name("10-late.json.disabled")
    path.rename(disabled)
    eventually(lambda: not update_reaches_plugin(), what="a registration renamed away being dropped")
    disabled.rename(path)
    eventually(update_reaches_plugin, what="a registration renamed back being called")

    path.unlink()
    eventually(lambda: not update_reaches_plugin(), what="a deleted registration being dropped")
    for _ in range(3):
        assert not update_reaches_plugin()


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_metrics_health_and_readiness(rig: Rig) -> None:
    ok = rig.plugin("10-a.json", hooks=["PreRunPodSandbox", "PreCreateContainer"])
    slow = rig.plugin("20-slow.json", hooks=["PreRunPodSandbox"], timeout=1)
    slow.behaviours["PreRunPodSandbox"] = Behaviour(delay=3)
    port = free_port()
    rig.start_proxy(metrics_bind_address=f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    assert _get(f"{base}/healthz")[0] == 200
    # With HAProxy, ready also needs the proxy's own Version call through the public socket.
    eventually(lambda: _get(f"{base}/readyz")[0] == 200, what="/readyz")
    kubelet = rig.kubelet()

    sid = kubelet.run_pod("metrics")
    kubelet.run_container(sid, "app", rig.containerd.image)
    with pytest.raises(grpc.RpcError) as missing:
        kubelet.start_container("0" * 64)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    ok.wait_for("PreCreateContainer")

    status, text = _get(f"{base}/metrics")
    assert status == 200
    cri_calls = _samples(text, "koord_runtime_proxy_cri_requests_total")

    def cri_count(method: str, code: str) -> float:
        return cri_calls.get((("code", code), ("method", f"runtime.v1.RuntimeService/{method}")), 0)

    assert cri_count("RunPodSandbox", "OK") == 1
    assert cri_count("CreateContainer", "OK") == 1
    assert cri_count("StartContainer", "OK") == 1
    assert cri_count("StartContainer", "NOT_FOUND") == 1
    via_haproxy = _samples(text, "koord_runtime_proxy_haproxy_requests_total").get(
        (("method", "runtime.v1.RuntimeService/Version"),), 0)
    assert cri_count("Version", "OK") + via_haproxy >= 1, "pass-through calls are counted too (by Python or HAProxy)"
    assert _samples(text, "koord_runtime_proxy_cri_request_duration_seconds_count")[
        (("code", "OK"), ("method", "runtime.v1.RuntimeService/RunPodSandbox"))] == 1

    hooks = _samples(text, "koord_runtime_proxy_hook_duration_seconds_count")

    def hook_count(plugin: str, hook_name: str, outcome: str) -> float:
        return hooks.get((("hook", hook_name), ("outcome", outcome), ("plugin", plugin)), 0)

    assert hook_count("10-a.json", "PreRunPodSandbox", "ok") == 1
    assert hook_count("10-a.json", "PreCreateContainer", "ok") == 1
    assert hook_count("20-slow.json", "PreRunPodSandbox", "timeout") == 1
    assert hook_count("20-slow.json", "PreRunPodSandbox", "ok") == 0
    assert _samples(text, "koord_runtime_proxy_registered_plugins") == {(): 2}

"""The proxy's store across crashes and outages: plugins must get the same full info
whether or not the proxy restarted, and whether or not a container went through it.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri
from google.protobuf.json_format import MessageToDict

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord_testing.cgroups import Cgroup, shares_to_weight
from koord_testing.hookplugin import Behaviour, RecordingPlugin
from koord_testing.kubelet import KubeletClient, pod_cgroup_parent

from .rig import MiB, Rig, eventually, free_port

pytestmark = pytest.mark.e2e

POD_LABELS = {"app": "web", "koordinator.sh/qosClass": "LS"}
POD_ANNOTATIONS = {"team": "x"}
ENVS = [("Z_FIRST", "1"), ("A_SECOND", "2")]
CTR_ANNOTATIONS = {"orig-ann": "y"}
RESOURCES = {"cpu_shares": 256, "cpu_period": 100000, "cpu_quota": 30000, "memory_limit_in_bytes": 100 * MiB}


def hooked_plugins(rig: Rig) -> tuple[RecordingPlugin, RecordingPlugin]:
    """10-a changes everything a plugin can change at creation; 20-b records PreStartContainer."""
    a = rig.plugin("10-a.json", hooks=["PreRunPodSandbox", "PreCreateContainer"])
    b = rig.plugin("20-b.json", hooks=["PreStartContainer"])
    a.behaviours["PreRunPodSandbox"] = Behaviour(answer=lambda req: hook.PodSandboxHookResponse(
        labels={"hook/label": "1"}, annotations={"hook/pod-ann": "1"},
        # Nested in the pod's own dir, so the containerd fixture's cgroup cleanup removes it.
        cgroup_parent=f"{req.cgroup_parent}/hooked"))
    a.behaviours["PreCreateContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_annotations={"hook/ctr-ann": "1"}, container_envs={"A_SECOND": "from-a", "HOOK_ENV": "1"},
        container_resources=hook.LinuxContainerResources(cpu_shares=300, memory_limit_in_bytes=80 * MiB)))
    return a, b


def proxy_client(rig: Rig) -> KubeletClient:
    """A fresh connection: after a restart kubelet reconnects, with its own copy of the sandbox configs."""
    client = rig.kubelet()
    for old in rig.clients[:-1]:
        client.sandbox_configs.update(old.sandbox_configs)
    return client


def check_full_info(req, *, name: str, namespace: str, uid: str, container: str, container_id: str,
                    cgroup_parent: str, hooked: bool) -> None:
    assert (req.pod_meta.name, req.pod_meta.namespace, req.pod_meta.uid) == (name, namespace, uid)
    assert (req.container_meta.name, req.container_meta.id) == (container, container_id)
    assert {**POD_LABELS, "io.kubernetes.pod.uid": uid}.items() <= dict(req.pod_labels).items()
    assert POD_ANNOTATIONS.items() <= dict(req.pod_annotations).items()
    assert CTR_ANNOTATIONS.items() <= dict(req.container_annotations).items()
    assert req.pod_cgroup_parent == cgroup_parent
    if hooked:
        assert req.pod_labels["hook/label"] == "1" and req.pod_annotations["hook/pod-ann"] == "1"
        assert req.container_annotations["hook/ctr-ann"] == "1"
        assert dict(req.container_envs) == {"Z_FIRST": "1", "A_SECOND": "from-a", "HOOK_ENV": "1"}
        resources = {**RESOURCES, "cpu_shares": 300, "memory_limit_in_bytes": 80 * MiB}
    else:
        assert dict(req.container_envs) == dict(ENVS)
        resources = RESOURCES
    # Exactly what was sent to containerd at creation: nothing missing, nothing added.
    assert req.container_resources == hook.LinuxContainerResources(**resources)


def normalized(req, replacements: dict[str, str]) -> dict:
    text = json.dumps(MessageToDict(req), sort_keys=True)
    for old, new in replacements.items():
        text = text.replace(old, new)
    return json.loads(text)


def test_kill9_between_create_and_start_gives_prestart_the_same_info(rig: Rig) -> None:
    _, b = hooked_plugins(rig)
    rig.start_proxy()
    kubelet = rig.kubelet()

    def create(namespace: str) -> tuple[str, str]:
        sid = kubelet.run_pod("recover", namespace=namespace, qos="burstable",
                              labels=POD_LABELS, annotations=POD_ANNOTATIONS)
        cid = kubelet.create_container(sid, "app", rig.containerd.image, envs=ENVS,
                                       annotations=CTR_ANNOTATIONS, resources=RESOURCES)
        return sid, cid

    control_sid, control_cid = create("control")
    kubelet.start_container(control_cid)
    sid, cid = create("restarted")
    rig.proxy.kill()
    rig.proxy.start()
    proxy_client(rig).start_container(cid)

    control, restarted = b.requests("PreStartContainer")
    uid = kubelet.sandbox_configs[sid].metadata.uid
    check_full_info(restarted, name="recover", namespace="restarted", uid=uid, container="app",
                    container_id=cid, cgroup_parent=pod_cgroup_parent("burstable", uid) + "/hooked", hooked=True)
    control_uid = kubelet.sandbox_configs[control_sid].metadata.uid
    got = normalized(restarted, {uid: "UID", cid: "CID", "restarted": "NS"})
    want = normalized(control, {control_uid: "UID", control_cid: "CID", "control": "NS"})
    for field in sorted(got.keys() | want.keys()):
        assert got.get(field) == want.get(field), f"{field} differs after the restart"
    assert Cgroup.of_container(restarted.pod_cgroup_parent, cid).cpu_weight() == shares_to_weight(300)


def test_prestart_answer_raising_memory_after_a_restart_is_applied(rig: Rig) -> None:
    """The same PreStartContainer answer must work whether or not the proxy restarted in between."""
    plugin = rig.plugin("10-a.json", hooks=["PreStartContainer"])
    plugin.behaviours["PreStartContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(memory_limit_in_bytes=200 * MiB)))
    rig.start_proxy()
    kubelet = rig.kubelet()
    sid = kubelet.run_pod("raise-memory", qos="burstable")
    cid = kubelet.create_container(sid, "app", rig.containerd.image, resources={"memory_limit_in_bytes": 100 * MiB})
    rig.proxy.kill()
    rig.proxy.start()
    proxy_client(rig).start_container(cid)
    assert Cgroup.of_container(kubelet.pod_cgroup_parent(sid), cid).memory_limit() == 200 * MiB


def test_containers_created_at_containerd_directly_get_full_info(rig: Rig) -> None:
    _, b = hooked_plugins(rig)
    rig.start_proxy()
    kubelet = rig.kubelet()
    direct = rig.direct()

    def prestart_of(container_id: str):
        found = [r for r in b.requests("PreStartContainer") if r.container_meta.id == container_id]
        assert len(found) == 1, f"expected one PreStartContainer for {container_id}, got {len(found)}"
        return found[0]

    # A pod through the proxy, a container created behind its back: looked up on demand.
    sid = kubelet.run_pod("mixed", namespace="direct", qos="burstable",
                          labels=POD_LABELS, annotations=POD_ANNOTATIONS)
    uid = kubelet.sandbox_configs[sid].metadata.uid
    direct.sandbox_configs[sid] = kubelet.sandbox_configs[sid]
    hooked_parent = pod_cgroup_parent("burstable", uid) + "/hooked"
    cid_up = direct.create_container(sid, "while-up", rig.containerd.image, envs=ENVS,
                                     annotations=CTR_ANNOTATIONS, resources=RESOURCES)
    kubelet.start_container(cid_up)
    req = prestart_of(cid_up)
    check_full_info(req, name="mixed", namespace="direct", uid=uid, container="while-up", container_id=cid_up,
                    cgroup_parent=hooked_parent, hooked=False)
    assert req.pod_labels["hook/label"] == "1", "the pod itself went through the hooks"

    # Pod and container both created behind the proxy's back.
    other = direct.run_pod("bypass", namespace="direct", qos="besteffort",
                           labels=POD_LABELS, annotations=POD_ANNOTATIONS)
    other_uid = direct.sandbox_configs[other].metadata.uid
    cid_other = direct.create_container(other, "app", rig.containerd.image, envs=ENVS,
                                        annotations=CTR_ANNOTATIONS, resources=RESOURCES)
    kubelet.start_container(cid_other)
    req = prestart_of(cid_other)
    check_full_info(req, name="bypass", namespace="direct", uid=other_uid, container="app", container_id=cid_other,
                    cgroup_parent=pod_cgroup_parent("besteffort", other_uid), hooked=False)
    assert "hook/label" not in req.pod_labels

    # Created while the proxy was down: found by the store rebuild at start.
    rig.proxy.kill()
    cid_down = direct.create_container(sid, "while-down", rig.containerd.image, envs=ENVS,
                                       annotations=CTR_ANNOTATIONS, resources=RESOURCES)
    rig.proxy.start()
    proxy_client(rig).start_container(cid_down)
    check_full_info(prestart_of(cid_down), name="mixed", namespace="direct", uid=uid, container="while-down",
                    container_id=cid_down, cgroup_parent=hooked_parent, hooked=False)
    assert prestart_of(cid_down).pod_labels["hook/label"] == "1"


def test_proxy_started_while_containerd_is_down_waits_then_serves_full_info(rig: Rig) -> None:
    _, b = hooked_plugins(rig)
    proxy = rig.start_proxy()
    kubelet = rig.kubelet()
    sid = kubelet.run_pod("outage", namespace="outage", qos="burstable",
                          labels=POD_LABELS, annotations=POD_ANNOTATIONS)
    uid = kubelet.sandbox_configs[sid].metadata.uid
    cid = kubelet.create_container(sid, "app", rig.containerd.image, envs=ENVS,
                                   annotations=CTR_ANNOTATIONS, resources=RESOURCES)
    proxy.stop()

    errors: list[BaseException] = []

    def start() -> None:
        try:
            proxy.start(timeout=60)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    starter = threading.Thread(target=start)
    rig.containerd.stop_daemon()
    try:
        starter.start()
        eventually(lambda: "waiting for backend" in proxy.logs(), timeout=15, what="the proxy logging its wait")
        assert proxy.running, "the proxy must keep waiting for its backend, not exit"
        assert not Path(proxy.endpoint).exists(), "it must not serve before the store is rebuilt"
    finally:
        rig.containerd.restart_daemon()
        starter.join(90)
    assert not errors, errors
    assert not starter.is_alive()

    proxy_client(rig).start_container(cid)
    (req,) = b.requests("PreStartContainer")
    check_full_info(req, name="outage", namespace="outage", uid=uid, container="app", container_id=cid,
                    cgroup_parent=pod_cgroup_parent("burstable", uid) + "/hooked", hooked=True)


def _store_sizes(port: int) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return values["koord_runtime_proxy_store_pods"], values["koord_runtime_proxy_store_containers"]


def test_failed_remove_and_stop_drop_nothing_from_the_store(rig: Rig) -> None:
    # No plugins: a record dropped by mistake would not be fetched back by a hook look-up.
    port = free_port()
    rig.start_proxy(metrics_bind_address=f"127.0.0.1:{port}")
    kubelet = rig.kubelet()

    def store_is(pods: int, containers: int) -> None:
        # The gauges follow the store every 2 s.
        eventually(lambda: _store_sizes(port) == (pods, containers), timeout=8,
                   what=f"store holding {pods} pods and {containers} containers (now {_store_sizes(port)})")

    def backend_answers() -> bool:
        # A hooked method: with HAProxy in front, Version bypasses Python, whose own channel to
        # containerd may still be reconnecting when HAProxy's already answers.
        try:
            kubelet.runtime.RemoveContainer(cri.RemoveContainerRequest(container_id="f" * 64), timeout=2)
            return True
        except grpc.RpcError:
            return False

    sid = kubelet.run_pod("remove", labels=POD_LABELS, annotations=POD_ANNOTATIONS)
    first = kubelet.run_container(sid, "first", rig.containerd.image, envs=ENVS)
    kubelet.create_container(sid, "second", rig.containerd.image, envs=ENVS)
    store_is(1, 2)

    with pytest.raises(grpc.RpcError) as failed:
        kubelet.runtime.RemoveContainer(cri.RemoveContainerRequest(container_id=""))
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    kubelet.runtime.RemoveContainer(cri.RemoveContainerRequest(container_id="f" * 64))  # containerd: OK
    rig.containerd.stop_daemon()
    try:
        for call in (lambda: kubelet.stop_container(first, grace=5), lambda: kubelet.remove_container(first),
                     lambda: kubelet.stop_pod(sid), lambda: kubelet.remove_pod(sid)):
            with pytest.raises(grpc.RpcError):
                call()
    finally:
        rig.containerd.restart_daemon()
    eventually(backend_answers, timeout=10, what="the proxy reaching the restarted containerd")
    kubelet.stop_container(first, grace=5)
    # One more container: once the gauge shows it, it has seen every call above.
    kubelet.create_container(sid, "third", rig.containerd.image)
    store_is(1, 3)

    kubelet.remove_container(first)
    store_is(1, 2)
    kubelet.stop_pod(sid)
    kubelet.remove_pod(sid)
    store_is(0, 0)

"""20 pods at once through the proxy with two chained plugins: every container must get
its own pod's values, and every later hook its own pod's info (no lost or crossed store
entries).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord_testing.cgroups import shares_to_weight
from koord_testing.hookplugin import Behaviour

from .rig import Rig, cgroup, only_keys, spec_env

pytestmark = pytest.mark.e2e

PODS = 20


def shares_for(pod_name: str) -> int:
    return 100 + 10 * int(pod_name.rsplit("-", 1)[1])


def test_parallel_pods_get_their_own_values_and_store_entries(rig: Rig) -> None:
    a = rig.plugin("10-a.json", hooks=["PreRunPodSandbox", "PreCreateContainer"])
    b = rig.plugin("20-b.json", hooks=["PreCreateContainer", "PreStartContainer", "PostStopContainer",
                                       "PostStopPodSandbox"])
    # Every answer is derived from the request, so a crossed entry shows as a wrong value.
    a.behaviours["PreRunPodSandbox"] = Behaviour(answer=lambda req: hook.PodSandboxHookResponse(
        annotations={"a/pod": req.pod_meta.name}))
    a.behaviours["PreCreateContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_envs={"FROM_A": req.pod_annotations["a/pod"]},
        container_resources=hook.LinuxContainerResources(cpu_shares=shares_for(req.pod_meta.name))))
    b.behaviours["PreCreateContainer"] = Behaviour(answer=lambda req: hook.ContainerResourceHookResponse(
        container_envs={"FROM_B": f"{req.container_envs['FROM_A']}+{req.pod_meta.uid}"}))
    rig.start_proxy()

    kubelets = [rig.kubelet() for _ in range(PODS)]  # one connection per pod worker, like kubelet's

    def one_pod(i: int) -> tuple[str, str, str, str]:
        name = f"conc-{i:02d}"
        sid = kubelets[i].run_pod(name, namespace="conc", labels={"pod": name})
        cid = kubelets[i].run_container(sid, "app", rig.containerd.image, envs={"OWN": name})
        return name, kubelets[i].sandbox_configs[sid].metadata.uid, sid, cid

    with ThreadPoolExecutor(PODS) as pool:
        pods = list(pool.map(one_pod, range(PODS)))
    clients = {sid: kubelets[i] for i, (_, _, sid, _) in enumerate(pods)}

    starts = {r.container_meta.id: r for r in b.requests("PreStartContainer")}
    assert len(b.requests("PreStartContainer")) == PODS
    for name, uid, sid, cid in pods:
        kubelet = clients[sid]
        req = starts[cid]
        assert (req.pod_meta.name, req.pod_meta.uid, req.container_meta.name) == (name, uid, "app")
        assert req.pod_labels["pod"] == name
        assert req.pod_annotations["a/pod"] == name
        assert dict(req.container_envs) == {"OWN": name, "FROM_A": name, "FROM_B": f"{name}+{uid}"}
        assert req.container_resources.cpu_shares == shares_for(name)
        assert cgroup(kubelet, sid, cid).cpu_weight() == shares_to_weight(shares_for(name))
        assert only_keys(spec_env(kubelet, cid), {"OWN", "FROM_A", "FROM_B"}) == \
            [f"OWN={name}", f"FROM_A={name}", f"FROM_B={name}+{uid}"]

    def teardown(pod: tuple[str, str, str, str]) -> None:
        _, _, sid, cid = pod
        clients[sid].stop_container(cid, grace=5)
        clients[sid].stop_pod(sid)

    with ThreadPoolExecutor(PODS) as pool:
        list(pool.map(teardown, pods))
    stopped = {r.container_meta.id: r for r in b.requests("PostStopContainer")}
    pods_stopped = sorted(r.pod_meta.uid for r in b.requests("PostStopPodSandbox"))
    assert pods_stopped == sorted(uid for _, uid, _, _ in pods)
    for name, uid, _, cid in pods:
        assert (stopped[cid].pod_meta.name, stopped[cid].pod_meta.uid) == (name, uid)
        assert stopped[cid].container_envs["FROM_B"] == f"{name}+{uid}"

"""Small builders shared by the QoS manager's unit tests."""

from __future__ import annotations

from koord.koordlet.qosmanager.nodeinfo import Processor
from koord.koordlet.statesinformer import ContainerMeta, PodMeta

GI = 1 << 30


def pod(uid: str, koord_qos: str = "", kube_qos: str = "burstable", *, name: str | None = None,
        priority: int | None = None, annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None, containers: int = 1, running: bool = True,
        batch_cpu: int = 0, kube_dir: str = "kubepods") -> PodMeta:
    qos_dir = kube_dir if kube_qos == "guaranteed" else f"{kube_dir}/{kube_qos}"
    pod_dir = f"{qos_dir}/pod{uid}"
    return PodMeta(
        namespace="default", name=name or uid, uid=uid, labels=dict(labels or {}),
        annotations=dict(annotations or {}), kube_qos=kube_qos, koord_qos=koord_qos,
        priority=priority, cgroup_dir=pod_dir, sandbox_id=f"sandbox-{uid}", running=running,
        containers=[ContainerMeta(name=f"c{i}", id=f"{uid}-c{i}", cgroup_dir=f"{pod_dir}/{uid}-c{i}",
                                  running=running,
                                  requests={"kubernetes.io/batch-cpu": batch_cpu} if batch_cpu else {})
                    for i in range(containers)])


def procs(*rows: tuple[int, int, int, int]) -> list[Processor]:
    """(cpu, core, socket, node) rows."""
    return [Processor(cpu=c, core=core, socket=s, node=n) for c, core, s, n in rows]

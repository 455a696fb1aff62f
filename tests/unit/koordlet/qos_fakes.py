"""Pod and CPU builders for the QoS manager's unit tests (over koord_testing.pods)."""

from __future__ import annotations

from koord.koordlet.qosmanager.nodeinfo import Processor
from koord.koordlet.statesinformer import PodMeta
from koord_testing.pods import container_meta, pod_meta

GI = 1 << 30


def pod(uid: str, koord_qos: str = "", kube_qos: str = "burstable", *, name: str | None = None,
        priority: int | None = None, annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None, containers: int = 1, running: bool = True,
        batch_cpu: int = 0, kube_dir: str = "kubepods") -> PodMeta:
    """A pod under ``kube_dir`` (cgroupfs layout) with ``containers`` containers."""
    qos_dir = kube_dir if kube_qos == "guaranteed" else f"{kube_dir}/{kube_qos}"
    pod_dir = f"{qos_dir}/pod{uid}"
    return pod_meta("default", name or uid, uid, pod_dir, kube_qos=kube_qos, koord_qos=koord_qos,
                    running=running, priority=priority, labels=labels, annotations=annotations, containers=[
                        container_meta(f"c{i}", f"{uid}-c{i}", f"{pod_dir}/{uid}-c{i}", running=running,
                                       requests={"kubernetes.io/batch-cpu": batch_cpu} if batch_cpu else None)
                        for i in range(containers)])


def procs(*rows: tuple[int, int, int, int]) -> list[Processor]:
    """(cpu, core, socket, node) rows."""
    return [Processor(cpu=c, core=core, socket=s, node=n) for c, core, s, n in rows]

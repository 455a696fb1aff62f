"""Fixtures shared by koordlet's unit tests."""

from __future__ import annotations

import json
import shutil
import tempfile
from concurrent import futures

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc


class FakeCRI(cri_grpc.RuntimeServiceServicer):
    """Answers like containerd 1.6: verbose status carries the original config in info JSON."""

    def __init__(self):
        self.pods: dict[str, dict] = {}
        self.containers: dict[str, dict] = {}

    def add_pod(self, sid, name, labels, parent, state=cri.SANDBOX_READY, annotations=None):
        self.pods[sid] = dict(name=name, labels=labels, parent=parent, state=state,
                              annotations=annotations or {})

    def add_container(self, cid, sid, name, envs=None, resources=None, state=cri.CONTAINER_RUNNING):
        self.containers[cid] = dict(sid=sid, name=name, envs=envs or {},
                                    resources=resources or {}, state=state)

    def _meta(self, sid):
        p = self.pods[sid]
        return cri.PodSandboxMetadata(name=p["name"], namespace="ns", uid="uid-" + sid)

    def ListPodSandbox(self, request, context):
        want = request.filter.state.state if request.filter.HasField("state") else None
        return cri.ListPodSandboxResponse(items=[
            cri.PodSandbox(id=sid, metadata=self._meta(sid), state=p["state"], labels=p["labels"])
            for sid, p in self.pods.items() if want is None or p["state"] == want])

    def PodSandboxStatus(self, request, context):
        p = self.pods[request.pod_sandbox_id]
        config = {"metadata": {"name": p["name"], "namespace": "ns"}, "labels": p["labels"],
                  "annotations": p["annotations"], "linux": {"cgroup_parent": p["parent"]}}
        if p["parent"] is None:
            config["linux"] = {}
        info = {"pid": 1, "processStatus": "running", "config": config, "runtimeSpec": {}}
        return cri.PodSandboxStatusResponse(
            status=cri.PodSandboxStatus(id=request.pod_sandbox_id,
                                        metadata=self._meta(request.pod_sandbox_id),
                                        state=p["state"], labels=p["labels"],
                                        annotations=p["annotations"]),
            info={"info": json.dumps(info)} if request.verbose else {})

    def ListContainers(self, request, context):
        want = request.filter.state.state if request.filter.HasField("state") else None
        return cri.ListContainersResponse(containers=[
            cri.Container(id=cid, pod_sandbox_id=c["sid"], state=c["state"],
                          metadata=cri.ContainerMetadata(name=c["name"]),
                          annotations={"io.kubernetes.container.name": c["name"]})
            for cid, c in self.containers.items() if want is None or c["state"] == want])

    def ContainerStatus(self, request, context):
        c = self.containers[request.container_id]
        config = {"metadata": {"name": c["name"]},
                  "envs": [{"key": k, "value": v} for k, v in c["envs"].items()],
                  "linux": {"resources": c["resources"]}}
        info = {"sandboxID": c["sid"], "pid": 2, "config": config}
        return cri.ContainerStatusResponse(
            status=cri.ContainerStatus(id=request.container_id, state=c["state"]),
            info={"info": json.dumps(info)} if request.verbose else {})


@pytest.fixture
def fake_cri():
    d = tempfile.mkdtemp(prefix="kl-cri-", dir="/tmp")
    servicer = FakeCRI()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    cri_grpc.add_RuntimeServiceServicer_to_server(servicer, server)
    sock = f"{d}/cri.sock"
    server.add_insecure_port("unix:" + sock)
    server.start()
    servicer.endpoint = "unix://" + sock
    yield servicer
    server.stop(0)
    shutil.rmtree(d, ignore_errors=True)

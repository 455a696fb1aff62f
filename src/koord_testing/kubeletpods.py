"""kubelet's ``/pods`` endpoint for tests: the pod specs (requests, limits, priority) of
pods really run on the test's containerd, served over HTTP the way kubelet's read-only
port serves them, so koordlet's kubelet pod source reads them unchanged.

CRI carries no resource requests; modules that need them (memory QoS, allocatable
evictions) read pods from kubelet in a cluster. There is no kubelet on the test machines,
so the test describes each pod it ran (``pod_json``) and this server answers with them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .kubelet import KubeletClient

_QOS = {"guaranteed": "Guaranteed", "burstable": "Burstable", "besteffort": "BestEffort"}


def pod_json(kubelet: KubeletClient, sandbox_id: str, containers: Mapping[str, str], *,
             qos: str, requests: Mapping[str, Mapping[str, str]] | None = None,
             limits: Mapping[str, Mapping[str, str]] | None = None,
             priority: int | None = None) -> dict[str, Any]:
    """The Pod object kubelet would list for a pod ``kubelet`` ran: identity, labels and
    annotations from its sandbox config, ``containers`` name -> container id, resources
    per container name."""
    config = kubelet.sandbox_configs[sandbox_id]
    meta = config.metadata
    spec: dict[str, Any] = {"containers": [
        {"name": name, "resources": {"requests": dict((requests or {}).get(name, {})),
                                     "limits": dict((limits or {}).get(name, {}))}}
        for name in containers]}
    if priority is not None:
        spec["priority"] = priority
    return {
        "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid,
                     "labels": dict(config.labels), "annotations": dict(config.annotations)},
        "spec": spec,
        "status": {"phase": "Running", "qosClass": _QOS[qos], "containerStatuses": [
            {"name": name, "containerID": f"containerd://{cid}", "state": {"running": {}}}
            for name, cid in containers.items()]},
    }


class KubeletPodsServer:
    """``GET /pods/`` on 127.0.0.1 answering a PodList of ``pods`` (set it at any time)."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if self.path.rstrip("/") != "/pods":
                    self.send_error(404)
                    return
                body = json.dumps({"kind": "PodList", "apiVersion": "v1",
                                   "items": list(owner.pods)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="kubelet-pods",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

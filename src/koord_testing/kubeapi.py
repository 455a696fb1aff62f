"""A tiny Kubernetes API server for koordlet's tests: the few endpoints koordlet uses.

Cluster-scoped Node, NodeSLO, NodeMetric and NodeResourceTopology: list (with
``fieldSelector=metadata.name=``), watch (newline-delimited JSON events from a
resourceVersion), get, the NodeMetric ``/status`` PUT with resourceVersion conflicts (409)
as the real API server answers them, and create (POST) / update (PUT) of
NodeResourceTopology. Pod evictions (POST ``.../pods/<name>/eviction``, answered with
``eviction_status``: 201, or 429 as when a PodDisruptionBudget refuses) and Events (POST
``.../namespaces/<ns>/events``) are recorded in ``evictions`` and ``events``.
``crds=False`` answers 404 for every Koordinator and topology kind, as an API server
without those CRDs does. Every request is recorded as (verb, path) for RBAC checks.
Serves plain HTTP on loopback at a free port; the real ``kubernetes`` client talks to it.
"""

from __future__ import annotations

import copy
import json
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

_PATHS = {
    "/api/v1/nodes": ("v1", "Node", "NodeList"),
    "/apis/slo.koordinator.sh/v1alpha1/nodeslos": ("slo.koordinator.sh/v1alpha1", "NodeSLO", "NodeSLOList"),
    "/apis/slo.koordinator.sh/v1alpha1/nodemetrics": ("slo.koordinator.sh/v1alpha1", "NodeMetric",
                                                      "NodeMetricList"),
    "/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies": (
        "topology.node.k8s.io/v1alpha1", "NodeResourceTopology", "NodeResourceTopologyList"),
}
_CORE = "/api/v1/nodes"


class FakeKubeAPI:
    def __init__(self, crds: bool = True, port: int = 0) -> None:
        """``port`` 0 picks a free one; a given port brings a stopped server "back"."""
        self.crds = crds
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._version = 100
        self.objects: dict[str, dict[str, dict]] = {p: {} for p in _PATHS}
        self._watchers: list[tuple[str, queue.Queue]] = []
        self._history: list[tuple[int, str, dict]] = []  # (resourceVersion, path, event)
        self.status_updates: list[dict] = []
        self.conflicts_to_inject = 0
        self.evictions: list[dict] = []
        self.events: list[dict] = []
        self.eviction_status = 201
        self.closing = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # watches need chunked encoding

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api._get(self)

            def do_PUT(self) -> None:
                api._put(self)

            def do_POST(self) -> None:
                api._post(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "users": [{"name": "fake", "user": {"token": "t"}}]}))
        return path

    # ---- object store ------------------------------------------------------------------

    def put(self, path: str, obj: dict) -> dict:
        """Creates or replaces an object (as the manager would) and tells the watchers."""
        with self._lock:
            obj = copy.deepcopy(obj)
            api_version, kind, _ = _PATHS[path]
            obj.setdefault("apiVersion", api_version)
            obj.setdefault("kind", kind)
            name = obj["metadata"]["name"]
            event = "MODIFIED" if name in self.objects[path] else "ADDED"
            self._version += 1
            obj["metadata"]["resourceVersion"] = str(self._version)
            self.objects[path][name] = obj
            self._publish(path, event, obj)
            return copy.deepcopy(obj)

    def delete(self, path: str, name: str) -> None:
        with self._lock:
            obj = self.objects[path].pop(name)
            self._version += 1
            self._publish(path, "DELETED", obj)

    def _publish(self, path: str, event: str, obj: dict) -> None:
        self._history.append((self._version, path, {"type": event, "object": copy.deepcopy(obj)}))
        for wpath, q in self._watchers:
            if wpath == path:
                q.put({"type": event, "object": copy.deepcopy(obj)})

    # ---- HTTP --------------------------------------------------------------------------

    def _send(self, h: BaseHTTPRequestHandler, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        h.wfile.write(data)

    def _status(self, h: BaseHTTPRequestHandler, code: int, reason: str, message: str) -> None:
        self._send(h, code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                             "reason": reason, "message": message, "code": code})

    def _served(self, h: BaseHTTPRequestHandler, verb: str, base: str) -> bool:
        """Records the request; False (404 sent) for a kind whose CRD is not installed."""
        self.requests.append((verb, urlparse(h.path).path))
        if base and base != _CORE and not self.crds:
            self._status(h, 404, "NotFound", "the server could not find the requested resource")
            return False
        return True

    def _split(self, raw_path: str) -> tuple[str, str | None, str | None]:
        for base in _PATHS:
            if raw_path == base:
                return base, None, None
            if raw_path.startswith(base + "/"):
                name, _, sub = raw_path[len(base) + 1:].partition("/")
                return base, name, sub or None
        return "", None, None

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        base, name, _ = self._split(url.path)
        verb = "watch" if query.get("watch") in ("true", "1") else "get" if name else "list"
        if not self._served(h, verb, base):
            return None
        if not base:
            return self._status(h, 404, "NotFound", f"no such path {url.path}")
        selector = query.get("fieldSelector", "")
        wanted = selector.removeprefix("metadata.name=") if selector.startswith("metadata.name=") else None
        if name is not None:
            with self._lock:
                obj = self.objects[base].get(name)
            if obj is None:
                return self._status(h, 404, "NotFound", f"{name} not found")
            return self._send(h, 200, obj)
        if query.get("watch") in ("true", "1"):
            return self._watch(h, base, wanted, float(query.get("timeoutSeconds", "60")),
                               int(query.get("resourceVersion") or 0))
        with self._lock:
            items = [copy.deepcopy(o) for n, o in self.objects[base].items()
                     if wanted is None or n == wanted]
            version = str(self._version)
        _, _, list_kind = _PATHS[base]
        self._send(h, 200, {"apiVersion": _PATHS[base][0], "kind": list_kind,
                            "metadata": {"resourceVersion": version}, "items": items})

    def _watch(self, h: BaseHTTPRequestHandler, base: str, wanted: str | None,
               timeout: float, since: int) -> None:
        """Events after ``since`` first (what happened between the list and the watch), then live."""
        q: queue.Queue = queue.Queue()
        with self._lock:
            for version, path, event in self._history:
                if path == base and version > since:
                    q.put(copy.deepcopy(event))
            self._watchers.append((base, q))
        try:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Transfer-Encoding", "chunked")
            h.send_header("Connection", "close")
            h.end_headers()
            h.close_connection = True
            h.wfile.flush()
            waited = 0.0
            while waited < timeout and not self.closing.is_set():
                try:
                    event = q.get(timeout=0.2)
                except queue.Empty:
                    waited += 0.2
                    continue
                if wanted is not None and event["object"]["metadata"]["name"] != wanted:
                    continue
                line = json.dumps(event).encode() + b"\n"
                h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass
        finally:
            with self._lock:
                self._watchers.remove((base, q))

    def _put(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        base, name, sub = self._split(url.path)
        length = int(h.headers.get("Content-Length", "0"))
        body = json.loads(h.rfile.read(length) or b"{}")
        if not self._served(h, "update", base):
            return None
        if base.endswith("noderesourcetopologies") and name is not None and sub is None:
            return self._update(h, base, name, body)
        if not base.endswith("nodemetrics") or name is None or sub != "status":
            return self._status(h, 405, "MethodNotAllowed", "only nodemetrics/<name>/status is writable")
        with self._lock:
            current = self.objects[base].get(name)
            if current is None:
                return self._status(h, 404, "NotFound", f"nodemetrics {name} not found")
            sent_version = (body.get("metadata") or {}).get("resourceVersion")
            if self.conflicts_to_inject > 0 or sent_version != current["metadata"]["resourceVersion"]:
                self.conflicts_to_inject = max(0, self.conflicts_to_inject - 1)
                self._version += 1  # someone else wrote in between
                current["metadata"]["resourceVersion"] = str(self._version)
                conflict = True
            else:
                conflict = False
        if conflict:
            return self._status(h, 409, "Conflict", "the object has been modified; please apply "
                                "your changes to the latest version and try again")
        updated = dict(current, status=body.get("status"))  # status only: spec and metadata stay
        self.status_updates.append(copy.deepcopy(body.get("status")))
        self._send(h, 200, self.put(base, updated))

    def _update(self, h: BaseHTTPRequestHandler, base: str, name: str, body: dict) -> None:
        with self._lock:
            current = self.objects[base].get(name)
        if current is None:
            return self._status(h, 404, "NotFound", f"{name} not found")
        sent = (body.get("metadata") or {}).get("resourceVersion")
        if sent != current["metadata"]["resourceVersion"]:
            return self._status(h, 409, "Conflict", "the object has been modified")
        self._send(h, 200, self.put(base, body))

    def _namespaced_post(self, h: BaseHTTPRequestHandler, path: str, body: dict) -> bool:
        """An eviction or an Event; False for any other path."""
        parts = path.strip("/").split("/")  # api v1 namespaces <ns> (events | pods <name> eviction)
        if parts[:3] != ["api", "v1", "namespaces"] or len(parts) not in (5, 7):
            return False
        if len(parts) == 5 and parts[4] == "events":
            self.requests.append(("create", path))
            self.events.append(body)
            self._send(h, 201, body)
            return True
        if len(parts) == 7 and parts[4] == "pods" and parts[6] == "eviction":
            self.requests.append(("create", path))
            self.evictions.append(body)
            if self.eviction_status == 429:
                self._status(h, 429, "TooManyRequests",
                             "Cannot evict pod as it would violate the pod's disruption budget.")
            else:
                self._send(h, self.eviction_status, {"kind": "Status", "apiVersion": "v1",
                                                     "status": "Success", "code": self.eviction_status})
            return True
        return False

    def _post(self, h: BaseHTTPRequestHandler) -> None:
        """Create: NodeResourceTopology (koordlet creates its node's), pod evictions, Events."""
        url = urlparse(h.path)
        base, name, _ = self._split(url.path)
        length = int(h.headers.get("Content-Length", "0"))
        body = json.loads(h.rfile.read(length) or b"{}")
        if self._namespaced_post(h, url.path, body):
            return None
        if not self._served(h, "create", base):
            return None
        if not base.endswith("noderesourcetopologies") or name is not None:
            return self._status(h, 405, "MethodNotAllowed", "only noderesourcetopologies can be created")
        new = (body.get("metadata") or {}).get("name")
        with self._lock:
            exists = new in self.objects[base]
        if not isinstance(new, str) or exists:
            return self._status(h, 409, "AlreadyExists", f"{new} already exists")
        self._send(h, 201, self.put(base, body))


NODES, NODESLOS, NODEMETRICS, NODERESOURCETOPOLOGIES = _PATHS

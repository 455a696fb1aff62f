"""Pods of this node from kubelet's ``/pods`` endpoint, upstream's source (``--pods-source=kubelet``).

The address is the Node's address of ``--kubelet-preferred-address-type``; with
``--kubelet-insecure-tls`` the read-only port over plain HTTP, otherwise HTTPS on the
Node's ``status.daemonEndpoints.kubeletEndpoint.Port`` with the API client's token (the service
account's in a cluster) and kubelet's certificate not verified (as upstream). The answer is bounded in size and each
pod is converted on its own: one malformed pod is skipped with a log line naming it.
"""

from __future__ import annotations

import functools
import logging
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from koord.hookapi import json_document, parse_quantity

from ..cgrouplayout import CgroupLayout, container_cgroup_dir
from ..resources import KoordQoS
from ..rfc3339 import parse_time
from .meta import ContainerMeta, PodMeta
from .pods import PodsUnavailable

log = logging.getLogger(__name__)

MAX_PODS_BYTES = 64 * 1024 * 1024
"""110 pods with large specs are a few MiB; more is not a pod list."""
TOKEN_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
_QOS = {"Guaranteed": "guaranteed", "Burstable": "burstable", "BestEffort": "besteffort"}


def _object(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: want an object, got {type(value).__name__}")
    return value


def _strings(value: Any, where: str) -> dict[str, str]:
    obj = _object(value, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise ValueError(f"{where}: want string keys and values")
    return dict(obj)


def resource_values(value: Any, where: str) -> dict[str, int]:
    """A ResourceList as ``ContainerMeta`` keeps it: cpu milli-cores, the rest as integers
    (``kubernetes.io/batch-cpu`` is already counted in milli-cores)."""
    return {str(name): (_resource_value(name, quantity)
                        if type(quantity) in (str, int) and len(name) <= MAX_CACHED_NAME
                        else _to_int(name, parse_quantity(quantity)))
            for name, quantity in _object(value, where).items()}


MAX_CACHED_NAME = 317
"""Kubernetes' longest resource name (a 253-character prefix, "/", 63 characters): a longer
key is converted but not cached, so the cache never holds more than a few hundred KiB."""


@functools.lru_cache(maxsize=1024)
def _resource_value(name: str, quantity: str | int) -> int:
    """Cached (a string or a JSON integer, never a bool, which would share 1's entry): every
    pod list repeats the same few (resource, quantity) pairs for every pod, and a pod list
    is read again at every change. Errors are not cached."""
    return _to_int(name, parse_quantity(quantity))


def _to_int(name: str, number: Fraction) -> int:
    return int(number * 1000 if name == "cpu" else number)


def _kube_qos(pod: dict, containers: list[dict]) -> str:
    qos = _QOS.get((pod.get("status") or {}).get("qosClass", ""))
    if qos:
        return qos
    requests = [c.get("resources", {}).get("requests") or {} for c in containers]
    limits = [c.get("resources", {}).get("limits") or {} for c in containers]
    if not any(requests) and not any(limits):
        return "besteffort"
    if all(lim.get(r) is not None and (req.get(r, lim.get(r)) == lim.get(r))
           for req, lim in zip(requests, limits, strict=True) for r in ("cpu", "memory")):
        return "guaranteed"
    return "burstable"


def pod_meta_of(pod: Any, layout: CgroupLayout, driver: str) -> PodMeta:
    """One Pod (API JSON) as ``PodMeta``; ValueError naming the field when it is malformed."""
    pod = _object(pod, "pod")
    meta = _object(pod.get("metadata"), "metadata")
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    if not all(isinstance(v, str) and v for v in (name, namespace, uid)):
        raise ValueError("metadata: want name, namespace and uid strings")
    assert isinstance(name, str) and isinstance(namespace, str) and isinstance(uid, str)
    spec = _object(pod.get("spec"), "spec")
    containers = spec.get("containers") or []
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        raise ValueError("spec.containers: want a list of objects")
    priority = spec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ValueError(f"spec.priority: want an integer, got {priority!r:.40}")
    labels = _strings(meta.get("labels"), "metadata.labels")
    stamp = meta.get("creationTimestamp")
    created = None if stamp is None else parse_time(stamp, "metadata.creationTimestamp")
    status = _object(pod.get("status"), "status")
    kube_qos = _kube_qos(pod, containers)
    cgroup_dir = layout.pod_dir(kube_qos, uid, driver)
    statuses = {s.get("name"): s for s in status.get("containerStatuses") or [] if isinstance(s, dict)}
    metas = []
    for i, c in enumerate(containers):
        cname = c.get("name")
        if not isinstance(cname, str):
            raise ValueError(f"spec.containers[{i}].name: want a string")
        resources = _object(c.get("resources"), f"spec.containers[{i}].resources")
        cstatus = statuses.get(cname) or {}
        cid = str(cstatus.get("containerID") or "").partition("://")[2]
        metas.append(ContainerMeta(
            name=cname, id=cid,
            cgroup_dir=container_cgroup_dir(cgroup_dir, cid, driver) if cid else "",
            running="running" in (cstatus.get("state") or {}),
            requests=resource_values(resources.get("requests"), f"container {cname} requests"),
            limits=resource_values(resources.get("limits"), f"container {cname} limits")))
    return PodMeta(namespace=namespace, name=name, uid=uid, labels=labels,
                   annotations=_strings(meta.get("annotations"), "metadata.annotations"),
                   kube_qos=kube_qos, koord_qos=KoordQoS.of(labels), priority=priority,
                   cgroup_dir=cgroup_dir, sandbox_id="", running=status.get("phase") == "Running",
                   containers=tuple(metas), created=created)


def pods_of_list(data: bytes, layout: CgroupLayout, driver: str) -> list[PodMeta]:
    items = json_document(data, "kubelet /pods", PodsUnavailable).get("items")
    if not isinstance(items, list):
        raise PodsUnavailable("kubelet /pods: not a PodList (no items list)")
    pods = []
    for i, item in enumerate(items):
        try:
            pods.append(pod_meta_of(item, layout, driver))
        except (ValueError, TypeError, AttributeError) as exc:
            who = ((item.get("metadata") or {}) if isinstance(item, dict) else {})
            log.warning("states informer: kubelet pod %s/%s (item %d) skipped: %s",
                        who.get("namespace", "?"), who.get("name", "?"), i, exc)
    return sorted(pods, key=lambda p: (p.namespace, p.name, p.uid))


KubeletObserver = Callable[[str, str, int, float], None]
"""Told of every kubelet answer, whatever its status: (verb, path, HTTP code, seconds to the headers)."""


class KubeletPodsSource:
    def __init__(self, get_node: Callable[[], dict | None], layout: CgroupLayout, *,
                 address_type: str = "InternalIP", insecure_tls: bool = False,
                 read_only_port: int = 10255, timeout: float = 3.0,
                 token_file: Path = TOKEN_FILE, token: Callable[[], str | None] | None = None,
                 observe: KubeletObserver | None = None) -> None:
        self.get_node = get_node
        self.observe = observe
        self.layout = layout
        # kubelet's /pods names no cgroup parent: the driver of the tree kubelet made at start.
        self.driver = layout.driver_for()
        self.address_type = address_type
        self.insecure_tls = insecure_tls
        self.read_only_port = read_only_port
        self.timeout = timeout
        self.token_file = token_file
        self.token = token
        self._last: tuple[bytes, tuple[PodMeta, ...]] | None = None
        """The last answer that made a pod list, and that list: the same bytes are not parsed again."""

    def describe(self) -> str:
        return "kubelet /pods"

    def close(self) -> None:
        pass

    def url(self, path: str = "/pods/") -> str:
        node = self.get_node()
        if node is None:
            raise PodsUnavailable(f"kubelet {path}: the Node object is not known yet")
        status = node.get("status") or {}
        addresses = [a.get("address") for a in status.get("addresses") or []
                     if isinstance(a, dict) and a.get("type") == self.address_type]
        if not addresses or not isinstance(addresses[0], str):
            raise PodsUnavailable(f"kubelet {path}: the Node has no {self.address_type} address")
        host = f"[{addresses[0]}]" if ":" in addresses[0] else addresses[0]
        if self.insecure_tls:
            return f"http://{host}:{self.read_only_port}{path}"
        port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise PodsUnavailable(f"kubelet {path}: the Node has no daemonEndpoints.kubeletEndpoint.Port")
        return f"https://{host}:{port}{path}"

    def _bearer_token(self) -> str:
        """The API client's token when there is one (a kubeconfig), else the service account's."""
        token = self.token() if self.token is not None else None
        if token:
            return token
        try:
            return self.token_file.read_text().strip()
        except OSError as exc:
            raise PodsUnavailable(f"kubelet /pods: service-account token: {exc}") from None

    def fetch(self, path: str, limit: int = MAX_PODS_BYTES) -> bytes:
        """GET ``path`` of the kubelet (``/pods/``, ``/configz``), bounded; PodsUnavailable on failure."""
        url = self.url(path)
        request = urllib.request.Request(url)
        context = None
        if url.startswith("https:"):
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # kubelet's serving cert is self-signed, as upstream
            request.add_header("Authorization", "Bearer " + self._bearer_token())
        start = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as r:
                self._observe(path, r.status, start)
                data = r.read(limit + 1)
        except urllib.error.HTTPError as exc:  # an answer all the same
            self._observe(path, exc.code, start)
            raise PodsUnavailable(f"kubelet {url}: {exc}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PodsUnavailable(f"kubelet {url}: {exc}") from None
        if len(data) > limit:
            raise PodsUnavailable(f"kubelet {url}: answer larger than {limit} bytes")
        return data

    def _observe(self, path: str, code: int, start: float) -> None:
        if self.observe is not None:
            self.observe("get", path, code, time.monotonic() - start)

    def list_pods(self) -> tuple[PodMeta, ...]:
        data = self.fetch("/pods/")
        if self._last is not None and self._last[0] == data:
            return self._last[1]
        pods = tuple(pods_of_list(data, self.layout, self.driver))
        if not pods:  # upstream: an empty list keeps the old one (kubelet restarting)
            raise PodsUnavailable(f"kubelet {self.url()}: empty pod list")
        self._last = (data, pods)
        return pods

"""The States Informer: koordlet's one view of this node, its API objects and its pods.

Other modules never talk to the API server, files or CRI themselves: they read copies of
the objects and the pods (immutable, the same objects for every reader) from here and
register callbacks (``"node"``, ``"node_slo"``, ``"node_metric"``, ``"pods"``) run after a
change, on the informer's threads. A missing object (no NodeSLO) never blocks anything:
getters return None and modules use their defaults.

An object kind may come with a check (``checks``): a version the check refuses is not
taken. It is logged once, in one line naming the object and the problem, and readers go on
with the last good version (none before the first one): they never see, and never each
complain about, a version they could not use.

A NodeSLO version is merged over upstream's defaults and parsed into its typed sections
(``slo.NodeSLO``) once, when it is taken; readers share that frozen value, so a strategy
ticking every second or a hook answering every request costs no merge and no check.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ...logonce import LogOnce
from ..slo import NodeSLO, parse_node_slo
from .meta import PodMeta
from .objects import KIND_NAMES, NODE, NODE_METRIC, NODE_SLO, FileObjectsSource, KubeObjectsSource, Sink
from .pods import PodsUnavailable
from .specs import merged_node_slo, node_metric_collect_policy

log = logging.getLogger(__name__)

PODS = "pods"
NODE_TOPOLOGY = "node_topology"
CALLBACK_KINDS = (NODE, NODE_SLO, NODE_METRIC, PODS, NODE_TOPOLOGY)
DEFAULT_PODS_SYNC_SECONDS = 10.0

Check = Callable[[dict], None]
"""Raises ValueError naming the problem when an object's version cannot be used."""


class ObjectsSource(Protocol):
    def describe(self) -> str: ...
    def kinds(self) -> set[str]: ...
    def start(self, sink: Sink) -> None: ...
    def stop(self) -> None: ...


class PodsSource(Protocol):
    def describe(self) -> str: ...
    def list_pods(self) -> Sequence[PodMeta]: ...
    def close(self) -> None: ...


class StatesInformer:
    def __init__(self, objects: ObjectsSource | None = None, pods: PodsSource | None = None,
                 pods_interval: float = DEFAULT_PODS_SYNC_SECONDS,
                 checks: Mapping[str, Check] | None = None) -> None:
        self.objects = objects
        self.checks = dict(checks or {})
        self._refused = LogOnce(log)
        """The problem last logged per kind, so a source that delivers the same refused
        version again (a relist) does not log it again."""
        self.pods_source = pods
        self.pods_interval = pods_interval
        self._lock = threading.Lock()
        self._objects: dict[str, dict | None] = {NODE: None, NODE_SLO: None, NODE_METRIC: None,
                                                 NODE_TOPOLOGY: None}
        self._seen: set[str] = set()
        self._node_slo: NodeSLO | None = None
        self._pods: tuple[PodMeta, ...] = ()
        self._pods_synced = False
        self._pods_error: str | None = None
        self._callbacks: dict[str, list[Callable[[], None]]] = {k: [] for k in CALLBACK_KINDS}
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._pods_thread: threading.Thread | None = None

    # ---- reading -----------------------------------------------------------------------

    def get_node(self) -> dict | None:
        with self._lock:
            return copy.deepcopy(self._objects[NODE])

    def get_node_slo(self) -> NodeSLO | None:
        """The NodeSLO's typed sections, parsed when its version was taken (None before one)."""
        with self._lock:
            return self._node_slo

    def get_node_slo_object(self) -> dict | None:
        """The NodeSLO as the source delivered it, for showing what was taken; modules read
        ``get_node_slo``."""
        with self._lock:
            return copy.deepcopy(self._objects[NODE_SLO])

    def get_node_metric(self) -> dict | None:
        with self._lock:
            return copy.deepcopy(self._objects[NODE_METRIC])

    def get_node_metric_spec(self) -> dict[str, Any]:
        """The collect policy merged over defaults; defaults when the spec is unusable."""
        node_metric = self.get_node_metric()
        try:
            return node_metric_collect_policy(node_metric)
        except ValueError as exc:
            log.warning("NodeMetric %s: %s; using the default collect policy",
                        ((node_metric or {}).get("metadata") or {}).get("name", ""), exc)
            return node_metric_collect_policy(None)

    def get_node_topo(self) -> dict | None:
        """This node's NodeResourceTopology as last computed (None before the first round)."""
        with self._lock:
            return copy.deepcopy(self._objects[NODE_TOPOLOGY])

    def set_node_topo(self, obj: dict) -> None:
        """Keeps the computed topology and calls back when what it holds changed."""
        with self._lock:
            if self._objects[NODE_TOPOLOGY] == obj:
                return
            self._objects[NODE_TOPOLOGY] = copy.deepcopy(obj)
        self._notify(NODE_TOPOLOGY)

    def get_all_pods(self) -> list[PodMeta]:
        """The pods of the last sync: a new list (the caller's to sort or filter) of the same
        immutable PodMeta objects every reader gets, so nothing but the list is copied."""
        with self._lock:
            return list(self._pods)

    def has_synced(self) -> bool:
        """Every configured source answered once (a missing object counts as an answer)."""
        with self._lock:
            objects_ok = self.objects is None or self.objects.kinds() <= self._seen
            return objects_ok and (self.pods_source is None or self._pods_synced)

    def api_source(self) -> KubeObjectsSource | None:
        """The API server the objects come from (its client, node name, reachability and
        credentials), for the modules that write there or reach the kubelet; None when the
        objects come from files or nowhere."""
        return self.objects if isinstance(self.objects, KubeObjectsSource) else None

    def api_client(self) -> Any | None:
        """The API server's client (``api_source``'s), None without a server."""
        source = self.api_source()
        return None if source is None else source.api

    def expect_own_write(self, kind: str, raw: bytes) -> None:
        """koordlet is about to write ``raw`` to the file ``kind`` is read from: that write
        is not a change to read back. Nothing to do when ``kind`` comes from elsewhere."""
        if isinstance(self.objects, FileObjectsSource) and kind in self.objects.kinds():
            self.objects.expect(kind, raw)

    def register_callback(self, kind: str, fn: Callable[[], None]) -> None:
        if kind not in self._callbacks:
            raise ValueError(f"callback kind {kind!r}: want one of {', '.join(CALLBACK_KINDS)}")
        self._callbacks[kind].append(fn)

    # ---- feeding -----------------------------------------------------------------------

    def set_object(self, kind: str, obj: dict | None) -> None:
        """Sink for the objects source: stores and calls back when the content changed; a
        version its kind's check (or, for a NodeSLO, its parse) refuses is logged (once) and
        not stored. The same content again (a relist) is neither checked nor parsed again."""
        with self._lock:
            self._seen.add(kind)  # answered: nothing waits for a good version
            if self._objects.get(kind) == obj:
                self._refused.clear(kind)
                return
        node_slo = None
        if obj is not None:
            try:
                node_slo = self._parse(kind, obj)
            except ValueError as exc:
                self._refuse(kind, obj, str(exc))
                return
        self._refused.clear(kind)
        with self._lock:
            self._objects[kind] = copy.deepcopy(obj)
            if kind == NODE_SLO:
                self._node_slo = node_slo
        self._notify(kind)

    def _parse(self, kind: str, obj: dict) -> NodeSLO | None:
        """Runs ``kind``'s check and, for a NodeSLO, returns its typed sections; ValueError
        naming the problem when the version cannot be used."""
        check = self.checks.get(kind)
        if check is not None:
            check(obj)
        return parse_node_slo(merged_node_slo(obj)) if kind == NODE_SLO else None

    def _refuse(self, kind: str, obj: dict, problem: str) -> None:
        name = (obj.get("metadata") or {}).get("name", "") if isinstance(obj.get("metadata"), dict) else ""
        with self._lock:
            kept = "the last good version" if self._objects.get(kind) is not None else "none (defaults)"
        self._refused.say(kind, f"states informer: {KIND_NAMES.get(kind, kind)} {name or '(no name)'} "
                          f"refused: {problem}; keeping {kept}", level=logging.ERROR)

    def sync_pods(self) -> bool:
        """Lists pods once; on error the previous list stays. True when the list changed."""
        if self.pods_source is None:
            return False
        try:
            pods = tuple(self.pods_source.list_pods())
        except PodsUnavailable as exc:
            if str(exc) != self._pods_error:
                log.warning("states informer: cannot list pods: %s; keeping the last list "
                            "(%d pods), retrying every %.3gs", exc, len(self._pods), self.pods_interval)
                self._pods_error = str(exc)
            return False
        if self._pods_error is not None:
            log.info("states informer: pods from %s again", self.pods_source.describe())
            self._pods_error = None
        with self._lock:
            changed = pods != self._pods
            if changed:
                self._pods = pods
            first = not self._pods_synced
            self._pods_synced = True
        if first:
            log.info("states informer: %d pods from %s", len(pods), self.pods_source.describe())
        if changed:
            self._notify(PODS)
        return changed

    def _notify(self, kind: str) -> None:
        for fn in list(self._callbacks[kind]):
            try:
                fn()
            except Exception:  # a failing consumer must not stop the informer
                log.exception("states informer: %s callback %s failed", kind,
                              getattr(fn, "__qualname__", fn))

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self.objects is not None:
            log.info("states informer: objects from %s", self.objects.describe())
            self.objects.start(self.set_object)
        if self.pods_source is not None:
            self.sync_pods()
            self._pods_thread = threading.Thread(target=self._run_pods, name="states-pods",
                                                 daemon=True)
            self._pods_thread.start()

    def resync_pods(self) -> None:
        """Asks for a pod sync now (a new pod was seen elsewhere)."""
        self._wake.set()

    def _run_pods(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.pods_interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.sync_pods()
            except Exception:
                log.exception("states informer: pod sync failed")

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._pods_thread is not None:
            self._pods_thread.join()
            self._pods_thread = None
        if self.objects is not None:
            self.objects.stop()
        if self.pods_source is not None:
            self.pods_source.close()

"""Sources of this node's API objects: Node, NodeSLO and NodeMetric.

Two sources feed the states informer through one sink ``sink(kind, obj)``; objects are
plain dicts in the API's JSON shape (camelCase keys), ``None`` when the object does not
exist (deleted in the API server):

- ``FileObjectsSource``: ``--node-file``, ``--node-slo-file``, ``--node-metric-file``
  (YAML or JSON), re-read when their directory changes (``koord.filewatch``) and every
  second; a missing or bad file keeps the last good object.
- ``KubeObjectsSource``: list-watch of each kind with the field selector
  ``metadata.name=<node>``, relisting after an error or an expired watch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from koord import documents
from koord.filewatch import DirWatcher
from koord.logonce import LogOnce

from .reachability import Reachability

log = logging.getLogger(__name__)

NODE, NODE_SLO, NODE_METRIC = "node", "node_slo", "node_metric"
KIND_NAMES = {NODE: "Node", NODE_SLO: "NodeSLO", NODE_METRIC: "NodeMetric"}

Sink = Callable[[str, "dict | None"], None]

SETTLE_SECONDS = 0.5
"""Editors and ``kubectl cp`` write a file in several steps; wait for the burst to end. Also
how often the watcher looks for events (each look wakes a thread and takes the GIL): a
NodeSLO edit is applied 0.5 to 1 s after it."""

POLL_SECONDS = 1.0
"""Re-read anyway this often: catches a directory that appears late or is replaced."""

SLO_GROUP, SLO_VERSION = "slo.koordinator.sh", "v1alpha1"
NODESLO_PLURAL, NODEMETRIC_PLURAL = "nodeslos", "nodemetrics"



def load_object_file(path: Path, kind: str) -> dict:
    """One object from a YAML/JSON file; ValueError naming the file and what is wrong."""
    try:
        with open(path, "rb") as f:
            raw = f.read(documents.MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{kind} file {path}: cannot read: {exc.strerror or exc}") from None
    return parse_object(raw, path, kind)


def parse_object(raw: bytes, path: Path | str, kind: str) -> dict:
    """One object from a file's bytes, bounded (koord.documents); ValueError naming the file."""
    try:
        return documents.load_object(raw)
    except documents.DocumentError as exc:
        raise ValueError(f"{kind} file {path}: {exc}") from None


class _WatchedFile:
    """One object file: the last bytes read (so an unchanged bad file logs once)."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path = path
        self.kind = kind
        self._last_raw: bytes | None | object = object()
        self._own: bytes | None = None

    def expect(self, raw: bytes) -> None:
        """koordlet itself is about to write ``raw`` here (the NodeMetric status): reading it
        back would tell nothing new, so that content is skipped like an unchanged file."""
        self._own = raw

    def load(self) -> dict | None:
        """The object when the file changed and parses; None otherwise (error logged once)."""
        try:
            with open(self.path, "rb") as f:
                raw: bytes | None = f.read(documents.MAX_BYTES + 1)
        except FileNotFoundError:
            raw = None
        except OSError as exc:
            log.error("%s file %s: cannot read: %s; keeping the last good value",
                      self.kind, self.path, exc)
            return None
        if raw == self._last_raw or (raw is not None and raw == self._own):
            self._last_raw = raw
            return None
        self._last_raw = raw
        if raw is None:
            log.error("%s file %s: not found; keeping the last good value", self.kind, self.path)
            return None
        try:
            obj = parse_object(raw, self.path, self.kind)
        except ValueError as exc:
            log.error("%s; keeping the last good value", exc)
            return None
        log.info("%s file %s loaded", self.kind, self.path)
        return obj


class FileObjectsSource:
    """Reads objects from files and re-reads them when their directory changes.

    Whole directories are watched, not the files, because atomic replaces (rename)
    and ConfigMap volumes (a ``..data`` symlink swap) never modify the file itself.
    """

    def __init__(self, files: dict[str, Path]) -> None:
        self._files = {kind: _WatchedFile(Path(path), KIND_NAMES[kind])
                       for kind, path in files.items()}
        self._sink: Sink | None = None
        self._answered: set[str] = set()
        self._watcher: DirWatcher | None = None

    def describe(self) -> str:
        return "files " + ", ".join(f"{f.kind}={f.path}" for f in self._files.values())

    def kinds(self) -> set[str]:
        return set(self._files)

    def expect(self, kind: str, raw: bytes) -> None:
        """The next content of ``kind``'s file is koordlet's own write; see _WatchedFile.expect."""
        self._files[kind].expect(raw)

    def reload(self) -> None:
        """Reads every file now; used at start and after each burst of events.

        A file missing or bad at the first read is delivered once as None ("no object"),
        so the informer counts as synced without it; later it only ever keeps the last
        good object.
        """
        for kind, f in self._files.items():
            obj = f.load()
            if self._sink is None or (obj is None and kind in self._answered):
                continue
            self._answered.add(kind)
            self._sink(kind, obj)

    def bind(self, sink: Sink) -> None:
        """Where ``reload`` delivers objects (``start`` binds too)."""
        self._sink = sink

    def start(self, sink: Sink) -> None:
        self.bind(sink)
        self.reload()
        dirs = {f.path.parent.resolve() for f in self._files.values()}
        for d in sorted(dirs - {d for d in dirs if d.is_dir()}):
            log.error("states informer: directory %s does not exist; its files are read once it does", d)
        self._watcher = DirWatcher(dirs, self.reload, name="states-informer", debounce=SETTLE_SECONDS,
                                   poll_interval=POLL_SECONDS)
        self._watcher.start()

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None


WATCH_SECONDS = 300
"""Server-side watch timeout: the watch ends and is resumed from its resourceVersion."""
RETRY_SECONDS = 5.0
NOT_SERVED_RETRY_SECONDS = 60.0
"""A kind the API server answers 404 for (its CRD is not installed) is asked for again this
often: slow, since installing a CRD is rare, but without a restart."""


def api_status(exc: BaseException) -> int | None:
    """The HTTP status of a kubernetes client error, None for anything else."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


class KubeObjectsSource:
    """List-watch of this node's Node, NodeSLO and NodeMetric (one thread per kind)."""

    def __init__(self, api_client: Any, node_name: str,
                 kinds: tuple[str, ...] = (NODE, NODE_SLO, NODE_METRIC)) -> None:
        from kubernetes import client

        self.api = api_client
        self.node_name = node_name
        self._kinds = kinds
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sink: Sink | None = None
        # Shared with the NodeMetric writer: one line when the server goes, one when back.
        self.reachability = Reachability(api_client.configuration.host)

    def describe(self) -> str:
        return f"API server {self.api.configuration.host} (node {self.node_name})"

    def kinds(self) -> set[str]:
        return set(self._kinds)

    def bearer_token(self) -> Callable[[], str | None]:
        """The API client's credentials, read at each call (in-cluster tokens rotate): upstream
        reaches the kubelet with the same REST config as the API server."""
        def token() -> str | None:
            header = (self.api.configuration.auth_settings().get("BearerToken") or {}).get("value")
            return header.removeprefix("Bearer ").strip() if isinstance(header, str) else None
        return token

    def _lister(self, kind: str) -> Callable[..., Any]:
        if kind == NODE:
            return self._core.list_node
        plural = NODESLO_PLURAL if kind == NODE_SLO else NODEMETRIC_PLURAL

        def list_custom(**kwargs: Any) -> Any:
            return self._custom.list_cluster_custom_object(SLO_GROUP, SLO_VERSION, plural, **kwargs)
        return list_custom

    def start(self, sink: Sink) -> None:
        self._sink = sink
        for kind in self._kinds:
            t = threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """A watch blocked in a read ends at its next event or timeout; its daemon thread
        is not waited for longer than a second in all."""
        self._stopping.set()
        deadline = time.monotonic() + 1.0
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads.clear()

    def _as_dict(self, obj: Any) -> dict:
        return obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)

    def _emit(self, kind: str, obj: dict | None) -> None:
        """Delivers unless stopping: a watch thread still blocked in a read at stop() must not
        call back into modules that already stopped."""
        if self._sink is not None and not self._stopping.is_set():
            self._sink(kind, obj)

    def _run(self, kind: str) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        lister = self._lister(kind)
        selector = f"metadata.name={self.node_name}"
        name = KIND_NAMES[kind]
        said = LogOnce(log)
        while not self._stopping.is_set():
            started = self.reachability.now()
            try:
                listed = self._as_dict(lister(field_selector=selector, _request_timeout=30))
                self.reachability.answered()
                said.clear("error")
                if said.clear("not-served"):
                    log.info("states informer: the API server serves %s now", name)
                items = listed.get("items") or []
                self._emit(kind, self._as_dict(items[0]) if items else None)
                version = (listed.get("metadata") or {}).get("resourceVersion")
                w = watch.Watch()
                for event in w.stream(lister, field_selector=selector, resource_version=version,
                                      timeout_seconds=WATCH_SECONDS,
                                      _request_timeout=WATCH_SECONDS + 30):
                    if self._stopping.is_set():
                        w.stop()
                        return
                    etype = event.get("type")
                    if etype == "ERROR":  # e.g. 410 Gone: relist
                        break
                    obj = self._as_dict(event.get("raw_object") or event.get("object"))
                    self._emit(kind, None if etype == "DELETED" else obj)
            except Exception as exc:  # API errors, broken connections, bad objects
                if api_status(exc) == 404:  # the kind is not served: its CRD is not installed
                    self.reachability.answered()
                    said.say("not-served", "states informer: the API server does not serve %s (CRD not "
                             "installed?): treated as absent, defaults used; asking again every %.0fs",
                             name, NOT_SERVED_RETRY_SECONDS)
                    self._emit(kind, None)
                    self._stopping.wait(NOT_SERVED_RETRY_SECONDS)
                    continue
                if _unreachable(exc):
                    self.reachability.failed(f"list-watch {name} {self.node_name}", exc, started)
                else:
                    if isinstance(exc, ApiException):
                        self.reachability.answered()
                    said.say("error", f"states informer: list-watch {name} {self.node_name}: "
                             f"{exc}; retrying every {RETRY_SECONDS:.0f}s")
                self._stopping.wait(RETRY_SECONDS)


def _unreachable(exc: BaseException) -> bool:
    """A connection-level failure (refused, reset, timed out), not an HTTP answer."""
    import urllib3

    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))

"""States Informer: keeps koordlet's view of this node's NodeSLO and Node objects.

Two sources: files (``--node-slo-file``, ``--node-file``; YAML or JSON, watched) and,
in a cluster without those flags, the Kubernetes API. Either way the informer calls
``on_change(node_slo, node)`` when an object's content changes; objects are plain dicts
in the API's JSON shape (camelCase keys), ``None`` when unknown.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from koord import documents
from koord.filewatch import DirWatcher

log = logging.getLogger(__name__)

OnChange = Callable[[dict | None, dict | None], None]

SETTLE_SECONDS = 0.1
"""Editors and ``kubectl cp`` write a file in several steps; wait for the burst to end."""

POLL_SECONDS = 1.0
"""Re-read anyway this often: catches a directory that appears late or is replaced."""


class StatesInformer:
    """Holds the current objects and reports changes; subclasses feed it."""

    def __init__(self, on_change: OnChange) -> None:
        self.on_change = on_change
        self._lock = threading.Lock()
        self._node_slo: dict | None = None
        self._node: dict | None = None

    @property
    def node_slo(self) -> dict | None:
        return self._node_slo

    @property
    def node(self) -> dict | None:
        return self._node

    def _update(self, *, node_slo: dict | None = None, node: dict | None = None) -> None:
        """Sets the objects given (None = keep) and calls back if anything changed."""
        with self._lock:
            changed = False
            if node_slo is not None and node_slo != self._node_slo:
                self._node_slo, changed = node_slo, True
            if node is not None and node != self._node:
                self._node, changed = node, True
            current = (self._node_slo, self._node)
        if changed:
            try:
                self.on_change(*current)
            except Exception:  # a failing consumer must not stop the informer
                log.exception("states informer: change callback failed")

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class _WatchedFile:
    """One object file: the last bytes read (so an unchanged bad file logs once)."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path = path
        self.kind = kind
        self._last_raw: bytes | None | object = object()

    def load(self) -> dict | None:
        """The object when the file changed and parses; None otherwise (error logged once)."""
        try:
            with self.path.open("rb") as f:
                raw: bytes | None = f.read(documents.MAX_BYTES + 1)  # enough to say "too large"
        except FileNotFoundError:
            raw = None
        except OSError as exc:
            log.error("%s file %s: cannot read: %s; keeping the last good value",
                      self.kind, self.path, exc)
            return None
        if raw == self._last_raw:
            return None
        self._last_raw = raw
        if raw is None:
            log.error("%s file %s: not found; keeping the last good value", self.kind, self.path)
            return None
        try:
            obj = documents.load_object(raw)
        except documents.DocumentError as exc:
            log.error("%s file %s: %s; keeping the last good value", self.kind, self.path, exc)
            return None
        log.info("%s file %s loaded", self.kind, self.path)
        return obj


class FileStatesInformer(StatesInformer):
    """Reads NodeSLO and Node from files and re-reads them when their directory changes.

    Whole directories are watched, not the files, because atomic replaces (rename)
    and ConfigMap volumes (a ``..data`` symlink swap) never modify the file itself.
    """

    def __init__(self, on_change: OnChange, *, node_slo_file: Path | None = None,
                 node_file: Path | None = None) -> None:
        super().__init__(on_change)
        self._files: dict[str, _WatchedFile] = {}
        if node_slo_file is not None:
            self._files["node_slo"] = _WatchedFile(Path(node_slo_file), "NodeSLO")
        if node_file is not None:
            self._files["node"] = _WatchedFile(Path(node_file), "Node")
        self._watcher: DirWatcher | None = None

    def reload(self) -> None:
        """Reads every file now; used at start and after each burst of events."""
        loaded = {key: f.load() for key, f in self._files.items()}
        self._update(**loaded)

    def start(self) -> None:
        self.reload()
        dirs = {f.path.parent.resolve() for f in self._files.values()}
        for d in dirs - {d for d in dirs if d.is_dir()}:
            log.error("states informer: directory %s does not exist; its files are read once it does", d)
        self._watcher = DirWatcher(dirs, self.reload, name="states-informer", debounce=SETTLE_SECONDS,
                                   poll_interval=POLL_SECONDS)
        self._watcher.start()

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None


NODESLO_GROUP, NODESLO_VERSION, NODESLO_PLURAL = "slo.koordinator.sh", "v1alpha1", "nodeslos"


class KubeStatesInformer(StatesInformer):
    """Polls this node's Node and NodeSLO from the API server (in-cluster config).

    Polling every ``interval`` keeps this small; rule changes are rare and the
    reconciler refreshes pods on its own interval anyway.
    """

    def __init__(self, on_change: OnChange, *, node_name: str, interval: float = 30.0) -> None:
        super().__init__(on_change)
        self.node_name = node_name
        self.interval = interval
        self._stopping = threading.Event()
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        from kubernetes import client, config

        config.load_incluster_config()
        self._api = client.ApiClient()
        self._core = client.CoreV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self.poll()
        self._worker = threading.Thread(target=self._run, name="states-informer", daemon=True)
        self._worker.start()

    def poll(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            node = self._api.sanitize_for_serialization(self._core.read_node(self.node_name))
        except ApiException as exc:
            log.error("states informer: reading Node %s: %s", self.node_name, exc.reason)
            node = None
        try:
            node_slo = self._custom.get_cluster_custom_object(
                NODESLO_GROUP, NODESLO_VERSION, NODESLO_PLURAL, self.node_name)
        except ApiException as exc:
            if exc.status != 404:
                log.error("states informer: reading NodeSLO %s: %s", self.node_name, exc.reason)
            node_slo = None
        self._update(node_slo=node_slo, node=node)

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.poll()
            except Exception:  # e.g. the API server unreachable: poll again next interval
                log.exception("states informer: polling Node/NodeSLO %s failed; keeping the last values",
                              self.node_name)

    def stop(self) -> None:
        self._stopping.set()
        if self._worker is not None:
            self._worker.join()
            self._worker = None


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))

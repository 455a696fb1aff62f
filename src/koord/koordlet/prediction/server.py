"""The predict server: trains one model per pod, per priority class, for the node and for the
system part, keeps them across restarts in checkpoint files, and answers percentiles.

Training, every ``training_interval``: each model takes the P90 of the metric cache's
samples over the last interval (a pod without samples is skipped) and adds it to its CPU
and memory histograms. A priority class model takes the sum of its pods (0 when it has
none), ``__node-sys__`` takes max(node usage - all pods, 0).

Every ``min(1 minute, checkpoint interval)`` up to ``checkpoint_max_per_step`` models
whose last checkpoint is older than ``checkpoint_interval`` are saved, oldest first, one
JSON file per model named by its id (written to ``<id>.tmp`` and renamed, so a crash
leaves the old file or the new one). At start, once the states informer has synced, the
files are restored; files of models that are not known (pods gone while koordlet was
down) and unreadable ones are removed. Models not trained for ``model_expiration`` are
dropped with their file.

Nothing here knows about cold starts or safety margins: predictors decide how to use a
prediction (``predictor.py``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..metriccache import NODE_CPU_USAGE, NODE_MEMORY_USAGE, POD_CPU_USAGE, POD_MEMORY_USAGE, POD_UID
from ..metriccache.aggregate import Aggregation
from ..statesinformer.meta import PodMeta
from ..statesinformer.nodemetric import priority_class_with_default
from .config import PredictionConfig
from .histogram import DecayingHistogram, ExponentialOptions, HistogramError, format_time, parse_time

log = logging.getLogger(__name__)

NODE_UID = "__node__"
SYSTEM_ITEM = "sys"
KNOWN_PRIORITY_CLASSES = ("koord-prod", "koord-mid", "koord-batch", "koord-free", "")
"""Upstream's known classes; "" is a pod without a class (neither priority nor QoS says)."""

MIN_SAMPLE_WEIGHT = 0.1
EPSILON = 0.001 * MIN_SAMPLE_WEIGHT
BUCKET_GROWTH = 0.05
CPU_OPTIONS = ExponentialOptions(1024, 0.025, 1 + BUCKET_GROWTH, EPSILON)
"""0.025 core first bucket, 5 % wider each, up to 1024 cores."""
MEMORY_OPTIONS = ExponentialOptions(float(1 << 41), float(5 << 20), 1 + BUCKET_GROWTH, EPSILON)
"""5 MiB first bucket, 5 % wider each, up to 2 TiB."""
TMP_SUFFIX = ".tmp"
MAX_CHECKPOINT_BYTES = 256 * 1024
MAX_CHECKPOINT_FILES = 10_000
STEP_SECONDS = 60.0


def node_item_uid(item: str) -> str:
    """The model id of a node item: ``__node-sys__``, ``__node-koord-prod__``, ``__node-__``."""
    return f"__node-{item}__"


class PredictionUnavailable(LookupError):
    """No model (yet) for the id asked for."""


class Querier(Protocol):
    def aggregate(self, kind: str, start: float, end: float, agg: Aggregation,
                  labels: dict[str, str] | None = None) -> float | None: ...


class Informer(Protocol):
    def get_all_pods(self) -> list[PodMeta]: ...

    def get_node(self) -> dict | None: ...

    def has_synced(self) -> bool: ...


PERCENTILES = (0.6, 0.9, 0.95, 0.98, 1.0)
"""What upstream's GetPrediction answers: p60, p90, p95, p98 and max."""


@dataclass(frozen=True)
class Prediction:
    """One model's percentiles: cpu in milli-cores, memory in bytes (truncated as upstream)."""

    cpu: dict[float, int]
    memory: dict[float, int]

    @classmethod
    def of(cls, model: Model) -> Prediction:
        return cls({p: int(model.cpu.percentile(p) * 1000.0) for p in PERCENTILES},
                   {p: int(model.memory.percentile(p)) for p in PERCENTILES})

    def cpu_milli(self, p: float) -> int:
        return self.cpu[p]

    def memory_bytes(self, p: float) -> int:
        return self.memory[p]


class Model:
    def __init__(self, config: PredictionConfig, last_updated: float) -> None:
        self.cpu = DecayingHistogram(CPU_OPTIONS, config.cpu_histogram_decay_half_life)
        self.memory = DecayingHistogram(MEMORY_OPTIONS, config.memory_histogram_decay_half_life)
        self.last_updated = last_updated
        self.last_checkpointed = -math.inf

    def add(self, cpu: float, memory: float, now: float) -> None:
        self.last_updated = now
        self.cpu.add_sample(cpu, 1.0, now)
        self.memory.add_sample(memory, 1.0, now)


def safe_file_name(uid: str) -> bool:
    """A model id usable as a file name in the checkpoint dir (pod UIDs come from outside)."""
    return (0 < len(uid) <= 200 and "/" not in uid and "\0" not in uid and not uid.startswith(".")
            and not uid.endswith(TMP_SUFFIX))


class FileCheckpointer:
    """One JSON file per model in ``path``, upstream's ModelCheckpoint field names."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def prepare(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(exc.errno, f"prediction checkpoint dir {self.path}: {exc.strerror}") from None

    def save(self, uid: str, doc: dict[str, Any]) -> None:
        final = self.path / uid
        tmp = self.path / (uid + TMP_SUFFIX)
        with open(tmp, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)

    def remove(self, uid: str) -> None:
        (self.path / uid).unlink(missing_ok=True)

    def restore(self) -> list[tuple[str, dict | None]]:
        """(id, document) per file; None for a file that cannot be read as one. Leftover
        temp files (a crash mid-write) are removed."""
        out: list[tuple[str, dict | None]] = []
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name)[:MAX_CHECKPOINT_FILES]:
            if not entry.is_file(follow_symlinks=False):
                continue
            if entry.name.endswith(TMP_SUFFIX):
                log.info("prediction: removing the unfinished checkpoint %s", entry.path)
                Path(entry.path).unlink(missing_ok=True)
                continue
            out.append((entry.name, self._read(Path(entry.path))))
        return out

    @staticmethod
    def _read(path: Path) -> dict | None:
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_CHECKPOINT_BYTES + 1)
            if len(raw) > MAX_CHECKPOINT_BYTES:
                raise ValueError(f"larger than {MAX_CHECKPOINT_BYTES} bytes")
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            return doc
        except (OSError, ValueError, RecursionError) as exc:
            log.error("prediction: checkpoint %s is unreadable (%s); it is removed", path, exc)
            return None


class PeakPredictServer:
    """Models by id, trained from the metric cache; thread-safe ``get_prediction``."""

    def __init__(self, config: PredictionConfig, informer: Informer, cache: Querier,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.informer = informer
        self.cache = cache
        self.clock = clock
        self.checkpointer = FileCheckpointer(config.checkpoint_filepath)
        self.models: dict[str, Model] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Creates the checkpoint dir (OSError when it cannot) and starts the loop thread."""
        self.checkpointer.prepare()
        self._thread = threading.Thread(target=self._run, name="prediction", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def _run(self) -> None:
        while not self.informer.has_synced():  # restoring needs the pods to tell known models
            if self._stopping.wait(0.1):
                return
        self._guarded("restore", self.restore)
        c = self.config
        tasks: list[tuple[str, float, Callable[[], None]]] = [
            ("training", c.training_interval, self.training),
            ("model gc", min(STEP_SECONDS, c.model_expiration), self.gc_models),
            ("checkpoint", min(STEP_SECONDS, c.model_checkpoint_interval), self.do_checkpoint)]
        start = time.monotonic()
        due = [start + period for _, period, _ in tasks]
        while not self._stopping.is_set():
            wait = min(due) - time.monotonic()
            if wait > 0 and self._stopping.wait(wait):
                return
            for i, (name, period, fn) in enumerate(tasks):
                if time.monotonic() >= due[i]:
                    self._guarded(name, fn)
                    due[i] = max(due[i] + period, time.monotonic())

    @staticmethod
    def _guarded(name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # a bad pod or file must not end the loop
            log.exception("prediction: %s failed; the next one runs as usual", name)

    # ---- training -----------------------------------------------------------------------

    def _p90(self, kind: str, start: float, end: float, labels: dict[str, str] | None = None) -> float | None:
        return self.cache.aggregate(kind, start, end, Aggregation.P90, labels)

    def training(self) -> None:
        now = self.clock()
        start = now - self.config.training_interval
        by_item: dict[str, tuple[float, float]] = {}

        def add(item: str, cpu: float, memory: float) -> None:
            old = by_item.get(item, (0.0, 0.0))
            by_item[item] = (old[0] + cpu, old[1] + memory)

        for pod in self.informer.get_all_pods():
            labels = {POD_UID: pod.uid}
            cpu = self._p90(POD_CPU_USAGE, start, now, labels)
            memory = self._p90(POD_MEMORY_USAGE, start, now, labels)
            if cpu is None or memory is None or not safe_file_name(pod.uid):
                log.debug("prediction: pod %s has no samples in the last %.0fs; not trained",
                          pod.key, self.config.training_interval)
                continue
            self._update(pod.uid, cpu, memory, now)
            add(priority_class_with_default(pod), cpu, memory)
            add("all-pods", cpu, memory)
        node_cpu = self._p90(NODE_CPU_USAGE, start, now)
        node_memory = self._p90(NODE_MEMORY_USAGE, start, now)
        if node_cpu is None or node_memory is None:
            log.warning("prediction: no node usage in the last %.0fs; node and system models "
                        "not trained", self.config.training_interval)
        else:
            self._update(NODE_UID, node_cpu, node_memory, now)
        for priority in KNOWN_PRIORITY_CLASSES:
            self._update(node_item_uid(priority), *by_item.get(priority, (0.0, 0.0)), now)
        if node_cpu is not None and node_memory is not None:
            pods_cpu, pods_memory = by_item.get("all-pods", (0.0, 0.0))
            self._update(node_item_uid(SYSTEM_ITEM), max(node_cpu - pods_cpu, 0.0),
                         max(node_memory - pods_memory, 0.0), now)
        self._synced.set()

    def _update(self, uid: str, cpu: float, memory: float, now: float) -> None:
        with self._lock:
            model = self.models.get(uid)
            if model is None:
                model = self.models[uid] = Model(self.config, now)
            model.add(cpu, memory, now)

    def get_prediction(self, uid: str) -> Prediction:
        """The model's percentiles now; PredictionUnavailable when there is no model."""
        with self._lock:
            model = self.models.get(uid)
            if model is None:
                raise PredictionUnavailable(f"no model for {uid}")
            return Prediction.of(model)

    # ---- gc and checkpoints ---------------------------------------------------------------

    def gc_models(self) -> None:
        if not self.has_synced():
            return
        now = self.clock()
        with self._lock:
            expired = [uid for uid, m in self.models.items()
                       if now - m.last_updated > self.config.model_expiration]
            for uid in expired:
                del self.models[uid]
        for uid in expired:
            log.info("prediction: model %s not trained for %.0fs: dropped", uid,
                     self.config.model_expiration)
            self._remove_file(uid)

    def _remove_file(self, uid: str) -> None:
        try:
            self.checkpointer.remove(uid)
        except OSError as exc:
            log.error("prediction: removing checkpoint %s failed: %s", uid, exc)

    def do_checkpoint(self) -> None:
        if not self.has_synced():
            return
        now = self.clock()
        with self._lock:
            pairs = sorted(self.models.items(), key=lambda kv: kv[1].last_checkpointed)
        saved = 0
        for uid, model in pairs:
            if saved >= self.config.model_checkpoint_max_per_step:
                break
            if now - model.last_checkpointed < self.config.model_checkpoint_interval:
                break
            with self._lock:
                doc = {"UID": uid, "CPU": model.cpu.save(), "Memory": model.memory.save(),
                       "LastUpdated": format_time(now)}
            try:
                self.checkpointer.save(uid, doc)
                log.debug("prediction: checkpoint of %s saved", uid)
            except OSError as exc:
                log.error("prediction: saving checkpoint %s failed: %s", uid, exc)
            model.last_checkpointed = now
            saved += 1

    def restore(self) -> None:
        """Models from the checkpoint files of known ids; the other files are removed."""
        known = {pod.uid for pod in self.informer.get_all_pods()}
        if self.informer.get_node() is not None:
            known.add(NODE_UID)
        known.add(node_item_uid(SYSTEM_ITEM))
        known.update(node_item_uid(p) for p in KNOWN_PRIORITY_CLASSES)
        restored = 0
        for uid, doc in self.checkpointer.restore():
            model = self._model_of(uid, doc) if uid in known and doc is not None else None
            if model is None:
                log.info("prediction: removing the checkpoint of unknown or unreadable model %s", uid)
                self._remove_file(uid)
                continue
            with self._lock:
                self.models[uid] = model
            restored += 1
        log.info("prediction: %d models restored from %s", restored, self.checkpointer.path)

    def _model_of(self, uid: str, doc: dict) -> Model | None:
        try:
            last_updated = parse_time(doc.get("LastUpdated"), f"checkpoint {uid}: LastUpdated")
        except ValueError as exc:
            log.error("prediction: %s", exc)
            return None
        model = Model(self.config, last_updated)
        for name, histogram in (("CPU", model.cpu), ("Memory", model.memory)):
            try:
                histogram.load(doc.get(name))
            except HistogramError as exc:  # upstream keeps the model with what loaded
                log.error("prediction: checkpoint %s: %s: %s", uid, name, exc)
        return model

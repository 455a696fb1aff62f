"""NodeMetric reporting: every ``reportIntervalSeconds`` the status is rebuilt and written.

Where it goes depends on the node: ``KubeStatusWriter`` replaces the status of the API
object (UpdateStatus, retried on conflict, at most 0.1 writes/s with a burst of 2 as
upstream); ``FileStatusWriter`` rewrites ``--node-metric-file`` atomically, keeping its
``metadata`` and ``spec``. Like upstream, nothing is written until a NodeMetric object has
been seen, and the first report comes one interval after start (the metric cache keeps
the samples from before a restart, so it already covers them).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import yaml

from koord import documents
from koord.logonce import LogOnce

from ..metrics import KoordletMetrics, ReportRows
from .informer import StatesInformer
from .nodemetric import MetricQuerier, ProdPredictor, collect, status_of
from .objects import (
    NODE_METRIC,
    NODEMETRIC_PLURAL,
    SLO_GROUP,
    SLO_VERSION,
    parse_object,
)
from .reachability import Reachability

log = logging.getLogger(__name__)


class StatusWriter(Protocol):
    def describe(self) -> str: ...
    def write(self, node_metric: dict, status: dict[str, Any]) -> bool: ...


class FileStatusWriter:
    """Replaces ``status`` in a NodeMetric file, keeping what the file has besides.

    The file is read before each write: while it still holds what was last written here
    its document is reused (a file of a hundred pods' status takes longer to parse than to
    write); a file changed since, that does not parse right now (being edited, garbage), is
    left alone and the round is skipped; an unwritable one is logged. Either way the
    process and the metric history carry on. ``on_written`` gets the new content before it
    replaces the file, so the file's watcher can tell koordlet's own writes from a user's.
    """

    def __init__(self, path: Path, on_written: Callable[[bytes], None] | None = None) -> None:
        self.path = Path(path)
        self.on_written = on_written
        self._said = LogOnce(log)
        self._written: tuple[bytes, dict[str, Any]] | None = None  # (content, its document)

    def describe(self) -> str:
        return f"file {self.path}"

    def _error(self, message: str) -> bool:
        self._said.say("error", f"NodeMetric {message}", level=logging.ERROR)
        return False

    def _current(self) -> tuple[bytes, dict[str, Any]] | None:
        """The file's bytes and document; None (logged) when unreadable or not a NodeMetric."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(documents.MAX_BYTES + 1)
        except OSError as exc:
            self._error(f"file {self.path}: cannot read: {exc.strerror or exc}; status not written")
            return None
        if self._written is not None and raw == self._written[0]:
            return raw, dict(self._written[1])
        try:
            return raw, parse_object(raw, self.path, "NodeMetric")
        except ValueError as exc:
            self._error(f"{exc}; status not written, the file is left as it is")
            return None

    def write(self, node_metric: dict, status: dict[str, Any]) -> bool:
        found = self._current()
        if found is None:
            return False
        raw, current = found
        current["status"] = status
        text = (json.dumps(current, indent=2) + "\n" if raw.lstrip()[:1] == b"{"
                else yaml.dump(current, Dumper=_YAML_DUMPER, sort_keys=False)).encode()
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            mode = self.path.stat().st_mode & 0o7777
            os.chmod(tmp, mode)
            if self.on_written is not None:
                self.on_written(text)
            os.replace(tmp, self.path)
            tmp = None
        except OSError as exc:
            return self._error(f"file {self.path}: cannot write: {exc.strerror or exc}; "
                               "keeping the last written status")
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self._written = (text, current)
        if self._said.clear("error"):
            log.info("NodeMetric file %s written again", self.path)
        return True


_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's emitter when PyYAML has it: the pure-Python one costs a report tens of ms."""


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; ``allow()`` takes one if there is one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._last = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


STATUS_UPDATE_QPS, STATUS_UPDATE_BURST = 0.1, 2
CONFLICT_BACKOFF = (0.01, 0.05, 0.25, 1.25)
"""client-go's retry.DefaultBackoff: 4 steps from 10 ms, factor 5."""


class KubeStatusWriter:
    """UpdateStatus of this node's NodeMetric; on a conflict, re-read and try again.

    The token bucket limits reports, not attempts: upstream takes a token per conflict
    retry too, so two conflicts in a row could lose the report.
    """

    def __init__(self, api_client: Any, node_name: str,
                 limiter: TokenBucket | None = None, reachability: Reachability | None = None) -> None:
        from kubernetes import client

        self.node_name = node_name
        self._custom = client.CustomObjectsApi(api_client)
        self._host = api_client.configuration.host
        self.reachability = reachability or Reachability(self._host)
        self.limiter = limiter or TokenBucket(STATUS_UPDATE_QPS, STATUS_UPDATE_BURST)

    def describe(self) -> str:
        return f"API server {self._host} (nodemetrics/{self.node_name}/status)"

    def write(self, node_metric: dict, status: dict[str, Any]) -> bool:
        from kubernetes.client.exceptions import ApiException

        if not self.limiter.allow():
            log.warning("NodeMetric %s: status update refused by the rate limit "
                        "(qps=%g burst=%d)", self.node_name, self.limiter.rate, self.limiter.burst)
            return False
        obj = node_metric
        for attempt, pause in enumerate((0.0, *CONFLICT_BACKOFF)):
            if pause:
                time.sleep(pause)
            body = dict(obj, status=status)
            started = self.reachability.now()
            try:
                self._custom.replace_cluster_custom_object_status(
                    SLO_GROUP, SLO_VERSION, NODEMETRIC_PLURAL, self.node_name, body,
                    _request_timeout=30)
                self.reachability.answered()
                return True
            except ApiException as exc:
                self.reachability.answered()
                if exc.status == 404:
                    log.warning("NodeMetric %s not found, skip", self.node_name)
                    return False
                if exc.status != 409 or attempt == len(CONFLICT_BACKOFF):
                    log.warning("NodeMetric %s: status update failed: %s %s", self.node_name,
                                exc.status, exc.reason)
                    return False
                try:
                    obj = self._custom.get_cluster_custom_object(  # type: ignore[assignment]
                        SLO_GROUP, SLO_VERSION, NODEMETRIC_PLURAL, self.node_name,
                        _request_timeout=30)
                except ApiException as get_exc:
                    log.warning("NodeMetric %s: re-read after a conflict failed: %s",
                                self.node_name, get_exc.reason)
                    return False
            except Exception as exc:  # connection errors: logged once per outage
                self.reachability.failed(f"NodeMetric {self.node_name} status update", exc, started)
                return False
        return False


class NodeMetricReporter:
    """The loop: one report interval after the last report (or the start), report, repeat.

    The interval is re-read whenever the NodeMetric changes, so a koordlet that started
    before its NodeMetric was seen does not sit out a default 60 s interval.
    """

    def __init__(self, informer: StatesInformer, cache: MetricQuerier, writer: StatusWriter,
                 metrics: KoordletMetrics | None = None,
                 predictor: Callable[[dict | None], ProdPredictor | None] | None = None) -> None:
        self.informer = informer
        self.predictor = predictor
        """A fresh Prod peak predictor per report, given the Node (None: no prediction fields)."""
        self.cache = cache
        self.writer = writer
        self.metrics = metrics
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._said = LogOnce(log)
        # A NodeMetric seen (or changed) after start may shorten the interval being waited.
        informer.register_callback(NODE_METRIC, self._wake.set)

    def report_once(self, now: float | None = None) -> dict[str, Any] | None:
        """Builds and writes one status; None when there is no NodeMetric object yet."""
        node_metric = self.informer.get_node_metric()
        if node_metric is None:
            self._said.say("waiting", "NodeMetric has not been seen yet (%s): skipping reports until it "
                           "exists", self.writer.describe())
            return None
        self._said.clear("waiting")
        policy = self.informer.get_node_metric_spec()
        pods = self.informer.get_all_pods()
        predictor = None if self.predictor is None else self.predictor(self.informer.get_node())
        node_slo = self.informer.get_node_slo()
        report = collect(self.cache, pods, policy, () if node_slo is None else node_slo.host_apps,
                         now, predictor)
        status = status_of(report)
        ok = self.writer.write(node_metric, status)
        if self.metrics is not None:
            self.metrics.record_report_rows(ReportRows(report.node, report.system, report.pods, report.containers,
                                                       pods, report.numa, report.prod))
            self.metrics.record_report(ok)
        if ok:
            log.debug("NodeMetric written to %s: %d pods", self.writer.describe(),
                      len(status["podsMetric"]))
        return status

    def start(self) -> None:
        log.info("NodeMetric reporter: every reportIntervalSeconds to %s", self.writer.describe())
        self._thread = threading.Thread(target=self._run, name="nodemetric-reporter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stopping.is_set():
            interval = self.informer.get_node_metric_spec()["reportIntervalSeconds"]
            remaining = last + interval - time.monotonic()
            if remaining > 0:
                self._wake.wait(remaining)
                self._wake.clear()
                continue
            last = time.monotonic()
            try:
                self.report_once()
            except Exception:  # a bad sample or object must not end reporting
                log.exception("NodeMetric report failed; retrying next interval")
                if self.metrics is not None:
                    self.metrics.record_report(False)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

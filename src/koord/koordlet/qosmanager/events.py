"""Kubernetes Events on pods for the QoS manager's evictions, as upstream's event recorder
posts them (source component ``koordlet-qosManager``, host the node).

Posting is off the strategy's thread: an API server that is slow or down must not hold up
the next eviction round. A bounded queue drops (and logs) what does not fit rather than
grow without end while the API server is away.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from typing import Any

from ..statesinformer import PodMeta

log = logging.getLogger(__name__)

COMPONENT = "koordlet-qosManager"
WARNING = "Warning"
MAX_PENDING = 256
POST_TIMEOUT = 10.0


def event_body(pod: PodMeta, event_type: str, reason: str, message: str, host: str,
               now: float) -> dict[str, Any]:
    """A core/v1 Event about ``pod``; named ``<pod>.<nanoseconds in hex>`` as client-go's
    recorder names them, so two events on one pod never collide."""
    stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{pod.name}.{int(now * 1e9):x}", "namespace": pod.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                           "name": pod.name, "uid": pod.uid},
        "type": event_type, "reason": reason, "message": message,
        "source": {"component": COMPONENT, "host": host},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "reportingComponent": COMPONENT, "reportingInstance": host,
    }


class EventRecorder:
    """``record(pod, type, reason, message)`` queues an Event; a daemon thread posts them."""

    def __init__(self, api_client: Any, host: str = "") -> None:
        self.api_client = api_client
        self.host = host
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(MAX_PENDING)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def record(self, pod: PodMeta, event_type: str, reason: str, message: str) -> None:
        body = event_body(pod, event_type, reason, message, self.host, time.time())
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            log.warning("event %s on pod %s dropped: %d events already wait for the API server",
                        reason, pod.key, MAX_PENDING)
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._post_all, name="qos-events", daemon=True)
                self._thread.start()

    def _post_all(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.api_client)
        while (body := self._queue.get()) is not None:
            meta = body["metadata"]
            try:
                core.create_namespaced_event(meta["namespace"], body,  # type: ignore[arg-type]
                                             _request_timeout=POST_TIMEOUT)
            except Exception as exc:  # the API's refusals and urllib3's connection errors alike
                log.warning("event %s on pod %s/%s not recorded: %s", body["reason"],
                            meta["namespace"], body["involvedObject"]["name"], exc)

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                return  # a daemon thread: it ends with the process
            thread.join(timeout=POST_TIMEOUT)

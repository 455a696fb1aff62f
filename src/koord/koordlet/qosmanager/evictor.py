"""Evicting a pod, in upstream's two modes: by default its running containers are stopped
through CRI (StopContainer, timeout 0) and the pod object is left alone (kubelet restarts
the containers per the pod's restartPolicy); with ``--only-evict-by-api`` the API server's
Eviction subresource is asked instead (a PodDisruptionBudget may refuse it with 429: the
pod keeps running and the next round asks again), and nothing is stopped.

As upstream, every eviction is made under the reason ``evicted`` with the message
``<strategy's reason>, kill pod: <name>``: that reason labels ``koordlet_pod_eviction`` and
``koordlet_pod_eviction_detail``, and the pod gets a Warning Event ``evictPodSuccess``
(``evictPodFail`` when the API refused or no container could be stopped) whose message is
``evict Pod:<ns>/<name>, reason: evicted, message: <message>``. The numbers that
triggered it are in the log line. A pod evicted in the last two minutes is not evicted
again (its release still counts, so a pending eviction does not make the strategy pick
another pod).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc

from ..statesinformer import PodMeta
from .events import WARNING, EventRecorder
from .metrics import QOSMetrics

log = logging.getLogger(__name__)

EVICTED_TTL_SECONDS = 120.0
CRI_TIMEOUT = 10.0
EVICTED = "evicted"
"""Upstream's reason for every eviction (the strategy's own reason goes into the message)."""
EVICT_POD_SUCCESS, EVICT_POD_FAIL = "evictPodSuccess", "evictPodFail"


class Evictor:
    def __init__(self, cri_endpoint: str, *, only_by_api: bool = False, api_client: Any = None,
                 metrics: QOSMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 events: EventRecorder | None = None) -> None:
        self.cri_endpoint = cri_endpoint.removeprefix("unix://")
        self.only_by_api = only_by_api
        self.api_client = api_client
        self.metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._evicted: dict[str, float] = {}
        self._evicted_amount: dict[str, float] = {}
        self._failures: dict[str, str] = {}
        self._channel: grpc.Channel | None = None
        if events is None and api_client is not None:
            events = EventRecorder(api_client, metrics.node if metrics is not None else "")
        self.events = events

    def recently_evicted(self, uid: str) -> bool:
        with self._lock:
            now = self._clock()
            for key in [k for k, t in self._evicted.items() if now - t >= EVICTED_TTL_SECONDS]:
                del self._evicted[key]
                self._evicted_amount.pop(key, None)
            return uid in self._evicted

    def evict(self, pod: PodMeta, reason: str, detail: str) -> bool:
        """True when the pod was evicted (or its containers stopped) now. ``reason`` is the
        strategy's (``EvictPodByNodeMemoryUsage``, ...), ``detail`` the numbers behind it."""
        if self.recently_evicted(pod.uid):
            return False
        message = f"{reason}, kill pod: {pod.name}"
        event = f"evict Pod:{pod.key}, reason: {EVICTED}, message: {message}"
        if not self.only_by_api:
            error = self._stop_containers(pod, message, detail)
            how = "stopping its containers through CRI"
        elif self.api_client is None:
            self._failed(pod, f"evict pod {pod.key} ({reason}) skipped: --only-evict-by-api and "
                              "no API server", detail)
            return False
        else:
            error = self._evict_by_api(pod, reason, detail)
            how = "through the API"
        if error is not None:
            if self._failed(pod, f"evict pod {pod.key} ({reason}) {how} failed: {error}; retried "
                                 "next round", detail):
                self._event(pod, EVICT_POD_FAIL, f"{event}, error {error}")
            return False
        self._event(pod, EVICT_POD_SUCCESS, event)
        with self._lock:
            self._evicted[pod.uid] = self._clock()
            self._failures.pop(pod.uid, None)
        if self.metrics is not None:
            self.metrics.record_eviction(pod.namespace, pod.name, EVICTED)
        return True

    def _event(self, pod: PodMeta, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.record(pod, WARNING, reason, message)

    def evict_until(self, victims: Sequence[PodMeta], release: float,
                    amount: Callable[[PodMeta], float], reason: str,
                    message: Callable[[PodMeta], str]) -> int:
        """Evicts victims in order until their amounts cover ``release``; a pod evicted
        moments ago counts without being evicted again. Returns how many were evicted now."""
        pending = [p for p in victims if self.recently_evicted(p.uid)]
        # Their usage samples may be gone already: count what they had when evicted.
        with self._lock:
            released = sum(self._evicted_amount.get(p.uid, 0.0) for p in pending)
        evicted = 0
        for pod in victims:
            if released >= release:
                break
            if pod in pending:
                continue
            pod_amount = amount(pod)
            if self.evict(pod, reason, message(pod)):
                with self._lock:
                    self._evicted_amount[pod.uid] = pod_amount
                released += pod_amount
                evicted += 1
        return evicted

    def _evict_by_api(self, pod: PodMeta, reason: str, detail: str) -> str | None:
        """None when the API server accepted the eviction, else what it answered."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace),
            delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.uid)))
        try:
            client.CoreV1Api(self.api_client).create_namespaced_pod_eviction(
                pod.name, pod.namespace, body)
        except ApiException as exc:
            return f"{exc.status} {exc.reason}"
        except Exception as exc:  # urllib3's connection errors: the API server unreachable
            return str(exc)
        log.warning("evicted pod %s through the API: %s: %s", pod.key, reason, detail)
        return None

    def _stop_containers(self, pod: PodMeta, message: str, detail: str) -> str | None:
        """Stops every running container; None when at least one stopped. Upstream stops at
        the first container that is not running, leaving the rest; here each one is tried."""
        if self._channel is None:
            self._channel = grpc.insecure_channel("unix:" + self.cri_endpoint)
        stub = cri_grpc.RuntimeServiceStub(self._channel)
        stopped, failed = [], []
        for c in pod.containers:
            if not c.running or not c.id:
                continue
            try:
                stub.StopContainer(cri.StopContainerRequest(container_id=c.id, timeout=0),
                                   timeout=CRI_TIMEOUT)
                stopped.append(c.name)
            except grpc.RpcError as exc:
                failed.append(f"{c.name}: {exc.code().name} {exc.details()}")
        if stopped:
            log.warning("evicted pod %s by stopping containers %s through CRI: %s: %s",
                        pod.key, ", ".join(stopped), message, detail)
            if failed:
                log.error("evict pod %s: stopping some containers failed: %s", pod.key, "; ".join(failed))
            return None
        return "; ".join(failed) or "no running container"

    def _failed(self, pod: PodMeta, message: str, detail: str = "") -> bool:
        """A failure repeats every tick while the cause lasts: logged as an error once per
        pod and cause (``detail``, the usage numbers, moves every round and is not part of
        the cause), at debug level after that. True the first time."""
        with self._lock:
            repeated = self._failures.get(pod.uid) == message
            self._failures[pod.uid] = message
            if len(self._failures) > 1024:
                self._failures.clear()
        log.log(logging.DEBUG if repeated else logging.ERROR, "%s", f"{message}; {detail}" if detail else message)
        return not repeated

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
        if self._channel is not None:
            self._channel.close()
            self._channel = None

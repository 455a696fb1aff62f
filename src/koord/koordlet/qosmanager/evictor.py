"""Evicting a pod: the API server's Eviction subresource in a cluster, CRI StopContainer
without one (kubelet, if any, restarts containers per the pod's restartPolicy).

Every eviction is logged with the pod, the reason and the numbers that triggered it, and
counted by reason. A pod evicted in the last two minutes is not evicted again (its
release still counts, so a pending eviction does not make the strategy pick another pod).
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
from .metrics import QOSMetrics

log = logging.getLogger(__name__)

EVICTED_TTL_SECONDS = 120.0
CRI_TIMEOUT = 10.0


class Evictor:
    def __init__(self, cri_endpoint: str, *, only_by_api: bool = False, api_client: Any = None,
                 metrics: QOSMetrics | None = None, clock: Callable[[], float] = time.monotonic) -> None:
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

    def recently_evicted(self, uid: str) -> bool:
        with self._lock:
            now = self._clock()
            for key in [k for k, t in self._evicted.items() if now - t >= EVICTED_TTL_SECONDS]:
                del self._evicted[key]
                self._evicted_amount.pop(key, None)
            return uid in self._evicted

    def evict(self, pod: PodMeta, reason: str, message: str) -> bool:
        """True when the pod was evicted (or stopped) now."""
        if self.recently_evicted(pod.uid):
            return False
        if self.api_client is not None:
            ok = self._evict_by_api(pod, reason, message)
        elif self.only_by_api:
            self._failed(pod, f"evict pod {pod.key} ({reason}) skipped: --only-evict-by-api and "
                              f"no API server; {message}")
            return False
        else:
            ok = self._stop_containers(pod, reason, message)
        if ok:
            with self._lock:
                self._evicted[pod.uid] = self._clock()
            if self.metrics is not None:
                self.metrics.evictions.labels(self.metrics.node, reason).inc()
        return ok

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

    def _evict_by_api(self, pod: PodMeta, reason: str, message: str) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace),
            delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.uid)))
        try:
            client.CoreV1Api(self.api_client).create_namespaced_pod_eviction(
                pod.name, pod.namespace, body)
        except ApiException as exc:
            self._failed(pod, f"evict pod {pod.key} ({reason}) through the API failed: "
                              f"{exc.status} {exc.reason}; {message}")
            return False
        log.warning("evicted pod %s through the API: %s: %s", pod.key, reason, message)
        return True

    def _stop_containers(self, pod: PodMeta, reason: str, message: str) -> bool:
        """Stops every running container. Upstream stops at the first container that is not
        running, leaving the rest; here each one is tried."""
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
        if failed:
            self._failed(pod, f"evict pod {pod.key} ({reason}): stopping containers failed: "
                              + "; ".join(failed))
        if stopped:
            log.warning("evicted pod %s by stopping containers %s through CRI: %s: %s",
                        pod.key, ", ".join(stopped), reason, message)
        return bool(stopped)

    def _failed(self, pod: PodMeta, message: str) -> None:
        """A failure repeats every tick while the cause lasts: logged as an error once per
        pod and cause, at debug level after that."""
        with self._lock:
            repeated = self._failures.get(pod.uid) == message
            self._failures[pod.uid] = message
            if len(self._failures) > 1024:
                self._failures.clear()
        log.log(logging.DEBUG if repeated else logging.ERROR, "%s", message)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

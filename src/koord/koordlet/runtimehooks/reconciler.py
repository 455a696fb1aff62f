"""Standalone mode: writes the plugins' cgroup values for pods already running.

Without the proxy nobody calls the hooks, and with it a rule change still has to reach
pods created earlier. Every interval, and on demand after a rule change, the reconciler
lists ready pods and created or running containers from the CRI endpoint and replays the hooks:

=====================  =======================  ===========================================
level                  stage replayed           written to
=====================  =======================  ===========================================
kube-QoS               (none)                   ``kube_qos_dir(qos)``: merged
                                                ``plugin.kube_qos_resources(qos)``
pod sandbox (READY)    PreRunPodSandbox         ``pod_dir(cgroup_parent)``
sandbox container      ``reconcile_sandbox``    ``container_dir(cgroup_parent, sandbox id)``
container (CREATED,    PreCreateContainer       ``container_dir(cgroup_parent, id)``
RUNNING)
pod gone since last    PostStopPodSandbox       nothing (plugins clean up, e.g. resctrl)
NodeSLO host app       (none)                   its existing dir: ``host_app_resources(app)``
every listed pod       (none)                   ``plugin.reconcile_pods``: a plugin's own
                                                state per pod (resctrl groups and tasks)
=====================  =======================  ===========================================

The hook requests are built from verbose CRI status by the builder the proxy uses too
(``koord.hookapi.fromcri``), so a plugin computes the same values in both modes. Changes a
cgroup cannot carry (envs, annotations) are ignored here.

When every plugin answers from the request and its rules alone
(``RuntimePlugin.answers_from_request_and_rules``), a pod or container whose request (the
same CRI records, the same current labels and annotations) and plugin rules are those of
the last round gets the last round's answer without running the hooks again. A round is a
refresh round when an interval has passed since the last one (so one comes at least every
two intervals, every interval when no round is asked for): it writes every answer again, so
a cgroup value someone else changed is put back by the next refresh round, and runs the hooks
again for the pods and containers whose turn it is (each one every ``REFRESH_ROUNDS``
refresh rounds). The rounds a pods change or a rule change asks for in between (about one a
second on a node running short jobs) write only new answers and refresh nothing, so a
round's cost and the refreshes' pace do not grow with the churn.

A container listed as created, not yet running, may have no cgroup yet (containerd makes
it at StartContainer) or one the runtime is about to write the spec's resources to (runc
makes the directory, which PLEG reports at once, then writes them): its answer is not kept,
so each round writes it again until one lists it running. A round that saw such a container
created within ``STARTING_WINDOW`` asks for the next round within ``STARTING_RETRY``.

A sandbox's labels and annotations in CRI are the pod's at creation and never change, while
a pod's annotations (oom-score-adj, the cpuset status, ...) and labels (core-sched group) may
be edited while it runs. The pods source (``current_pods``: the states informer's list, from
kubelet's ``/pods`` in a cluster) carries the current ones: for a pod it knows (matched by
UID) the requests get its labels and annotations; for a pod it does not know yet, CRI's.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from typing import TypeVar

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc
from google.protobuf.message import Message

from koord.hookapi import ContainerHookRequest, HookPoint, PodHookRequest, crilist, fromcri
from koord.logonce import LogOnce

from ..resourceexecutor.executor import CgroupError, CgroupExecutor, cgroup_dir_exists
from ..resources import KubeQoS, Resources
from ..statesinformer.meta import PodMeta
from .hooks import Hooks, RuntimePlugin, describe
from .hostapps import HOST_APPS, host_app_updates
from .protocol import CgroupUpdate, ContainerContext, HookContext, PodContext
from .reconcilerpods import (
    Answer,
    ListedPod,
    Observe,
    ReconcileReport,
    Timing,
    container_sizes,
    error_message,
    reconcile_plugins,
    running_pods,
    same_metadata,
    sandbox_context,
    with_current_metadata,
)
from .rule import Rules

log = logging.getLogger(__name__)

CRI_TIMEOUT = 10.0
REFRESH_ROUNDS = 30
"""A container's verbose status is asked when it is first seen, when the pods source shows
its requests or limits changed (kubelet resized it: the next round picks that up), and
otherwise every this many rounds (each round refreshes the containers whose id hashes to
it, so the calls spread evenly), not every round: a node of a hundred pods made it three
hundred calls every 10 s. What the hooks read from it (the spec's resources, annotations)
changes only when a container is resized; the periodic refresh is the safety net for a
resize the pods source does not show (pods from CRI). A reused answer (see above) is
likewise computed again at a pod's or container's refresh round. Only refresh rounds count
(see the module's docstring)."""
STARTING_RETRY = 1.0
"""Seconds to the next round after one that saw a young container not running yet."""
STARTING_WINDOW = 60.0
"""Seconds after its creation a container not running yet is young: kubelet starts what it
creates at once, so one older than this failed to start (and kubelet will remove it); it
does not keep the loop on quick rounds."""
_Item = TypeVar("_Item", cri.PodSandbox, cri.Container)


class Reconciler:
    def __init__(self, hooks: Hooks, executor: CgroupExecutor, plugins: Iterable[RuntimePlugin],
                 cri_endpoint: str, interval: float,
                 current_pods: Callable[[], Iterable[PodMeta]] | None = None,
                 clock: Callable[[], float] = time.monotonic, observe: Observe | None = None) -> None:
        self.hooks = hooks
        self.observe = observe
        self.executor = executor
        self.plugins = list(plugins)
        self.cri_endpoint = cri_endpoint.removeprefix("unix://")
        self.interval = interval
        self._channel = grpc.insecure_channel("unix:" + self.cri_endpoint)
        self._cri = cri_grpc.RuntimeServiceStub(self._channel)
        self.current_pods = current_pods
        self._cri_pods: dict[str, tuple[bytes, str]] = {}
        """Sandbox id -> its record from CRI's verbose status (asked once per sandbox) and
        the pod's uid. Records and requests are kept serialized and parsed only when the
        hooks run on them (a round that reuses an answer compares them by identity): a
        parsed message holds an arena of kilobytes, a busy node's worth of them a megabyte,
        where the bytes are a tenth of that."""
        self._known_pods: dict[str, ListedPod] = {}
        """Sandbox id -> the pod of the last round, for PostStopPodSandbox."""
        self._containers: dict[str, tuple[bytes, bytes, object]] = {}
        """Created and running containers' verbose status (a digest of it as received), the
        record made of it (a serialized ContainerHookRequest) and the container's requests
        and limits in the pods source when it was asked, by id (see REFRESH_ROUNDS); a
        container no longer listed is dropped. A digest, not the status: containerd's
        verbose info holds the container's whole OCI spec (kilobytes a container), which
        kept for every container adds up on a busy node."""
        self._pod_requests: dict[str, tuple[bytes, PodMeta | None, bytes]] = {}
        """Sandbox id -> (CRI record, pods source's pod, the request made of them) of the last round."""
        self._reuse_answers = all(p.answers_from_request_and_rules for p in self.plugins)
        self._answers: dict[str, Answer] = {}
        """Sandbox or container id -> the last round's answer, when answers may be reused."""
        self._round = 0
        """Refresh rounds so far (see REFRESH_ROUNDS)."""
        self._refreshing = False
        self._last_refresh: float | None = None
        self._clock = clock
        self._round_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._said = LogOnce(log)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()
        log.info("reconciler started: every %.3gs from CRI %s", self.interval, self.cri_endpoint)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._channel.close()

    def reconcile_now(self) -> None:
        """Asks the loop for a round as soon as possible (after a rule change)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            wait = self.interval
            try:
                if self.reconcile_once(refresh=self.refresh_due()).starting:
                    wait = min(wait, STARTING_RETRY)
            except Exception as exc:  # a plugin or executor bug must not end Standalone mode
                log.exception("reconciler: reconcile round failed: %r; next round in %.3gs", exc, self.interval)
            self._wake.wait(wait)
            self._wake.clear()

    def refresh_due(self) -> bool:
        """Whether the loop's next round refreshes (the first does, then one an interval or
        more after the last refresh round); noted as the last refresh when it does."""
        now = self._clock()
        if self._last_refresh is not None and now - self._last_refresh < self.interval:
            return False
        self._last_refresh = now
        return True

    def reconcile_once(self, refresh: bool = True) -> ReconcileReport:
        """One round; ``refresh``: a refresh round (see REFRESH_ROUNDS), which a round called
        directly is."""
        with self._round_lock:
            report = ReconcileReport()
            self._reconcile_kube_qos(report)
            apps = next((r[HOST_APPS] for p in self.plugins if isinstance(r := getattr(p, "rules", None), Rules)), ())
            for who, update in host_app_updates(apps, [p.host_app_resources for p in self.plugins], self.executor):
                self._apply(update, who, report)
            try:
                sandboxes = self._list("ListPodSandbox", cri.ListPodSandboxRequest(filter=cri.PodSandboxFilter(
                    state=cri.PodSandboxStateValue(state=cri.SANDBOX_READY))), cri.PodSandbox, report)
                # Created ones too, as upstream (kubelet lists a container once it has an id): its
                # cgroup exists from `runc create`, when PLEG sees it, and it may not run for a while.
                containers = [c for c in self._list("ListContainers", cri.ListContainersRequest(),
                                                    cri.Container, report)
                              if c.state in (cri.CONTAINER_CREATED, cri.CONTAINER_RUNNING)]
            except grpc.RpcError as exc:
                self._cri_unavailable(report, exc)
                return report
            except crilist.ListError as exc:
                report.errors.append(f"CRI {self.cri_endpoint}: {exc}")
                log.error("reconciler: CRI %s: %s", self.cri_endpoint, exc)
                return report
            if self._said.clear("cri"):
                log.info("reconciler: CRI %s reachable again", self.cri_endpoint)
            self._refreshing = refresh
            if refresh:
                self._round += 1
            rules = tuple(p.rules for p in self.plugins) if self._reuse_answers else ()
            last_answers, self._answers = self._answers, {}
            current = self._current_pods_by_uid(report)
            pods = self._reconcile_pods(sandboxes, current, rules, last_answers, report)
            self._reconcile_containers(containers, pods, container_sizes(current), rules, last_answers, report)
            self._forget_stopped_pods(pods, report)
            self._tell_plugins(len(sandboxes), pods, containers, report)
            log.debug("reconciler round: %d pods, %d containers, %d writes, %d errors",
                      report.pods, report.containers, len(report.written), len(report.errors))
            return report

    def _list(self, method: str, request: Message, item_type: type[_Item], report: ReconcileReport) -> list[_Item]:
        """The items of a List* answer that decode; the others are skipped, each logged once."""
        raw = self._channel.unary_unary(f"/runtime.v1.RuntimeService/{method}",
                                        request_serializer=type(request).SerializeToString)(
            request, timeout=CRI_TIMEOUT)
        items, unreadable = crilist.decode_items(raw, item_type)
        report.unreadable += len(unreadable)
        for item_id in unreadable:
            what = f"{item_type.DESCRIPTOR.name} {item_id or '(no readable id)'}"
            report.errors.append(f"{what}: not readable")
            self._said.say(("unreadable", what), "reconciler: skipping %s: the runtime's record does not "
                           "decode (a name that is not UTF-8?)", what)
        return items

    def _cri_unavailable(self, report: ReconcileReport, exc: grpc.RpcError) -> None:
        message = f"CRI {self.cri_endpoint}: {exc.code().name}: {exc.details()}"
        report.errors.append(message)
        self._said.say("cri", f"reconciler: cannot list pods: {message}; retrying every {self.interval:.3g}s")

    def _reconcile_kube_qos(self, report: ReconcileReport) -> None:
        for qos in KubeQoS:
            timing = Timing.start("kubeqos", report)
            merged = Resources()
            for plugin in self.plugins:
                values = plugin.kube_qos_resources(qos)
                if values is not None:
                    merged.update(values)
            if merged.is_empty():
                continue
            cgroup_dir = self.executor.kube_qos_dir(qos)
            if cgroup_dir_exists(self.executor, cgroup_dir, merged):
                update = CgroupUpdate(cgroup_dir, merged)
                timing.done(self.observe, update, self._apply(update, f"kube-QoS {qos}", report), report)
            else:
                log.debug("reconciler: kube-QoS %s: no cgroup %s", qos, cgroup_dir)

    def _current_pods_by_uid(self, report: ReconcileReport) -> dict[str, PodMeta]:
        if self.current_pods is None:
            return {}
        try:
            return {pod.uid: pod for pod in self.current_pods() if pod.uid}
        except Exception as exc:  # the pods source's bug: CRI's labels and annotations this round
            self._error(report, "pods source", exc)
            return {}

    def _pod_record(self, sandbox_id: str) -> tuple[bytes, str]:
        """The sandbox's record from its verbose status (serialized) and the pod's uid."""
        record = fromcri.pod_record_from_status(self._cri.PodSandboxStatus(cri.PodSandboxStatusRequest(
            pod_sandbox_id=sandbox_id, verbose=True), timeout=CRI_TIMEOUT), sandbox_id)
        if not record.cgroup_parent:
            raise ValueError(f"sandbox {sandbox_id}: no cgroup parent in the verbose status "
                             "(is the runtime containerd with the CRI plugin?)")
        return record.SerializeToString(), record.pod_meta.uid

    def _pod_request(self, sandbox_id: str, record: bytes, pod: PodMeta | None,
                     made: dict[str, tuple[bytes, PodMeta | None, bytes]]) -> bytes:
        """``with_current_metadata``, the last round's request when made of the
        same record and of the same labels and annotations (so answers keyed by the request
        can be reused); noted in ``made``."""
        last = self._pod_requests.get(sandbox_id)
        if last is not None and last[0] is record and same_metadata(last[1], pod):
            request = last[2]
        else:
            request = with_current_metadata(record, pod)
        made[sandbox_id] = (record, pod, request)
        return request

    def _reused(self, key: str, inputs: tuple[object, ...], last_answers: dict[str, Answer]) -> Answer | None:
        """The last round's answer for ``key`` when made of the same objects and ``key`` is not
        due for a refresh this round."""
        last = last_answers.get(key)
        if (not self._reuse_answers or last is None or self._due(key) or len(last.inputs) != len(inputs)
                or not all(a is b for a, b in zip(last.inputs, inputs, strict=True))):
            return None
        self._answers[key] = last
        return last

    def _hooks_answer(self, key: str, inputs: tuple[object, ...], stage: HookPoint, ctx: HookContext,
                      report: ReconcileReport) -> Answer | None:
        """The hooks' answer on ``ctx``, None when a plugin failed under the Fail policy; kept for
        the next round when no plugin failed."""
        errors = len(report.errors)
        if not self._run_hooks(stage, ctx, report):
            return None
        answer = Answer(inputs, ctx.cgroup_update(self.executor, through_proxy=False))
        if len(report.errors) == errors:
            self._answers[key] = answer
        return answer

    def _due(self, key: str) -> bool:
        """This round refreshes ``key`` (a sandbox or container id): one refresh round in
        REFRESH_ROUNDS, spread by id."""
        return self._refreshing and zlib.crc32(key.encode()) % REFRESH_ROUNDS == self._round % REFRESH_ROUNDS

    def _reconcile_pods(self, sandboxes: list[cri.PodSandbox], current: dict[str, PodMeta], rules: tuple[object, ...],
                        last_answers: dict[str, Answer], report: ReconcileReport) -> dict[str, ListedPod]:
        pods: dict[str, ListedPod] = {}
        cri_pods: dict[str, tuple[bytes, str]] = {}
        pod_requests: dict[str, tuple[bytes, PodMeta | None, bytes]] = {}
        for sandbox in sandboxes:
            who = f"pod {sandbox.metadata.namespace}/{sandbox.metadata.name}"
            try:
                # A sandbox's config (labels, annotations, cgroup parent) never changes: the
                # verbose status is asked once per sandbox, not every round.
                record, uid = cri_pods[sandbox.id] = self._cri_pods.get(sandbox.id) or self._pod_record(sandbox.id)
                request = self._pod_request(sandbox.id, record, current.get(uid), pod_requests)
                pods[sandbox.id] = ListedPod(who, request)
                timing, inputs = Timing.start("pod", report), (request, *rules)
                reused = self._reused(sandbox.id, inputs, last_answers)
                answer = reused or self._hooks_answer(
                    sandbox.id, inputs, HookPoint.PRE_RUN_POD_SANDBOX,
                    PodContext.from_proto(PodHookRequest.FromString(request)), report)
                if answer is not None:
                    report.pods += 1
                    self._apply_answer(sandbox.id, answer, reused is not None, who, report, timing)
                self._reconcile_sandbox(sandbox.id, request, rules, last_answers, who, report)
            except Exception as exc:  # one broken pod must not stop the round
                self._error(report, who, exc)
        self._cri_pods = cri_pods
        self._pod_requests = pod_requests
        return pods

    def _reconcile_sandbox(self, sandbox_id: str, request: bytes, rules: tuple[object, ...],
                           last_answers: dict[str, Answer], who: str, report: ReconcileReport) -> None:
        """The sandbox container's cgroup: what the plugins' ``reconcile_sandbox`` decide."""
        key, inputs, timing = f"sandbox/{sandbox_id}", (request, *rules), Timing.start("sandbox", report)
        answer = reused = self._reused(key, inputs, last_answers)
        if answer is None:
            ctx = sandbox_context(request, sandbox_id)
            for plugin in self.plugins:
                plugin.reconcile_sandbox(ctx)
            answer = self._answers[key] = Answer(inputs, ctx.cgroup_update(self.executor, through_proxy=False))
        self._apply_answer(key, answer, reused is not None, f"{who} sandbox container", report, timing)

    def _container_record(self, container_id: str, size: object) -> bytes:
        """The container's record: cached, or from its verbose status when first seen, when
        ``size`` (its requests and limits in the pods source) is not what it was then (a
        resize; a size first shown after the status was asked is none), or when due for a
        refresh this round. A status answered with the same bytes as before
        keeps its record (parsing the verbose info is most of a refresh's cost)."""
        cached = self._containers.get(container_id)
        due = cached is None or self._due(container_id)
        if not due and cached is not None and cached[2] is None and size is not None:
            # Asked before the pods source listed it (kubelet lists a pod after the runtime
            # made it): the size it shows now is the one the container was made with.
            cached = self._containers[container_id] = (cached[0], cached[1], size)
        if cached is None or due or cached[2] != size:
            request = cri.ContainerStatusRequest(container_id=container_id, verbose=True)
            raw = self._channel.unary_unary("/runtime.v1.RuntimeService/ContainerStatus",
                                            request_serializer=cri.ContainerStatusRequest.SerializeToString)(
                request, timeout=CRI_TIMEOUT)
            digest = hashlib.blake2b(raw, digest_size=16).digest()
            if cached is None or digest != cached[0]:
                status = cri.ContainerStatusResponse.FromString(raw)
                record = fromcri.container_record_from_status(status, container_id)[1]
                cached = digest, record.SerializeToString(), size
            elif due:
                cached = digest, cached[1], size
            # Else the same bytes for a new size: kubelet updates the runtime after the pod,
            # so the status is asked again next round, until it changes or the refresh round
            # takes the size as it is (a resize the runtime never shows, e.g. a memory request).
            self._containers[container_id] = cached
        return cached[1]

    def _reconcile_containers(self, containers: list[cri.Container], pods: dict[str, ListedPod],
                              sizes: dict[str, object], rules: tuple[object, ...], last_answers: dict[str, Answer],
                              report: ReconcileReport) -> None:
        listed = {container.id for container in containers}
        for gone in self._containers.keys() - listed:
            del self._containers[gone]
        for container in containers:
            pod = pods.get(container.pod_sandbox_id)
            if pod is None:
                continue
            who = f"{pod.who} container {container.metadata.name}"
            try:
                record = self._container_record(container.id, sizes.get(container.id))
                timing, inputs = Timing.start("container", report), (pod.request, record, *rules)
                reused = self._reused(container.id, inputs, last_answers)
                answer = reused or self._hooks_answer(
                    container.id, inputs, HookPoint.PRE_CREATE_CONTAINER,
                    ContainerContext.from_proto(fromcri.container_hook_request(
                        PodHookRequest.FromString(pod.request), ContainerHookRequest.FromString(record))), report)
                if answer is not None:
                    report.containers += 1
                    self._apply_answer(container.id, answer, reused is not None, who, report, timing)
                    if container.state == cri.CONTAINER_CREATED:
                        self._not_started(container, report)
            except Exception as exc:  # one broken container must not stop the round
                self._error(report, who, exc)

    def _not_started(self, container: cri.Container, report: ReconcileReport) -> None:
        """The answer of a container not running yet is not kept: the next round writes it
        again, over what the runtime may have written since (see the module's docstring)."""
        self._answers.pop(container.id, None)
        if time.time_ns() - container.created_at < STARTING_WINDOW * 1e9:
            report.starting += 1

    def _forget_stopped_pods(self, pods: dict[str, ListedPod], report: ReconcileReport) -> None:
        for sandbox_id in self._known_pods.keys() - pods.keys():
            ctx = PodContext.from_proto(PodHookRequest.FromString(self._known_pods[sandbox_id].request))
            if self._run_hooks(HookPoint.POST_STOP_POD_SANDBOX, ctx, report):
                report.stopped_pods += 1
        self._known_pods = pods

    def _tell_plugins(self, listed: int, pods: dict[str, ListedPod], containers: list[cri.Container],
                      report: ReconcileReport) -> None:
        """Every plugin's ``reconcile_pods``: complete when every listed item was understood."""
        running = running_pods({sandbox_id: pod.request for sandbox_id, pod in pods.items()}, containers)
        for problem in reconcile_plugins(self.plugins, running, len(pods) == listed and not report.unreadable):
            log.warning("reconciler: %s", problem)
            report.errors.append(problem)

    def _run_hooks(self, stage: HookPoint, ctx: HookContext, report: ReconcileReport) -> bool:
        """False when a plugin failed under the Fail policy (the error is in the report)."""
        try:
            errors = self.hooks.run(stage, ctx)
        except Exception as exc:
            report.errors.append(str(exc))
            return False
        report.errors.extend(f"plugin {plugin} at {stage} for {describe(ctx)}: {exc}"
                             for plugin, exc in errors)
        return True

    def _apply_answer(self, key: str, answer: Answer, reused: bool, who: str, report: ReconcileReport,
                      timing: Timing) -> None:
        """Writes the answer, except a reused one between refresh rounds: it was written
        when made, and the refresh round puts back what someone else changed. An answer
        whose write failed is not reused: the next round makes and writes it again."""
        if reused and not self._refreshing:
            return
        if not timing.done(self.observe, answer.update, self._apply(answer.update, who, report), report):
            self._answers.pop(key, None)

    def _apply(self, update: CgroupUpdate | None, who: str, report: ReconcileReport) -> bool:
        """False when the write failed (logged and in the report)."""
        if update is None:
            return True
        cgroup_dir = update.cgroup_dir
        try:
            written = self.executor.apply(cgroup_dir, update.resources)
        except CgroupError as exc:
            self._error(report, who, exc)
            return False
        if written:
            log.info("reconciler: %s: wrote %s to cgroup %s", who, ", ".join(written), cgroup_dir)
        report.written.extend(f"{cgroup_dir}:{name}" for name in written)
        return True

    def _error(self, report: ReconcileReport, who: str, exc: Exception) -> None:
        """A pod or container that went between the list and this call (the runtime no
        longer knows it, or its cgroup is gone from a tree that is there) is no error: it is
        said at debug level and the next round does not list it."""
        message, gone = error_message(exc, self.executor)
        if gone:
            log.debug("reconciler: %s: gone since the list: %s", who, message)
            return
        log.warning("reconciler: %s: %s", who, message)
        report.errors.append(f"{who}: {message}")


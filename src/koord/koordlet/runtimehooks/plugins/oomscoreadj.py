"""OOMScoreAdj: sets ``/proc/<pid>/oom_score_adj`` of every process of a container from pod
annotations, so a pod can say which of its containers the kernel's OOM killer takes first.

``koordinator.sh/oom-score-adj`` is the pod's default, ``koordinator.sh/oom-score-adj-spec``
(``{"<container>": <value>}``) names containers and wins; values in [-1000, 1000]. The
proxy's PostStartContainer sets it as soon as the first process exists, and the reconciler
replays this for every running container each round, so processes started since get it too
and a value some other writer changed is put back. Only processes whose value differs are
written; the sandbox (pause) container is never touched. The reconciler takes a running
pod's annotations from the states informer's pod list (kubelet's ``/pods`` in a cluster),
so an annotation edited on a running pod is followed within a round.

Lowering a value below what a process has needs CAP_SYS_RESOURCE; a kernel that refuses
(EACCES) is reported once per container and value, never retried in a loop of log lines.
The value a container's processes hold is upstream's ``koordlet_container_oom_score_adj``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector as PromCollector

from koord import cgrouplimits
from koord.apis.extension import ANNOTATION_OOM_SCORE_ADJ, ANNOTATION_OOM_SCORE_ADJ_SPEC
from koord.hookapi import HookPoint, json_annotation
from koord.logonce import LogOnce

from ...resourceexecutor.executor import CgroupError
from ..hooks import Hooks, InvalidInput, PluginEnv, RuntimePlugin
from ..protocol import ContainerContext

log = logging.getLogger(__name__)

MAX_PIDS = 1 << 16
"""A container listing more processes than this is not walked (each costs a read and a write)."""


def _value(raw: object, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidInput(f"{where}={raw!r:.40}: want an integer in [-1000, 1000]")
    why = cgrouplimits.problem(cgrouplimits.Kind.OOM_SCORE_ADJ, raw)
    if why:
        raise InvalidInput(f"{where}: {why}")
    return raw


def oom_score_adj_for(annotations: dict[str, str], container: str) -> int | None:
    """The container's value: its entry in the spec, else the pod's default, else None."""
    spec = json_annotation(annotations, ANNOTATION_OOM_SCORE_ADJ_SPEC, error=InvalidInput)
    if spec is not None and container in spec:
        return _value(spec[container], f"pod annotation {ANNOTATION_OOM_SCORE_ADJ_SPEC}: {container}")
    text = annotations.get(ANNOTATION_OOM_SCORE_ADJ)
    if not text:
        return None
    where = f"pod annotation {ANNOTATION_OOM_SCORE_ADJ}"
    digits = text[1:] if text[:1] in "+-" else text
    if not (len(text) <= 8 and digits.isascii() and digits.isdigit()):
        raise InvalidInput(f"{where}={text!r:.40}: want an integer in [-1000, 1000]")
    return _value(int(text), where)

EXPIRE_SECONDS = 300.0
"""As upstream's expiring gauge: a container's series goes this long after its last set
(the reconciler refreshes every running container far more often)."""


class OOMScoreAdjGauge(PromCollector):
    """``koordlet_container_oom_score_adj``: the value each container's processes hold, as
    its rows read at scrape time; a row not refreshed for ``EXPIRE_SECONDS`` is dropped."""

    def __init__(self, node: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.node, self._clock = node, clock
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, str, str], tuple[int, float]] = {}

    def set(self, namespace: str, pod: str, uid: str, container: str, value: int) -> None:
        with self._lock:
            self._rows[(namespace, pod, uid, container)] = (value, self._clock())

    @staticmethod
    def describe() -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("koordlet_container_oom_score_adj", "the oom_score_adj value set for the container",
                                labels=["node", "pod_namespace", "pod_name", "pod_uid", "container_name"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        [family] = self.describe()
        now = self._clock()
        with self._lock:
            for key in [k for k, (_, at) in self._rows.items() if now - at >= EXPIRE_SECONDS]:
                del self._rows[key]
            rows = list(self._rows.items())
        for key, (value, _) in rows:
            family.add_metric([self.node, *key], value)
        yield family


class OOMScoreAdj(RuntimePlugin):
    name = "OOMScoreAdj"

    def __init__(self, env: PluginEnv) -> None:
        super().__init__(env)
        self.gauge = OOMScoreAdjGauge(env.node)
        (env.registry if env.registry is not None else CollectorRegistry()).register(self.gauge)
        self._refused = LogOnce(log, max_keys=MAX_PIDS)
        """Per container id, the value the kernel last refused for it (said once)."""

    def register(self, hooks: Hooks) -> None:
        description = "set oom_score_adj of the container's processes from pod annotations"
        for stage in (HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER):
            hooks.register_container(stage, self.name, description, self.set_container)

    def set_container(self, ctx: ContainerContext) -> None:
        req = ctx.request
        if not req.container_id:
            return  # being created: no process yet; PostStartContainer or the reconciler follow
        value = oom_score_adj_for(req.pod_annotations, req.container_name)
        if value is None:
            return
        who = f"pod {req.pod_meta} container {req.container_name}"
        ex = self.env.executor
        try:
            cgroup_dir = ex.container_dir(req.pod_cgroup_parent, req.container_id)
            text = ex.read(cgroup_dir, "procs")
        except CgroupError as exc:  # gone, or not started yet
            log.debug("plugin %s: %s: %s", self.name, who, exc)
            return
        pids = [int(p) for p in text.split()[:MAX_PIDS] if p.isascii() and p.isdigit()]
        updated, refused = set_oom_score_adj(self.env.proc_root, pids, value)
        if len(refused) < len(pids):  # some process holds the value now
            meta = req.pod_meta
            self.gauge.set(meta.namespace, meta.name, meta.uid, req.container_name, value)
        if updated:
            log.info("plugin %s: %s: oom_score_adj %d set for %d of %d processes", self.name, who, value,
                     updated, len(pids))
        if refused:
            self._refused.say(req.container_id, f"plugin %s: %s: the kernel refused oom_score_adj {value} for %d "
                              "process(es) (%s): lowering it needs CAP_SYS_RESOURCE", self.name, who,
                              len(refused), refused[0], level=logging.ERROR)
        else:
            self._refused.clear(req.container_id)


def set_oom_score_adj(proc_root: Path, pids: list[int], value: int) -> tuple[int, list[str]]:
    """Writes ``value`` for each pid whose value differs: (how many were written, the refusals).

    A process that exited meanwhile is skipped silently.
    """
    updated, refused = 0, []
    for pid in pids:
        path = proc_root / str(pid) / "oom_score_adj"
        try:
            if int(path.read_text().strip()) == value:
                continue
            path.write_text(str(value))
            updated += 1
        except (FileNotFoundError, ProcessLookupError):
            continue
        except PermissionError as exc:
            refused.append(f"pid {pid}: {exc.strerror}")
        except (OSError, ValueError) as exc:
            refused.append(f"pid {pid}: {exc}")
    return updated, refused

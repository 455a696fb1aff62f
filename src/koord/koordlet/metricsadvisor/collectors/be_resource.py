"""Best-effort CPU in milli-cores: what BE pods use, request and may really get.

- usage: delta of the besteffort QoS cgroup's CPU time / wall delta;
- request: the sum of ``kubernetes.io/batch-cpu`` requests of Koordinator-BE pods (the
  containers' requests, or the pod's extended-resource-spec annotation when pods come from CRI);
- real-limit: min(|BE cpuset| x 1000, quota x 1000 / period when quota != -1), where the BE
  cpuset is the smallest one among the besteffort dir and every dir below it (a container
  may be pinned narrower than its parents).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ...metriccache import Samples
from ...metriccache import kinds as k
from ...resources import KoordQoS
from ...runtimehooks.hooks import HookError
from ...runtimehooks.plugins.batchresource import BATCH_CPU, parse_extended_resource_spec
from ...statesinformer.meta import PodMeta
from ..framework import Collector, Env, Rates
from ..parsers import (
    SMALL_FILE_BYTES,
    FileProblem,
    cgroup_cpu_ns,
    parse,
    parse_cpu_list,
    parse_cpu_quota,
    read_bounded,
)

_MAX_WALK_DIRS = 10_000
_WALK_SECONDS = 10.0
_MAX_CPUSET_TEXTS = 256


def _be_labels(allocation: str) -> dict[str, str]:
    return {k.BE_RESOURCE: k.BE_RESOURCE_CPU, k.BE_ALLOCATION: allocation}


def real_limit_milli(cpuset_sizes: list[int], quota: int, period: int) -> int | None:
    """min(smallest cpuset x 1000, quota x 1000 / period); None without any cpuset."""
    if not cpuset_sizes:
        return None
    limit = min(cpuset_sizes) * 1000
    if quota != -1 and period > 0:
        limit = min(limit, quota * 1000 // period)
    return limit


class BEResourceCollector(Collector):
    name = "BEResource"

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self.rates = Rates(ttl=20 * self.interval, problems=self.problems)
        self._walked: tuple[float, list[str]] | None = None
        # A cpuset file's text -> its CPU count: a hundred files a second hold a few
        # distinct lists, parsed once each (bounded: cleared past _MAX_CPUSET_TEXTS).
        self._cpuset_size: dict[bytes, int] = {}

    @property
    def be_dir(self) -> str:
        return self.env.kube_qos_dir("besteffort")

    def _cpuset_files(self, top: Path) -> list[str]:
        """The cpuset file of the besteffort dir and of every dir below it. The tree is
        walked every ``_WALK_SECONDS`` (listing a hundred dirs of twenty files each cost
        more than the rest of the tick); the files are read every tick."""
        now = time.monotonic()
        if self._walked is not None and self._walked[1][:1] == [str(top)] and now - self._walked[0] < _WALK_SECONDS:
            return self._walked[1]
        found: list[str] = []
        for walked, (dirpath, _dirs, files) in enumerate(os.walk(top.parent)):
            if walked >= _MAX_WALK_DIRS:
                self.problems.say("walk", "more than %d dirs below %s; BE cpuset from the first ones",
                                     _MAX_WALK_DIRS, top.parent)
                break
            if top.name in files:
                found.append(os.path.join(dirpath, top.name))
        self._walked = (now, found)
        return found

    def _cpuset_sizes(self) -> list[int]:
        """Sizes of the besteffort dir's cpuset and of every dir below it (read in one call)."""
        sizes: list[int] = []
        paths = self._cpuset_files(self.env.cgroup_file(self.be_dir, "cpuset_cpus_effective"))
        for path, data in zip(paths, self.env.files.read_all(paths, SMALL_FILE_BYTES), strict=True):
            if isinstance(data, FileProblem):
                if not data.missing:
                    self.problems.say(("cpuset", str(data.path)), "%s; ignored for the BE cpuset", data)
                continue
            size = self._cpuset_size.get(data)
            if size is None:
                if len(self._cpuset_size) >= _MAX_CPUSET_TEXTS:
                    self._cpuset_size.clear()
                try:
                    size = self._cpuset_size[data] = len(parse_cpu_list(data.decode("utf-8")))
                except (UnicodeDecodeError, ValueError) as exc:
                    reason = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
                    self.problems.say(("cpuset", path), "%s: %s; ignored for the BE cpuset", path, reason)
                    continue
            if size:  # an empty v1 cpuset inherits nothing: it is not a limit
                sizes.append(size)
        return sizes

    def _quota(self) -> tuple[int, int]:
        version = self.env.cgroups.version
        quota_file = self.env.cgroup_file(self.be_dir, "cpu_quota")
        if version == 2:
            return parse(quota_file, lambda t: parse_cpu_quota(t, 2))
        period_text = read_bounded(self.env.cgroup_file(self.be_dir, "cpu_period"))
        return parse(quota_file, lambda t: parse_cpu_quota(t, 1, period_text))

    def collect(self, now: float) -> Samples:
        out = Samples(now)
        version = self.env.cgroups.version
        try:
            ns = self.env.read_cgroup(self.be_dir, "cpuacct_usage", lambda t: cgroup_cpu_ns(t, version))
        except FileProblem as exc:
            self.problems.say(("usage", exc.reason), "BE usage: %s; no sample", exc)
        else:
            rate = self.rates.rate("be", ns, now, f"CPU time of {self.be_dir}")
            if rate is not None:
                out.add(k.NODE_BE, _be_labels(k.BE_ALLOCATION_USAGE), rate / 1e6)
        try:
            limit = real_limit_milli(self._cpuset_sizes(), *self._quota())
        except FileProblem as exc:
            self.problems.say(("limit", exc.reason), "BE real limit: %s; no sample", exc)
        else:
            if limit is not None:
                out.add(k.NODE_BE, _be_labels(k.BE_ALLOCATION_REAL_LIMIT), limit)
        if self.env.pods.has_synced():
            request = sum(self._batch_cpu_request(pod) for pod in self.env.all_pods()
                          if pod.running and pod.koord_qos is KoordQoS.BE)
            out.add(k.NODE_BE, _be_labels(k.BE_ALLOCATION_REQUEST), request)
        return out

    def _batch_cpu_request(self, pod: PodMeta) -> int:
        """A BE pod's batch-cpu requests: from the container's requests when the pod source
        knows them (kubelet), else from the extended-resource-spec annotation (CRI)."""
        try:
            spec = parse_extended_resource_spec(pod.annotations)
        except HookError as exc:
            self.problems.say(("spec", pod.uid), "pod %s/%s: %s; its batch-cpu request counts as 0",
                                 pod.namespace, pod.name, exc)
            spec = {}
        total = 0
        for c in pod.containers:
            if BATCH_CPU in c.requests:
                total += int(c.requests[BATCH_CPU])
            elif c.name in spec:
                total += spec[c.name].cpu_request_milli or 0
        return total

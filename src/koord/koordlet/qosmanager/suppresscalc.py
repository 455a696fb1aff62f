"""CPU suppress arithmetic: how much CPU BE pods may have, and as which cpus or quota.

Pure functions, so every rule is a table of cases; the BECPUSuppress strategy only feeds
them and writes their answers.

    suppress = capacity x threshold% - non-BE pods' usage - non-BE host apps' usage
               - max(node usage - all pods - all host apps, 0, reserved)

raised to capacity x minPercent% when NodeSLO sets ``cpuSuppressMinPercent``; it may be
negative before that. ``capacity`` is the Node's ``status.capacity.cpu`` (not allocatable).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..slo import HostApp
from ..statesinformer import PodMeta
from .nodeinfo import Processor, is_be

CFS_PERIOD = 100000
BE_MIN_QUOTA = 2000
BE_MIN_CPUSET_CPUS = 2
BYPASS_DELTA_RATIO = 0.01
MAX_INCREASE_RATIO = 0.1
UNLIMITED = -1


@dataclass(frozen=True)
class Suppress:
    """The result and its parts (cores), so a log line can show the formula with numbers."""

    milli: int
    capacity_milli: int
    threshold_percent: int
    non_be_pods: float
    non_be_host_apps: float
    system: float
    be_pods: float

    def explain(self) -> str:
        return (f"suppress {self.milli}m = {self.capacity_milli}m x {self.threshold_percent}% "
                f"- non-BE pods {self.non_be_pods:.3f} - non-BE host apps "
                f"{self.non_be_host_apps:.3f} - system {self.system:.3f} cores")


def calculate_suppress(*, capacity_milli: int, reserved_milli: int, node_used: float,
                       pod_used: Mapping[str, float], pods: Sequence[PodMeta],
                       host_apps: Sequence[HostApp], host_app_used: Mapping[str, float],
                       threshold_percent: int, min_percent: int | None) -> Suppress:
    """The formula above. A pod with a metric but no PodMeta counts as non-BE (it may be a
    pod the informer has not listed yet; assuming BE would starve LS pods)."""
    by_uid = {p.uid: p for p in pods}
    non_be = all_pods = 0.0
    for uid, used in pod_used.items():
        all_pods += used
        pod = by_uid.get(uid)
        if pod is None or not is_be(pod):
            non_be += used
    non_be_apps = all_apps = 0.0
    for app in host_apps:
        app_used = host_app_used.get(app.name)
        if app_used is None:
            continue
        all_apps += app_used
        if not app.is_be:
            non_be_apps += app_used
    system = max(node_used - all_pods - all_apps, 0.0, reserved_milli / 1000)
    milli = (capacity_milli * threshold_percent // 100 - int(non_be * 1000)
             - int(non_be_apps * 1000) - int(system * 1000))
    if min_percent is not None:
        milli = max(milli, capacity_milli * min_percent // 100)
    return Suppress(milli, capacity_milli, threshold_percent, non_be, non_be_apps, system, all_pods - non_be)


def cfs_quota_target(suppress_milli: int, capacity_cores: int, current: int) -> int | None:
    """The besteffort quota to write, or None to leave it (change under 1% of the node).

    Decreases apply at once; increases by at most 10% of the node per tick, except from
    unlimited (-1), which goes straight to the target: stepping up from -1 would produce a
    tiny quota the kernel may refuse while BE pods exist.
    """
    target = max(suppress_milli * CFS_PERIOD // 1000, BE_MIN_QUOTA)
    bypass = capacity_cores * CFS_PERIOD * BYPASS_DELTA_RATIO
    if abs(target - current) < bypass and target != BE_MIN_QUOTA:
        return None
    step = capacity_cores * CFS_PERIOD * MAX_INCREASE_RATIO
    if target - current > step and current != UNLIMITED:
        target = current + int(step)
    return target


def pick_cpus(n: int, candidates: Sequence[Processor]) -> list[int]:
    """``n`` cpus spread over NUMA nodes/sockets and stacked on hyper-thread siblings.

    Candidates are bucketed per (NUMA node, socket); buckets are visited round robin, the
    largest first. First whole cores (two siblings with the same core id, adjacent after
    sorting by core then cpu id) are taken, one per bucket per round, while two or more are
    needed; then single cpus. A round that takes nothing ends a phase. Fewer candidates
    than ``n``: nothing (the caller keeps the current set).
    """
    total = len(candidates)
    if n <= 0 or total < n:
        return []
    buckets: dict[int, list[Processor]] = {}
    for p in candidates:
        buckets.setdefault((p.node + total) * (p.socket + 1), []).append(p)
    ordered = [sorted(b, key=lambda p: (p.core, p.cpu)) for b in buckets.values()]
    ordered.sort(key=lambda b: (-len(b), b[0].cpu))
    picked: list[int] = []
    used: set[int] = set()
    need = n
    i, previous = 0, -1
    while need > 1:
        if i == 0:
            if previous == need:
                break
            previous = need
        bucket = ordered[i]
        for j in range(len(bucket) - 1):
            if bucket[j].cpu in used:
                continue
            if bucket[j].core == bucket[j + 1].core:
                picked += [bucket[j].cpu, bucket[j + 1].cpu]
                used.update((bucket[j].cpu, bucket[j + 1].cpu))
                need -= 2
                break
        i = (i + 1) % len(ordered)
    start, previous = i, -1
    while need > 0:
        if i == start:
            if previous == need:
                break
            previous = need
        for p in ordered[i]:
            if p.cpu not in used:
                picked.append(p.cpu)
                used.add(p.cpu)
                need -= 1
                break
        i = (i + 1) % len(ordered)
    return picked


def cpuset_target(suppress_milli: int, processors: Sequence[Processor], old: set[int],
                  excluded: set[int], lse_cpus: set[int], lsr_cpus: set[int]) -> list[int]:
    """The BE cpus for the cpuset policy; empty means "write nothing".

    ``excluded``: reserved and exclusive system-QoS cpus. Cpus bound to LSE pods are never
    given to BE; those bound to LSR pods are shared in proportion to their share of the
    candidates. At least 2 cpus; growth limited to 10% of the node's cpus per tick.
    When no cpu at all is left (everything reserved or LSE) the answer is empty where
    upstream divides by zero.
    """
    lsr: list[Processor] = []
    ls: list[Processor] = []
    for p in processors:
        if p.cpu in excluded or p.cpu in lse_cpus:
            continue
        (lsr if p.cpu in lsr_cpus else ls).append(p)
    if not lsr and not ls:
        return []
    n = max(math.ceil(suppress_milli / 1000), BE_MIN_CPUSET_CPUS)
    max_increase = math.ceil(len(processors) * MAX_INCREASE_RATIO)
    if n - len(old) > max_increase:
        n = len(old) + max_increase
    lsr_n = n * len(lsr) // (len(lsr) + len(ls))
    picked: list[int] = []
    if lsr_n > 0:
        picked += pick_cpus(lsr_n, lsr)
    if n - lsr_n > 0:
        picked += pick_cpus(n - lsr_n, ls)
    return picked


def be_pool(processors: Sequence[Processor], excluded: set[int], lse_cpus: set[int]) -> list[int]:
    """Where BE pods may run when not suppressed: all cpus but reserved, system-QoS
    exclusive and LSE-bound ones."""
    return sorted(p.cpu for p in processors if p.cpu not in excluded and p.cpu not in lse_cpus)

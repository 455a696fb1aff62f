"""Hook answer -> hook request (merge), hook request -> CRI request, and answer validation.

Every rule about what a plugin may change lives here, once (hook requests are built from
CRI by ``koord.hookapi.fromcri``, shared with koordlet):

* ``merge_pod_response`` / ``merge_container_response`` fold one plugin's answer into the
  hook request (so the next plugin sees it) and return the names of the fields that changed.
* ``apply_to_*`` write the final hook request back into the CRI request.
* ``validate_*`` reject an answer before it can reach the backend.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from cri_api.v1 import api_pb2 as cri

from koord import cgrouplimits
from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord.hookapi import ContainerHookRequest, PodHookRequest, parse_cpuset
from koord.hookapi.fromcri import to_cri_resources

# ---------------------------------------------------------------- merge rules

def merge_resources(dst: hook.LinuxContainerResources, src: hook.LinuxContainerResources,
                    prefix: str) -> list[str]:
    """Upstream koord's merge rules: zero means "not specified"."""
    changed: list[str] = []

    def take(name: str, wanted: bool) -> None:
        value = getattr(src, name)
        if wanted and getattr(dst, name) != value:
            setattr(dst, name, value)
            changed.append(f"{prefix}.{name}")

    take("cpu_period", src.cpu_period > 0)
    take("cpu_quota", src.cpu_quota != 0)
    take("cpu_shares", src.cpu_shares > 0)
    take("memory_limit_in_bytes", src.memory_limit_in_bytes > 0)
    take("memory_swap_limit_in_bytes", src.memory_swap_limit_in_bytes > 0)
    take("oom_score_adj", src.oom_score_adj != 0 and -1000 <= src.oom_score_adj <= 1000)
    take("cpuset_cpus", src.cpuset_cpus != "")
    take("cpuset_mems", src.cpuset_mems != "")
    if src.hugepage_limits and list(src.hugepage_limits) != list(dst.hugepage_limits):
        del dst.hugepage_limits[:]
        dst.hugepage_limits.extend(src.hugepage_limits)
        changed.append(f"{prefix}.hugepage_limits")
    changed += merge_map(dst.unified, src.unified, f"{prefix}.unified")
    return changed


def merge_map(dst, src, prefix: str) -> list[str]:  # protobuf map fields have no common public type
    changed = []
    for key, value in sorted(src.items()):
        if dst.get(key) != value:
            dst[key] = value
            changed.append(f"{prefix}[{key}]")
    return changed


def merge_pod_response(req: PodHookRequest, resp: hook.PodSandboxHookResponse) -> list[str]:
    changed = merge_map(req.labels, resp.labels, "labels")
    changed += merge_map(req.annotations, resp.annotations, "annotations")
    if resp.cgroup_parent and resp.cgroup_parent != req.cgroup_parent:
        req.cgroup_parent = resp.cgroup_parent
        changed.append("cgroup_parent")
    if resp.HasField("resources"):
        changed += merge_resources(req.resources, resp.resources, "resources")
    return changed


def merge_container_response(req: ContainerHookRequest, resp: hook.ContainerResourceHookResponse) -> list[str]:
    changed = merge_map(req.container_annotations, resp.container_annotations, "container_annotations")
    if resp.HasField("container_resources"):
        changed += merge_resources(req.container_resources, resp.container_resources, "container_resources")
    if resp.pod_cgroup_parent and resp.pod_cgroup_parent != req.pod_cgroup_parent:
        req.pod_cgroup_parent = resp.pod_cgroup_parent
        changed.append("pod_cgroup_parent")
    changed += merge_map(req.container_envs, resp.container_envs, "container_envs")
    return changed


# ---------------------------------------------------------------- hook request -> CRI

def apply_to_run_pod_sandbox(req: cri.RunPodSandboxRequest, final: PodHookRequest) -> None:
    cfg = req.config
    _replace_map(cfg.labels, final.labels)
    _replace_map(cfg.annotations, final.annotations)
    cfg.linux.cgroup_parent = final.cgroup_parent
    if final.HasField("resources"):
        cfg.linux.resources.CopyFrom(to_cri_resources(final.resources))


def apply_to_create_container(req: cri.CreateContainerRequest, final: ContainerHookRequest) -> None:
    cfg = req.config
    _replace_map(cfg.annotations, final.container_annotations)
    if final.HasField("container_resources"):
        cfg.linux.resources.CopyFrom(to_cri_resources(final.container_resources))
    merge_envs(cfg.envs, final.container_envs)
    if final.pod_cgroup_parent != req.sandbox_config.linux.cgroup_parent:
        req.sandbox_config.linux.cgroup_parent = final.pod_cgroup_parent


def apply_to_update_resources(req: cri.UpdateContainerResourcesRequest, final: ContainerHookRequest) -> None:
    if final.HasField("container_resources"):
        req.linux.CopyFrom(to_cri_resources(final.container_resources))
    for key, value in final.container_annotations.items():
        if key in req.annotations:
            req.annotations[key] = value


def merge_envs(envs, wanted) -> None:
    """Keeps the original order, updates values in place, appends new keys sorted.

    Upstream replaces the whole list from a map and loses order, which breaks
    ``$(VAR)`` references between envs.
    """
    seen = set()
    for kv in envs:
        seen.add(kv.key)
        if kv.key in wanted and kv.value != wanted[kv.key]:
            kv.value = wanted[kv.key]
    for key in sorted(k for k in wanted if k not in seen):
        envs.add(key=key, value=wanted[key])


def _replace_map(dst, src) -> None:
    if dict(dst) != dict(src):
        dst.clear()
        dst.update(src)


# ---------------------------------------------------------------- validation

# What runc will write each field into; 0 is "not specified" and never checked.
_KERNEL_LIMITS = (
    ("cpu_period", cgrouplimits.Kind.PERIOD),
    ("cpu_quota", cgrouplimits.Kind.QUOTA),
    ("cpu_shares", cgrouplimits.Kind.SHARES),
    ("memory_limit_in_bytes", cgrouplimits.Kind.MEMORY),
    ("memory_swap_limit_in_bytes", cgrouplimits.Kind.MEMORY),
    ("oom_score_adj", cgrouplimits.Kind.OOM_SCORE_ADJ),
)
_UNIFIED_KEY = re.compile(r"^[a-z][a-z0-9_]*\.[a-z0-9_.]+$")
_ENV_KEY_FORBIDDEN = re.compile(r"[=\x00]")
_PAGE_SIZE = re.compile(r"[0-9]{1,6}[KMGTP]B\Z")


def validate_resources(res: hook.LinuxContainerResources, prefix: str) -> list[str]:
    problems = []
    for name, kind in _KERNEL_LIMITS:
        value = getattr(res, name)
        why = cgrouplimits.problem(kind, value) if value else None  # 0 means "not specified"
        if why:
            problems.append(f"{prefix}.{name}: {why}")
    for name in ("cpuset_cpus", "cpuset_mems"):
        value = getattr(res, name)
        if value:
            try:
                parse_cpuset(value)
            except ValueError as exc:
                problems.append(f"{prefix}.{name} is not a cpu list like 0-3,5: {exc}")
    for key in res.unified:
        if not _UNIFIED_KEY.match(key):
            problems.append(f"{prefix}.unified key {key!r} is not a cgroup v2 file name like memory.max")
    for limit in res.hugepage_limits:
        if not _PAGE_SIZE.match(limit.page_size):
            problems.append(f"{prefix}.hugepage_limits page_size {limit.page_size!r} is not like 2MB or 1GB")
    return problems


def _validate_cgroup_parent(value: str, name: str) -> list[str]:
    if value and (".." in value.split("/") or "\x00" in value):
        return [f"{name} {value!r} must not contain '..' or NUL"]
    return []


def _validate_map_keys(keys: Iterable[str], name: str) -> list[str]:
    return [f"{name} has an empty key" for k in keys if not k][:1]


def validate_pod_response(resp: hook.PodSandboxHookResponse) -> list[str]:
    problems = _validate_map_keys(resp.labels, "labels") + _validate_map_keys(resp.annotations, "annotations")
    problems += _validate_cgroup_parent(resp.cgroup_parent, "cgroup_parent")
    if resp.HasField("resources"):
        problems += validate_resources(resp.resources, "resources")
    return problems


def validate_container_response(resp: hook.ContainerResourceHookResponse) -> list[str]:
    problems = _validate_map_keys(resp.container_annotations, "container_annotations")
    problems += _validate_cgroup_parent(resp.pod_cgroup_parent, "pod_cgroup_parent")
    if resp.HasField("container_resources"):
        problems += validate_resources(resp.container_resources, "container_resources")
    for key in resp.container_envs:
        if not key or _ENV_KEY_FORBIDDEN.search(key):
            problems.append(f"container_envs key {key!r} must be non-empty and contain no '=' or NUL")
    return problems

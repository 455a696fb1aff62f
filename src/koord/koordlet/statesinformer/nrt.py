"""NodeResourceTopology reporting (upstream gate ``NodeTopologyReport``, on by default).

Every ``--node-topology-sync-interval`` the topology (``topology.py``) is computed from
the metric cache's CPU/NUMA info, the kubelet's ``/configz`` (unless
``--disable-query-kubelet-config``), ``<--var-lib-kubelet-dir>/cpu_manager_state``, the
Node and the pods. The result is kept locally (``StatesInformer.get_node_topo``, the
source of the cpuset pools and the kubelet policy for CPUSetAllocator, BECPUSuppress and
the reconciler, as upstream) and, with the gate on, written: to the API server (created
when absent, updated only when what koordlet owns changed, re-read on a conflict) or, in
standalone mode, to ``--node-topology-file``. As upstream, a round whose inputs are not
all there (no Node yet, no CPU info yet, the kubelet not answering) is skipped.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

import yaml

from koord import documents
from koord.logonce import LogOnce

from ..metriccache import kinds
from .kubelet import KubeletPodsSource
from .objects import api_status, parse_object
from .pods import PodsUnavailable
from .topology import changed, compute, new_nrt, updated
from .topologyinputs import KubeletConfig, TopologyError, kubelet_config_of

log = logging.getLogger(__name__)

NRT_GROUP, NRT_VERSION, NRT_PLURAL = "topology.node.k8s.io", "v1alpha1", "noderesourcetopologies"
STATE_FILE = "cpu_manager_state"
MAX_CONFIGZ_BYTES = 1024 * 1024


class NRTWriter(Protocol):
    def describe(self) -> str: ...
    def write(self, node: dict, status: Any) -> dict | None: ...


def _as_dict(obj: Any) -> dict:
    if not isinstance(obj, dict):
        raise TopologyError(f"the API server answered a {type(obj).__name__}, not an object")
    return obj


class KubeNRTWriter:
    """Create-if-absent and update of this node's NodeResourceTopology in the API server."""

    def __init__(self, api_client: Any, node_name: str) -> None:
        from kubernetes import client

        self.node_name = node_name
        self._custom = client.CustomObjectsApi(api_client)
        self._host = api_client.configuration.host
        self._current: dict | None = None
        self._not_served = False

    def describe(self) -> str:
        return f"API server {self._host} (noderesourcetopologies/{self.node_name})"

    def _get_or_create(self, node: dict) -> dict:
        try:
            return _as_dict(self._custom.get_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL,
                                                                   self.node_name, _request_timeout=30))
        except Exception as exc:
            if api_status(exc) != 404:
                raise
        created = _as_dict(self._custom.create_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL,
                                                                     new_nrt(node), _request_timeout=30))
        log.info("NodeResourceTopology %s created", self.node_name)
        return created

    def write(self, node: dict, status: Any) -> dict | None:
        """The object as stored after this round, None when nothing could be read or written."""
        try:
            for attempt in range(2):
                if self._current is None or attempt:
                    self._current = self._get_or_create(node)
                reason = changed(status, self._current)
                if reason is None:
                    return self._current
                body = updated(status, self._current)
                try:
                    self._current = _as_dict(self._custom.replace_cluster_custom_object(
                        NRT_GROUP, NRT_VERSION, NRT_PLURAL, self.node_name, body, _request_timeout=30))
                    log.info("NodeResourceTopology %s updated: %s", self.node_name, reason)
                    return self._current
                except Exception as exc:
                    if api_status(exc) != 409:
                        raise
        except Exception as exc:
            if api_status(exc) == 404:  # the CRD is not installed
                if not self._not_served:
                    log.warning("the API server does not serve NodeResourceTopology (CRD not installed?): "
                                "not reported; trying again every round")
                    self._not_served = True
                return None
            log.error("NodeResourceTopology %s: %s", self.node_name, exc)
            self._current = None
            return None
        return None


class FileNRTWriter:
    """Standalone mode: the object in a YAML/JSON file, rewritten atomically when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def describe(self) -> str:
        return f"file {self.path}"

    def write(self, node: dict, status: Any) -> dict | None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(documents.MAX_BYTES + 1)
            current = parse_object(raw, self.path, "NodeResourceTopology")
        except FileNotFoundError:
            current = new_nrt(node)
        except (OSError, ValueError) as exc:
            log.error("NodeResourceTopology file %s: %s; not rewritten", self.path, exc)
            return None
        if changed(status, current) is None:
            return current
        new = updated(status, current)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(new, f, sort_keys=False)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("NodeResourceTopology file %s: cannot write: %s", self.path, exc)
            return None
        return new


class NodeTopologyReporter:
    def __init__(self, informer: Any, metric_cache: Any, *, interval: float, var_lib_kubelet: Path,
                 proc_root: Path, sys_root: Path, sys_fs_root: Path,
                 kubelet: KubeletPodsSource | None, writer: NRTWriter | None) -> None:
        self.informer = informer
        self.metric_cache = metric_cache
        self.interval = interval
        self.state_path = Path(var_lib_kubelet) / STATE_FILE
        self.proc_root, self.sys_root, self.sys_fs_root = Path(proc_root), Path(sys_root), Path(sys_fs_root)
        self.kubelet = kubelet
        self.writer = writer
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._said = LogOnce(log)

    def start(self) -> None:
        where = self.writer.describe() if self.writer is not None else "kept locally only"
        log.info("NodeResourceTopology every %.3gs: %s", self.interval, where)
        self._thread = threading.Thread(target=self._run, name="node-topology", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.report_once()
            except Exception:  # a bug must not end the reporter's thread silently
                log.exception("NodeResourceTopology round failed")
            self._stopping.wait(self.interval)

    def _skip(self, why: str) -> None:
        """Logs why a round was skipped, once per reason."""
        self._said.say("skip", f"NodeResourceTopology not computed: {why}")

    def kubelet_config(self) -> KubeletConfig | None:
        assert self.kubelet is not None
        return kubelet_config_of(self.kubelet.fetch("/configz", MAX_CONFIGZ_BYTES))

    def cpu_manager_state(self) -> bytes | None:
        try:
            with open(self.state_path, "rb") as f:
                data = f.read(4 * 1024 * 1024 + 1)
        except FileNotFoundError:
            return None
        if len(data) > 4 * 1024 * 1024:
            raise TopologyError(f"{self.state_path}: larger than 4 MiB")
        return data

    def report_once(self) -> dict | None:
        if not self.informer.has_synced():  # upstream waits for the Node and the pods too
            self._skip("the states informer has not synced the Node and the pods yet")
            return None
        node = self.informer.get_node()
        if node is None:
            self._skip("no Node object yet")
            return None
        cpu_info = self.metric_cache.get_kv(kinds.NODE_CPU_INFO)
        numa_info = self.metric_cache.get_kv(kinds.NODE_NUMA_INFO)
        if cpu_info is None or numa_info is None:
            self._skip("no CPU and NUMA info in the metric cache yet")
            return None
        try:
            kubelet = self.kubelet_config() if self.kubelet is not None else None
            status = compute(node=node, pods=self.informer.get_all_pods(), cpu_info=cpu_info,
                             numa_info=numa_info, basic_info=cpu_basic_info(self.proc_root, self.sys_root,
                                                                            self.sys_fs_root),
                             kubelet=kubelet, cpu_manager_state=self.cpu_manager_state() if kubelet else None)
        except (TopologyError, PodsUnavailable, OSError) as exc:
            self._skip(str(exc))
            return None
        if self._said.clear("skip"):
            log.info("NodeResourceTopology computed again")
        stored = self.writer.write(node, status) if self.writer is not None else None
        local = stored if stored is not None else updated(status, self.informer.get_node_topo() or new_nrt(node))
        self.informer.set_node_topo(local)
        return local


def _read_small(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(64 * 1024).decode(errors="replace")
    except OSError:
        return None


def cpu_basic_info(proc_root: Path, sys_root: Path, sys_fs_root: Path) -> dict:
    """``node.koordinator.sh/cpu-basic-info`` as upstream fills it (fields it cannot read
    stay out, as ``omitempty``): model and vendor from /proc/cpuinfo, SMT from sysfs,
    turbo from intel_pstate, the L3 CAT mask from resctrl."""
    info: dict[str, Any] = {}
    cpuinfo = _read_small(proc_root / "cpuinfo") or ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines()[:200]:
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    if fields.get("model name"):
        info["cpuModel"] = fields["model name"][:256]
    smt = (_read_small(sys_root / "devices/system/cpu/smt/active") or "").strip()
    if smt == "1":
        info["hyperThreadEnabled"] = True
    no_turbo = (_read_small(sys_root / "devices/system/cpu/intel_pstate/no_turbo") or "").strip()
    if no_turbo == "0":
        info["turboEnabled"] = True
    mask = (_read_small(sys_fs_root / "resctrl/info/L3/cbm_mask") or "").strip()
    if mask:
        info["catL3CbmMask"] = mask[:64]
    if fields.get("vendor_id"):
        info["vendorID"] = fields["vendor_id"][:64]
    return info


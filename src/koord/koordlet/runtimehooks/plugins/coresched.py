"""CoreSched: the CPU QoS of mainline kernels, NodeSLO ``cpuPolicy: coreSched``.

What this plugin does: ``cpu.idle`` of the kube-QoS dirs as upstream writes it, from each
class's ``schedIdle`` (``kubepods/besteffort`` 1 when BE's schedIdle is 1, ``burstable`` and
``kubepods`` from LS's / LSR's, 0 under any other policy, so turning the policy off undoes
it), through the reconciler's kube-QoS level. SCHED_IDLE groups yield the cpu to every
non-idle sibling at once, which is what protects LS pods from BE ones without group identity.

Core-scheduling cookies (prctl PR_SCHED_CORE) are not assigned: when a class enables core
scheduling, koordlet probes the kernel once and says in one line whether it supports it.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os

from ..hooks import Hooks, PluginEnv, RuntimePlugin
from ..protocol import KubeQoS, Resources
from ..rule import Rules

log = logging.getLogger(__name__)

PR_SCHED_CORE, PR_SCHED_CORE_GET = 62, 0
PIDTYPE_PID = 0


def core_sched_support() -> tuple[bool, str]:
    """Asks the kernel for this process's core-scheduling cookie: (supported, why not)."""
    libc = ctypes.CDLL(None, use_errno=True)
    cookie = ctypes.c_uint64(0)
    if libc.prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, os.getpid(), PIDTYPE_PID, ctypes.byref(cookie)) == 0:
        return True, ""
    err = ctypes.get_errno()
    return False, f"prctl(PR_SCHED_CORE) failed with {errno.errorcode.get(err, err)} (no CONFIG_SCHED_CORE?)"


class CoreSched(RuntimePlugin):
    name = "CoreSched"

    def __init__(self, env: PluginEnv) -> None:
        super().__init__(env)
        self.probe = core_sched_support
        self._said: set[str] = set()

    def register(self, hooks: Hooks) -> None:
        """No hook stage: cpu.idle lives at the kube-QoS level, which the reconciler writes."""

    def update_rules(self, rules: Rules) -> bool:
        changed = super().update_rules(rules)
        if changed and rules.core_sched is not None and rules.core_sched.enabled and "probe" not in self._said:
            self._said.add("probe")
            supported, why = self.probe()
            if supported:
                log.info("plugin %s: the kernel supports core scheduling; koordlet does not assign "
                         "cookies yet: only cpu.idle is applied", self.name)
            else:
                log.warning("plugin %s: core scheduling is not supported by this kernel: %s; "
                            "cpu.idle is still applied, pods start as usual", self.name, why)
        return changed

    def kube_qos_resources(self, qos: KubeQoS) -> Resources | None:
        if self.rules is None or self.rules.core_sched is None:
            return None
        qos_dir = self.env.executor.kube_qos_dir(qos)
        if not self.env.executor.supports(qos_dir, "cpu_idle"):
            if "no-file" not in self._said and self.env.executor.supports(qos_dir, "cpu_shares"):
                self._said.add("no-file")
                log.warning("plugin %s: this kernel has no cpu.idle (Linux 5.15+): not set", self.name)
            return None
        return Resources(cpu_idle=self.rules.core_sched.kube_qos_cpu_idle(qos))

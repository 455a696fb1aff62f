"""Test infrastructure: a private containerd, a kubelet-like CRI client, the proxy as a subprocess,
an in-memory CRI backend, short socket dirs and one way to stop a daemon.

Shipped inside the package (not under tests/) so benchmarks and other packages'
tests can drive the same real components.
"""

import importlib
from typing import Any

_EXPORTS = {
    "Cgroup": "cgroups", "cgroup_version": "cgroups",
    "Containerd": "containerd", "containerd_binaries_present": "containerd",
    "FakeCRI": "fakecri",
    "DEFAULT_REF": "image", "build_pause_image": "image",
    "KubeletClient": "kubelet", "pod_cgroup_parent": "kubelet",
    "stop_process": "processes",
    "RuntimeProxy": "proxy",
    "make_short_socket_dir": "sockets", "short_socket_dir": "sockets",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """The names above, imported on first use: a program that needs one submodule (the runc
    wrapper containerd starts for every container) does not pay for gRPC and the rest."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)

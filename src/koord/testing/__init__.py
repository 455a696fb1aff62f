"""Test infrastructure: a private containerd, a kubelet-like CRI client, the proxy as a subprocess,
an in-memory CRI backend, short socket dirs and one way to stop a daemon.

Shipped inside the package (not under tests/) so benchmarks and other packages'
tests can drive the same real components.
"""

from koord.testing.cgroups import Cgroup, cgroup_version
from koord.testing.containerd import Containerd, containerd_binaries_present
from koord.testing.fakecri import FakeCRI
from koord.testing.image import DEFAULT_REF, build_pause_image
from koord.testing.kubelet import KubeletClient, pod_cgroup_parent
from koord.testing.processes import stop_process
from koord.testing.proxy import RuntimeProxy
from koord.testing.sockets import make_short_socket_dir, short_socket_dir

__all__ = [
    "DEFAULT_REF",
    "Cgroup",
    "Containerd",
    "FakeCRI",
    "KubeletClient",
    "RuntimeProxy",
    "build_pause_image",
    "cgroup_version",
    "containerd_binaries_present",
    "make_short_socket_dir",
    "pod_cgroup_parent",
    "short_socket_dir",
    "stop_process",
]

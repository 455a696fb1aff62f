"""Test infrastructure: a private containerd, a kubelet-like CRI client, the proxy as a subprocess.

Shipped inside the package (not under tests/) so benchmarks and other packages'
tests can drive the same real components.
"""

from koord.testing.containerd import Containerd, containerd_binaries_present
from koord.testing.image import DEFAULT_REF, build_pause_image
from koord.testing.kubelet import KubeletClient, container_cgroup_dir, pod_cgroup_parent, read_cgroup
from koord.testing.proxy import RuntimeProxy

__all__ = [
    "DEFAULT_REF",
    "Containerd",
    "KubeletClient",
    "RuntimeProxy",
    "build_pause_image",
    "container_cgroup_dir",
    "containerd_binaries_present",
    "pod_cgroup_parent",
    "read_cgroup",
]

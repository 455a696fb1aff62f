"""The Docker-mode demo: a private dockerd, koord-runtime-proxy in Docker mode in front of it,
koordlet's runtime hooks registered with the proxy, and cri-dockerd (kubelet's side) pointed
at the proxy.  Pods started through cri-dockerd the way kubelet would show koordlet's answers
in ``docker inspect`` and the real cgroup files.  Run with ``scripts/demo-docker.sh`` (as root).
"""

from __future__ import annotations

import json
import sys
import uuid
from contextlib import ExitStack

from koord.apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC, ANNOTATION_RESOURCE_STATUS, LABEL_POD_QOS
from koord_testing.demo import BATCH_SPEC, say, start_koordlet
from koord_testing.demo import show as show_cgroup
from koord_testing.docker import CriDockerd, Dockerd, DockerKubeletClient
from koord_testing.processes import stop_process
from koord_testing.proxy import RuntimeProxy
from koord_testing.sockets import make_short_socket_dir


def show(dockerd: Dockerd, client: DockerKubeletClient, sandbox: str, container: str,
         fields: list[str], values: list[str]) -> None:
    host = dockerd.api("GET", f"/containers/{container}/json")[1]["HostConfig"]
    say("    docker inspect: " + ", ".join(f"HostConfig.{f} = {host.get(f)!r}" for f in fields))
    show_cgroup(client, sandbox, container, values)


def main() -> int:
    work = make_short_socket_dir("koord-demo-docker-")
    hook_dir = work / "hookserver.d"
    with ExitStack() as stack:
        say(f"starting a private dockerd under {work}")
        dockerd = Dockerd(work / "dockerd").start()
        stack.callback(dockerd.stop)
        proxy = RuntimeProxy(work / "proxy", dockerd.endpoint, hook_config_dir=hook_dir, docker=True).start()
        stack.callback(proxy.stop)
        say(f"koord-runtime-proxy (Docker mode) serves the Docker API on {proxy.endpoint}, "
            f"forwarding to {dockerd.endpoint}")
        cri = CriDockerd(work / "cri-dockerd", proxy.endpoint).start()
        stack.callback(cri.stop)
        say(f"cri-dockerd serves CRI on {cri.endpoint} with --docker-endpoint unix://{proxy.endpoint}")
        koordlet = start_koordlet(work, hook_dir, cri.endpoint)
        stack.callback(koordlet.wait, 15)
        stack.callback(stop_process, koordlet)
        kubelet = stack.enter_context(cri.client(dockerd.track_pod_cgroup))
        stack.callback(kubelet.cleanup)
        assert isinstance(kubelet, DockerKubeletClient)

        limit = {"cpu_period": 100000, "cpu_quota": 100000}
        say(f"LSR pod with {ANNOTATION_RESOURCE_STATUS}={{\"cpuset\":\"0\"}}: "
            "kubelet -> cri-dockerd -> proxy -> dockerd")
        sandbox = kubelet.run_pod("demo-lsr", uid=str(uuid.uuid4()), labels={LABEL_POD_QOS: "LSR"},
                                  annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0"})},
                                  qos="guaranteed")
        container = kubelet.run_container(sandbox, "app", dockerd.image, resources=limit)
        show(dockerd, kubelet, sandbox, container, ["CpusetCpus", "CpuQuota"],
             ["cpuset", "quota"])

        say("BE pod with batch resources 500m / 2Gi:")
        sandbox = kubelet.run_pod("demo-be", uid=str(uuid.uuid4()), labels={LABEL_POD_QOS: "BE"},
                                  annotations={ANNOTATION_EXTENDED_RESOURCE_SPEC: json.dumps(BATCH_SPEC)},
                                  qos="besteffort")
        container = kubelet.run_container(sandbox, "app", dockerd.image)
        show(dockerd, kubelet, sandbox, container, ["CpuShares", "CpuQuota", "Memory"],
             ["shares", "quota", "memory"])
        say("cleaning up")
    say(f"done; logs are in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

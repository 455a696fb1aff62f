"""koordlet's image (scripts/image.sh) in upstream's DaemonSet: the archive is imported into the
private containerd and loaded by a private dockerd, and the container of upstream's
``config/manager/koordlet.yaml`` (tests/data/upstream-manifests/manager-koordlet.yaml, as
upstream wrote it) runs from it as kubelet would start it: the spec's command, args, env,
privileged security context, host network and PID, resources and every volume mount. The
host paths are temp dirs except /sys (the machine's CPU topology), /dev and /etc/localtime;
the temp dirs sit on a shared mount, which Bidirectional propagation needs. What kubelet
adds to the spec's env, the in-cluster credentials, is a kubeconfig in the
``/etc/kubernetes`` volume named by ``KUBECONFIG`` (the test API server speaks plain HTTP).

The image is built once per session and cached under .cache/image, keyed by its inputs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from koord_testing import crds
from koord_testing.containerd import Containerd, unmount_all
from koord_testing.docker import Dockerd
from koord_testing.kubeapi import NODEMETRICS
from koord_testing.wait import wait_for

from .test_upstream_dropin import NODE, Machine, machine, ready  # noqa: F401 - machine is a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CHECKOUT = Path(__file__).resolve().parents[2]
SPEC = CHECKOUT / "tests" / "data" / "upstream-manifests" / "manager-koordlet.yaml"
REF = "docker.io/library/koordlet:latest"
INPUTS = ("scripts/image.sh", "scripts/debian-mirror.sh", "requirements.lock", "pyproject.toml", "README.md",
          "LICENSE")
MiB = 1024 * 1024


def inputs_key() -> str:
    """A hash of everything the image is built from."""
    sha = hashlib.sha256()
    paths = [CHECKOUT / name for name in INPUTS]
    paths += sorted(p for p in (CHECKOUT / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in paths:
        sha.update(str(path.relative_to(CHECKOUT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()[:16]


@pytest.fixture(scope="module")
def image(pytestconfig: pytest.Config) -> Path:
    archive = CHECKOUT / ".cache" / "image" / inputs_key() / "koordlet-image.tar"
    if not archive.exists():
        for stale in archive.parent.parent.glob("*"):  # images of other inputs
            shutil.rmtree(stale, ignore_errors=True)
        capture = pytestconfig.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print(f"\nbuilding koordlet's image with scripts/image.sh into {archive.parent} (about 2 minutes)",
                  flush=True)
            subprocess.run([str(CHECKOUT / "scripts" / "image.sh"), str(archive.parent)], check=True, timeout=900)
    return archive


def layer_members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as outer:
        [entry] = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        [layer] = entry["Layers"]
        with tarfile.open(fileobj=outer.extractfile(layer), mode="r:gz") as inner:
            return {m.name: m for m in inner.getmembers()}


def test_image_holds_koordlet_and_not_what_a_node_agent_does_not_need(image: Path) -> None:
    members = layer_members(image)
    assert members["koordlet"].mode & 0o111 and members["koordlet"].isreg()
    assert "opt/koordlet/lib/koord/koordlet/cli.py" in members
    unwanted = ("usr/bin/gcc", "usr/bin/cc", "usr/bin/apt", "usr/bin/apt-get",
                "usr/lib/x86_64-linux-gnu/libperl.so.5.36",  # perl; perl-base, which dpkg needs, stays
                "opt/koordlet/lib/koord_testing", "opt/koordlet/lib/koord/demo.py", "opt/koordlet/lib/kubernetes/aio")
    assert [name for name in unwanted if name in members] == []
    for prefix in ("usr/share/man/", "usr/share/locale/", "var/lib/apt/lists/", "usr/lib/gcc/"):
        assert not [m for m in members if m.startswith(prefix) and not m.endswith("/")], prefix
    docs = [m for m in members if m.startswith("usr/share/doc/") and members[m].isreg()]
    assert docs and all(m.endswith("/copyright") for m in docs)
    with tarfile.open(image) as outer:
        [entry] = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(outer.extractfile(entry["Config"]))  # type: ignore[arg-type]
    assert config["config"]["Entrypoint"] == ["/koordlet"]
    assert "agent_mode=dsMode" in config["config"]["Env"]
    assert entry["RepoTags"] == [REF]


def test_docker_loads_the_archive(image: Path, short_socket_dir: Path) -> None:
    with Dockerd(short_socket_dir / "docker") as dockerd:
        dockerd.load_image(image)
        [inspect] = json.loads(dockerd.cli("image", "inspect", REF).stdout)
    assert inspect["Config"]["Entrypoint"] == ["/koordlet"]
    assert "agent_mode=dsMode" in inspect["Config"]["Env"]


def upstream_container() -> tuple[dict, dict, dict]:
    """(the pod spec, its container, its volumes by name) of upstream's DaemonSet."""
    spec = yaml.safe_load(SPEC.read_text())["spec"]["template"]["spec"]
    [container] = spec["containers"]
    return spec, container, {v["name"]: v for v in spec["volumes"]}


# Host paths the container must see as they are; every other volume gets a temp dir.
REAL = {"/etc/localtime": "/etc/localtime", "/sys/": "/sys"}
PROPAGATION = {None: 0, "None": 0, "HostToContainer": 1, "Bidirectional": 2}


@pytest.fixture
def host_dirs(tmp_path: Path, machine: Machine) -> Iterator[dict[str, Path]]:  # noqa: F811
    """The volume name -> host path map, under a shared bind mount of a temp dir."""
    shared = tmp_path / "host"
    shared.mkdir()
    subprocess.run(["mount", "--bind", str(shared), str(shared)], check=True)
    subprocess.run(["mount", "--make-shared", str(shared)], check=True)
    try:
        _, _, volumes = upstream_container()
        dirs: dict[str, Path] = {}
        for name, volume in volumes.items():
            source = volume.get("hostPath", {}).get("path")
            if source in REAL:
                dirs[name] = Path(REAL[source])
            elif source == "/dev":  # the real /dev, bound where propagation can reach it
                dirs[name] = shared / "dev"
                dirs[name].mkdir()
                subprocess.run(["mount", "--rbind", "/dev", str(dirs[name])], check=True)
            elif source == "/sys/fs/cgroup/":
                dirs[name] = shared / "cgroup"
                dirs[name].mkdir()
                subprocess.run(["mount", "--bind", str(machine.cgroup), str(dirs[name])], check=True)
            elif source == "/var/lib/kubelet/":
                dirs[name] = shared / "kubelet"
                dirs[name].mkdir()
                subprocess.run(["mount", "--bind", str(machine.kubelet_dir), str(dirs[name])], check=True)
            else:
                dirs[name] = shared / name
                dirs[name].mkdir()
        yield dirs
    finally:
        unmount_all(shared)


def container_config(client, sandbox_config, host_dirs: dict[str, Path], env: dict[str, str]):
    """The CRI ContainerConfig kubelet makes of upstream's container."""
    pb = client.pb
    _, container, _ = upstream_container()
    config = client.container_config(sandbox_config, container["name"], REF, command=container["command"],
                                     args=container["args"], envs=env)
    for mount in container["volumeMounts"]:
        config.mounts.append(pb.Mount(container_path=mount["mountPath"], host_path=str(host_dirs[mount["name"]]),
                                      readonly=mount.get("readOnly", False),
                                      propagation=PROPAGATION[mount.get("mountPropagation")]))
    security = container["securityContext"]
    config.linux.security_context.privileged = security["privileged"]
    config.linux.security_context.capabilities.add_capabilities.extend(security["capabilities"]["add"])
    limits = container["resources"]["limits"]
    assert (limits["cpu"], limits["memory"]) == ("500m", "256Mi"), limits
    config.linux.resources.cpu_period, config.linux.resources.cpu_quota = 100_000, 50_000
    config.linux.resources.memory_limit_in_bytes = 256 * MiB
    return config


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as koordlet's server: TIME_WAIT is no owner
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def remove_image(containerd: Containerd) -> None:
    """The session's containerd is shared: other tests count its images."""
    with containerd.client() as client:
        client.image.RemoveImage(client.pb.RemoveImageRequest(image=client.pb.ImageSpec(image=REF)))


def test_upstream_daemonset_container_runs_the_image(image: Path, containerd: Containerd, machine: Machine,  # noqa: F811
                                                     host_dirs: dict[str, Path]) -> None:
    pod_spec, container, _ = upstream_container()
    assert container["command"] == ["/koordlet"] and pod_spec["hostNetwork"] and pod_spec["hostPID"]
    assert port_free(9316), "port 9316 (koordlet's default -addr, on the host network) is taken"
    containerd.import_image(image)
    api = machine.api
    api.crds = True
    api.put(NODEMETRICS, {"metadata": {"name": NODE}, "spec": {"metricCollectPolicy": {
        "aggregateDurationSeconds": 10, "reportIntervalSeconds": 2, "nodeAggregatePolicy": {"durations": ["16s"]}}}})
    api.write_kubeconfig(host_dirs["host-kubernetes"] / "kubeconfig")
    [node_name] = [e for e in container["env"] if e["name"] == "NODE_NAME"]
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    env = {"NODE_NAME": NODE, "KUBECONFIG": "/etc/kubernetes/kubeconfig"}

    with containerd.client() as client:
        try:
            sandbox = client.sandbox_config("koordlet", namespace="koordinator-system")
            sandbox.linux.security_context.privileged = True
            sandbox.linux.security_context.namespace_options.pid = client.pb.NamespaceMode.NODE
            sandbox_id = client.runtime.RunPodSandbox(client.pb.RunPodSandboxRequest(config=sandbox), timeout=240)\
                .pod_sandbox_id
            client.pods.append(sandbox_id)
            containerd.track_pod_cgroup(sandbox.linux.cgroup_parent)
            created = client.runtime.CreateContainer(client.pb.CreateContainerRequest(
                pod_sandbox_id=sandbox_id, config=container_config(client, sandbox, host_dirs, env),
                sandbox_config=sandbox), timeout=120)
            client.start_container(created.container_id)
            log_dir = Path(sandbox.log_directory)

            def logs() -> str:
                return "\n".join(p.read_text(errors="replace") for p in log_dir.rglob("*.log"))

            def running() -> bool:
                state = client.container_status(created.container_id).status.state
                assert state == client.pb.ContainerState.CONTAINER_RUNNING, f"koordlet exited:\n{logs()[-4000:]}"
                return True

            wait_for(lambda: running() and ready(9316), "/readyz 200 from the container", timeout=120)
            wait_for(lambda: running() and api.status_updates, "a NodeMetric status from the container", timeout=90)
            registration = json.loads((host_dirs["host-etc-hookserver"] / "koordlet.json").read_text())
        finally:
            containerd.remove_pods_of(client)
            remove_image(containerd)

    # The args name no registration dir: agent_mode=dsMode from the image put it in /host-etc-hookserver/.
    assert registration["remote-endpoint"] == "/var/run/koordlet//koordlet.sock"
    node_metric = api.objects[NODEMETRICS][NODE]
    assert crds.errors("NodeMetric", node_metric) == []
    assert "flag provided but not defined" not in logs()

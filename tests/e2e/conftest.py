"""Fixtures shared by the hook e2e tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from koord_testing.containerd import Containerd
from koord_testing.docker import docker_binaries_present
from koord_testing.kubelet import KubeletClient
from koord_testing.runtimes import resolve
from koord_testing.sockets import make_short_socket_dir

from .docker_rig import DockerEnv, DockerRig
from .fault_rig import fault_node, small_disk  # noqa: F401 - fixtures for the fault tests
from .plain_tree_rig import plain_tree_node  # noqa: F401 - a fixture for the fault tests
from .rig import Rig


@pytest.fixture
def rig(containerd: Containerd) -> Iterator[Rig]:
    instance = Rig(containerd)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture(scope="session")
def docker_env() -> Iterator[DockerEnv]:
    """One private dockerd and its cri-dockerds for the session; fails (never skips) when missing."""
    try:
        docker_binaries_present()
    except RuntimeError as err:
        pytest.fail(str(err), pytrace=False)
    env = DockerEnv(make_short_socket_dir("kde-"))
    try:
        yield env.start()
    finally:
        env.stop()


@pytest.fixture
def docker_rig(docker_env: DockerEnv) -> Iterator[DockerRig]:
    instance = DockerRig(docker_env)
    try:
        yield instance
    finally:
        instance.close()


CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def containerd2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    """A private containerd 2.x with NRI on, whatever ``$KOORD_TEST_CONTAINERD`` selects: the NRI
    tests need it (1.6 has no NRI) and fail, never skip, when it is missing."""
    try:
        runtime = resolve("2", CHECKOUT)
    except RuntimeError as err:
        pytest.fail(f"the NRI tests need containerd 2.x: {err}", pytrace=False)
    assert runtime.has_nri, f"{runtime.id} has no NRI"
    instance = Containerd(tmp_path_factory.mktemp("containerd-nri"), runtime=runtime)
    try:
        instance.start()
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def kubelet2(containerd2: Containerd) -> Iterator[KubeletClient]:
    client = containerd2.client()
    yield client
    containerd2.remove_pods_of(client)

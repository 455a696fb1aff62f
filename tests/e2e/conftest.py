"""Fixtures shared by the hook e2e tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from koord.testing.containerd import Containerd
from koord.testing.docker import docker_binaries_present
from koord.testing.sockets import make_short_socket_dir

from .docker_rig import DockerEnv, DockerRig
from .fault_rig import fault_node  # noqa: F401 - a fixture for the fault tests
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

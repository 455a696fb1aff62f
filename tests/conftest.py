"""Fixtures shared by all tests: a short socket dir; for e2e tests one private containerd per
session and a proxy per test.

The e2e fixtures fail (never skip) when the machine can't run them: a silently
skipped transparency suite would look like a passing one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from koord_testing.containerd import Containerd, containerd_binaries_present
from koord_testing.kubelet import KubeletClient
from koord_testing.proxy import RuntimeProxy
from koord_testing.runtimes import ContainerdRuntime, resolve, selection
from koord_testing.sockets import short_socket_dir as _short_socket_dir

# Property tests check what a parser accepts, never how fast: a machine busy with the
# end-to-end tests' containers must not turn a slow example into a failure.
settings.register_profile("koord", deadline=None)
settings.load_profile("koord")


def _require_e2e_machine() -> None:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root: they run containerd/runc and write cgroups", pytrace=False)
    try:
        containerd_binaries_present()
    except RuntimeError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture
def short_socket_dir() -> Iterator[Path]:
    """A private dir under /tmp whose socket paths fit the 107-byte limit (tmp_path's may not)."""
    with _short_socket_dir() as path:
        yield path


CHECKOUT = Path(__file__).resolve().parent.parent


def _runtime_params() -> list[object]:
    """One parameter per containerd build the run selects, its id naming the version; a build
    that cannot run becomes a parameter whose tests fail saying why (never a skip)."""
    params: list[object] = []
    for choice in selection():
        try:
            runtime = resolve(choice, CHECKOUT)
        except RuntimeError as err:
            params.append(pytest.param(err, id=f"containerd-{choice}-missing"))
        else:
            params.append(pytest.param(runtime, id=runtime.id))
    return params


@pytest.fixture(scope="session", params=_runtime_params())
def containerd_runtime(request: pytest.FixtureRequest) -> ContainerdRuntime:
    """The containerd build this test runs against: every e2e test that starts containerd runs
    once per selected build (``$KOORD_TEST_CONTAINERD``, see ``koord_testing.runtimes``)."""
    if isinstance(request.param, RuntimeError):
        pytest.fail(str(request.param), pytrace=False)
    runtime: ContainerdRuntime = request.param
    return runtime


@pytest.fixture(scope="session")
def containerd(tmp_path_factory: pytest.TempPathFactory, containerd_runtime: ContainerdRuntime) -> Iterator[Containerd]:
    _require_e2e_machine()
    instance = Containerd(tmp_path_factory.mktemp("containerd"), runtime=containerd_runtime)
    try:
        instance.start()
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def kubelet(containerd: Containerd) -> Iterator[KubeletClient]:
    client = containerd.client()
    yield client
    containerd.remove_pods_of(client)


@pytest.fixture
def data_plane() -> str:
    """The proxy fixture's --data-plane; a module that must pass on both overrides it with params."""
    return "auto"


@pytest.fixture
def proxy(containerd: Containerd, tmp_path: Path, data_plane: str) -> Iterator[RuntimeProxy]:
    instance = RuntimeProxy(tmp_path / "proxy", containerd.endpoint, hook_config_dir=tmp_path / "hookserver.d",
                            data_plane=data_plane)
    try:
        instance.start()
        yield instance
    finally:
        instance.stop()
        # Shown by pytest only when the test failed.
        print("--- runtime proxy log ---\n" + instance.logs(tail=200))


@pytest.fixture
def proxied_kubelet(containerd: Containerd, proxy: RuntimeProxy) -> Iterator[KubeletClient]:
    client = KubeletClient(
        proxy.endpoint, on_pod_created=containerd.track_pod_cgroup, log_root=containerd.workdir / "pod-logs"
    )
    yield client
    containerd.remove_pods_of(client)

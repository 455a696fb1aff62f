"""Fixtures shared by the hook e2e tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from koord.testing.containerd import Containerd

from .rig import Rig


@pytest.fixture
def rig(containerd: Containerd) -> Iterator[Rig]:
    instance = Rig(containerd)
    try:
        yield instance
    finally:
        instance.close()

"""Fixtures shared by koordlet's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from koord_testing.fakecri import FakeCRI


@pytest.fixture
def fake_cri(short_socket_dir: Path) -> Iterator[FakeCRI]:
    """A containerd-like CRI runtime service in memory, on a socket in a short private dir."""
    with FakeCRI(short_socket_dir / "cri.sock") as fake:
        yield fake

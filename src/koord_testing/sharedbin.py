"""Binaries built from upstream source for the tests and demos (crictl, cri-dockerd).

They live in ``shared/bin`` beside the project's checkout (``<checkout>/../shared/bin``), on a
developer's machine and in CI alike; ``$KOORD_SHARED_BIN`` names another directory. They are
not Debian packages, so nothing installs them: a missing one is an error that says where it
was looked for, never a skipped test.
"""

from __future__ import annotations

import os
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]  # src/koord_testing/sharedbin.py -> the checkout


def shared_bin_dir() -> Path:
    override = os.environ.get("KOORD_SHARED_BIN")
    return Path(override) if override else _CHECKOUT.parent / "shared" / "bin"


def shared_binary(name: str) -> Path:
    """The path of ``name`` in the shared bin dir (it may be missing: see ``missing_shared_binaries``)."""
    return shared_bin_dir() / name


def missing_shared_binaries(*names: str) -> list[str]:
    """The names whose binary is not an executable file in the shared bin dir, as paths."""
    return [str(shared_binary(n)) for n in names if not os.access(shared_binary(n), os.X_OK)]

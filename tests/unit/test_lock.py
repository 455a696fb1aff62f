"""requirements.lock against pyproject.toml: every runtime dependency (and the kubernetes
extra the package ships) pinned with hashes, at a version pyproject accepts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")


def locked() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes), from requirements.lock's pip-compile layout."""
    pins: dict[str, tuple[str, int]] = {}
    name = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := PINNED.match(line):
            name = canonicalize_name(match[1])
            pins[name] = (match[2], 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
        elif line and not line.startswith((" ", "#")):
            pytest.fail(f"requirements.lock: a line that is not a pin with hashes: {line!r}")
    return pins


RUNTIME = [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["kubernetes"]]


@pytest.mark.parametrize("requirement", RUNTIME)
def test_each_runtime_dependency_is_pinned_with_hashes_at_an_accepted_version(requirement):
    wanted = Requirement(requirement)
    pins = locked()
    name = canonicalize_name(wanted.name)
    assert name in pins, f"{wanted.name} is not in requirements.lock: run scripts/lock.sh"
    version, hashes = pins[name]
    assert wanted.specifier.contains(version, prereleases=True), \
        f"requirements.lock pins {wanted.name}=={version}, pyproject wants {wanted.specifier}: run scripts/lock.sh"
    assert hashes > 0, f"{wanted.name} has no hash in requirements.lock"


def test_lock_holds_only_what_the_runtime_needs():
    """A test-only tool in the lock would ship in the package."""
    test_only = {canonicalize_name(Requirement(r).name) for r in PROJECT["optional-dependencies"]["test"]}
    runtime = {canonicalize_name(Requirement(r).name) for r in RUNTIME}
    assert not (set(locked()) & (test_only - runtime))

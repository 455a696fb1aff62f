"""The plugin registration file that tells koord-runtime-proxy where a runtime plugin listens.

Format (DESIGN.md §3, the upstream proxy's ``hookserver.d`` files)::

    {"remote-endpoint": "/var/run/koordlet/koordlet.sock",
     "failure-policy": "Ignore",
     "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer"]}

The file is written atomically (temp file + rename) because the proxy watches the
directory and must never read a half-written file.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .hooks import FailurePolicy, Stage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    name: str
    """File stem: the file is ``<config_dir>/<name>.json``."""
    endpoint: str
    failure_policy: FailurePolicy
    stages: tuple[Stage, ...]

    @classmethod
    def of(cls, name: str, endpoint: str, failure_policy: FailurePolicy | str,
           stages: Iterable[Stage]) -> Registration:
        """Stages are listed in the enum's order so the file's content is stable."""
        wanted = set(stages)
        return cls(name, endpoint, FailurePolicy(failure_policy),
                   tuple(s for s in Stage if s in wanted))

    def content(self) -> dict[str, object]:
        return {
            "remote-endpoint": self.endpoint,
            "failure-policy": self.failure_policy.value,
            "runtime-hooks": [s.value for s in self.stages],
        }

    def path(self, config_dir: Path) -> Path:
        return config_dir / f"{self.name}.json"

    def write(self, config_dir: Path) -> Path:
        """Creates ``config_dir`` if needed and replaces the file atomically (mode 0644)."""
        config_dir.mkdir(parents=True, exist_ok=True)
        target = self.path(config_dir)
        fd, tmp = tempfile.mkstemp(dir=config_dir, prefix=f".{self.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.content(), f, indent=2)
                f.write("\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        log.info("registered %s at %s: endpoint %s, hooks %s, failure policy %s",
                 self.name, target, self.endpoint, ",".join(self.stages) or "none",
                 self.failure_policy)
        return target

    def remove(self, config_dir: Path) -> None:
        target = self.path(config_dir)
        target.unlink(missing_ok=True)
        log.info("unregistered %s: removed %s", self.name, target)

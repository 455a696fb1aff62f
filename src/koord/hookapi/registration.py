"""The registration file: one ``<name>.json`` per plugin in the proxy's hook config dir.

::

    {"remote-endpoint": "/var/run/koordlet/koordlet.sock",
     "failure-policy": "Ignore",
     "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer"],
     "timeout-seconds": 2}

The format is the upstream proxy's (``timeout-seconds`` is ours and optional), so files
written for either side work on the other. The proxy reads it (``Registration.read``), koordlet
and the SDK write it (``Registration.write``); both go through this one schema.

Reading is hostile-input safe: the directory is root's, and a file anyone but root could
have written (symlink, wrong owner, group/world-writable) could point the proxy at a socket
that rewrites every pod, so such files are refused; sizes are capped before reading.
Writing is atomic (temp file + rename) because the proxy watches the directory and must
never read half a file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .endpoints import unix_socket_path
from .hookpoints import FailurePolicy, HookPoint

log = logging.getLogger(__name__)

MAX_FILE_SIZE = 64 * 1024
"""Real registrations are a few hundred bytes; the cap keeps a hostile file from costing memory."""

MAX_TIMEOUT_SECONDS = 3600.0
"""Far above kubelet's longest CRI deadline (4 min); larger values are typos or overflow bait."""

FIELDS = ("remote-endpoint", "failure-policy", "runtime-hooks", "timeout-seconds")


class RegistrationError(ValueError):
    """A registration file that cannot be used; ``str()`` is ``"<file>: <reason>"``."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{display_name(file)}: {reason}")
        self.file = file
        self.reason = reason


def display_name(name: str) -> str:
    """File names come from whoever can write the directory: escape anything that could forge log lines."""
    return name if name.isprintable() else ascii(name)


@dataclass(frozen=True)
class Registration:
    """One plugin's registration: where it listens, which hook points it serves, what to do when it fails."""

    name: str
    """The file stem: the file is ``<config dir>/<name>.json``."""
    endpoint: str
    """Absolute unix socket path, without a scheme (or host:port for a tcp plugin, which the proxy ignores)."""
    failure_policy: FailurePolicy = FailurePolicy.IGNORE
    hooks: tuple[HookPoint, ...] = ()
    """In HookPoint order, without duplicates, so the written file is stable."""
    timeout: float | None = None
    """``timeout-seconds``; None leaves it to the proxy's default."""

    @classmethod
    def of(cls, name: str, endpoint: str, failure_policy: FailurePolicy | str,
           hooks: Iterable[HookPoint | str], timeout: float | None = None) -> Registration:
        """Validated like a file the proxy reads; ValueError (RegistrationError) names the problem."""
        if not name or "/" in name or name.startswith(".") or "\0" in name:
            raise ValueError(f"plugin name {name!r}: want a plain file stem like 'gpu-env'")
        file = f"{name}.json"
        return cls(name, endpoint, _policy(str(failure_policy), file),
                   HookPoint.ordered(_hooks(list(hooks), file)),
                   None if timeout is None else _timeout(timeout, file))

    # -- reading ------------------------------------------------------------------------------

    @classmethod
    def read(cls, path: Path) -> Registration:
        """Reads and validates one file; raises RegistrationError saying what is wrong."""
        file = path.name
        try:
            data = _read(path, file)
        except OSError as e:
            raise RegistrationError(file, f"cannot be read: {e.strerror or e}") from None
        return cls.parse(data, file)

    @classmethod
    def parse(cls, data: bytes, file: str) -> Registration:
        """Validates a file's content; ``file`` (its name) names it in errors and gives the plugin name."""
        fields = _fields(_decode(data, file), file)
        if "remote-endpoint" not in fields:
            raise RegistrationError(file, "remote-endpoint is required")
        return cls(
            name=file.removesuffix(".json"),
            endpoint=_endpoint(fields["remote-endpoint"], file),
            failure_policy=_policy(fields.get("failure-policy", ""), file),
            hooks=HookPoint.ordered(_hooks(fields.get("runtime-hooks", []), file)),
            timeout=_timeout(fields["timeout-seconds"], file) if "timeout-seconds" in fields else None,
        )

    # -- writing ------------------------------------------------------------------------------

    def content(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "remote-endpoint": self.endpoint,
            "failure-policy": self.failure_policy.value,
            "runtime-hooks": [h.value for h in self.hooks],
        }
        if self.timeout is not None:
            doc["timeout-seconds"] = self.timeout
        return doc

    def path(self, config_dir: Path) -> Path:
        return config_dir / f"{self.name}.json"

    def write(self, config_dir: Path) -> Path:
        """Creates ``config_dir`` if needed and replaces the file atomically (mode 0644, whatever the umask)."""
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
                 self.name, target, self.endpoint, ",".join(self.hooks) or "none", self.failure_policy)
        return target

    def remove(self, config_dir: Path) -> None:
        target = self.path(config_dir)
        target.unlink(missing_ok=True)
        log.info("unregistered %s: removed %s", self.name, target)


# -- validation of each field ------------------------------------------------------------------

def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {dict: "object", list: "array", str: "string", type(None): "null"}.get(type(value), type(value).__name__)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _read(path: Path, name: str) -> bytes:
    """Reads the file only if root alone could have written it, without following links or blocking on fifos."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise RegistrationError(name, f"is a symlink (to {_show(os.readlink(path))}); "
                                      "registrations must be regular files")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC) \
        if stat.S_ISREG(st.st_mode) else None
    try:
        if fd is not None:
            st = os.fstat(fd)  # the file we opened, not the one we looked at before
        if fd is None or not stat.S_ISREG(st.st_mode):
            raise RegistrationError(name, f"is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_uid != 0:
            raise RegistrationError(name, f"is owned by uid {st.st_uid}; registrations must be owned by root (uid 0)")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("world", stat.S_IWOTH))
                               if st.st_mode & bit)
            raise RegistrationError(name, f"mode {stat.S_IMODE(st.st_mode):04o} is {who}-writable; "
                                          "only root may be able to write registrations")
        if st.st_size > MAX_FILE_SIZE:
            raise RegistrationError(name, f"is {st.st_size} bytes, larger than the {MAX_FILE_SIZE}-byte limit")
        data = os.read(fd, MAX_FILE_SIZE + 1)
        if len(data) > MAX_FILE_SIZE:  # grew after fstat
            raise RegistrationError(name, f"is larger than the {MAX_FILE_SIZE}-byte limit")
        return data
    finally:
        if fd is not None:
            os.close(fd)


def _decode(data: bytes, name: str) -> dict[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RegistrationError(name, f"is not valid UTF-8 (byte offset {e.start})") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise RegistrationError(name, f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise RegistrationError(name, "malformed JSON: nested too deeply") from None
    except ValueError as e:  # NaN/Infinity, integers with too many digits
        raise RegistrationError(name, f"malformed JSON: {e}") from None
    if not isinstance(doc, dict):
        raise RegistrationError(name, f"top level must be a JSON object, got {_json_type(doc)}")
    return doc


def _fields(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """Matches field names case-insensitively like Go's encoding/json, so files written for upstream keep working.

    An exact match wins over a case-folded one; null means absent, as in Go.
    """
    found: dict[str, Any] = {}
    for key, value in doc.items():
        field = key if key in FIELDS else next((f for f in FIELDS if f == key.lower()), None)
        if field is None:
            log.debug("plugin registration %s: ignoring unknown field %s", display_name(name), _show(key))
        elif value is not None and (field == key or field not in doc):
            found[field] = value
    return found


def _endpoint(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise RegistrationError(name, f"remote-endpoint must be a string, got {_json_type(value)}")
    try:
        return unix_socket_path(value)
    except ValueError as e:
        raise RegistrationError(name, f"remote-endpoint {e}") from None


def _policy(value: Any, name: str) -> FailurePolicy:
    if value == "":  # upstream's "no policy", which it treats as Ignore
        return FailurePolicy.IGNORE
    if not isinstance(value, str):
        raise RegistrationError(name, f"failure-policy must be a string, got {_json_type(value)}")
    try:
        return FailurePolicy(value)
    except ValueError:
        raise RegistrationError(name, f"failure-policy {_show(value)} is not one of Fail, Ignore") from None


def _hooks(value: Any, name: str) -> frozenset[HookPoint]:
    if not isinstance(value, list):
        raise RegistrationError(name, f"runtime-hooks must be an array of hook point names, got {_json_type(value)}")
    hooks = set()
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RegistrationError(name, f"runtime-hooks[{i}] must be a string, got {_json_type(item)}")
        try:
            hooks.add(HookPoint(item))
        except ValueError:
            known = ", ".join(h.value for h in HookPoint)
            raise RegistrationError(name, f"runtime-hooks[{i}]: unknown hook point {_show(item)} "
                                          f"(known: {known})") from None
    return frozenset(hooks)


def _timeout(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RegistrationError(name, f"timeout-seconds must be a number, got {_json_type(value)}")
    if not math.isfinite(value) or value <= 0:
        raise RegistrationError(name, f"timeout-seconds must be greater than 0, got {_show(value)}")
    if value > MAX_TIMEOUT_SECONDS:
        raise RegistrationError(name, f"timeout-seconds {_show(value)} is more than {MAX_TIMEOUT_SECONDS:g}")
    return float(value)

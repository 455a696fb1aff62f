"""Plugins manager: the runtime plugins registered as ``*.json`` files in the hook config dir.

The registrations are held in one immutable snapshot that a rescan replaces with a single
attribute assignment: the dispatcher reads ``plugins_for(hook)`` without locks, and a call
already under way keeps the registrations it started with while the directory changes.

The directory is root's: a file that anyone but root could have written (symlink, wrong
owner, group/world-writable) could point the proxy at a socket that rewrites every pod, so
such files are refused. A bad file never takes the others down; it is reported with one
warning per distinct state, so a rescan loop does not flood the log.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

log = logging.getLogger(__name__)

MAX_FILE_SIZE = 64 * 1024
"""Real registrations are a few hundred bytes; the cap keeps a hostile file from costing memory."""

MAX_TIMEOUT_SECONDS = 3600.0
"""Far above kubelet's longest CRI deadline (4 min); larger values are typos or overflow bait."""

UNIX_PATH_MAX = 107
"""sun_path holds 108 bytes including the terminating NUL."""

DEBOUNCE_SECONDS = 0.1
"""Editors write a file in several steps; one rescan shortly after the first event sees them all."""

POLL_SECONDS = 1.0
"""Safety net for missed inotify events and a deleted/recreated directory."""


class HookPoint(enum.StrEnum):
    """The seven hook points of seed 001; values are the names used in registration files."""

    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"
    POST_STOP_CONTAINER = "PostStopContainer"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"


class FailurePolicy(enum.StrEnum):
    FAIL = "Fail"
    IGNORE = "Ignore"


@dataclass(frozen=True)
class PluginRegistration:
    name: str
    """The file name, e.g. ``10-koordlet.json``: it orders plugins and names them in logs and metrics."""
    path: Path
    endpoint: str
    """Absolute unix socket path, without a scheme."""
    failure_policy: FailurePolicy
    hooks: frozenset[HookPoint]
    timeout: float
    """Seconds a single hook call may take."""

    def describe(self) -> str:
        hooks = ",".join(h.value for h in HookPoint if h in self.hooks) or "(none)"
        return (f"file={display_name(self.name)} endpoint={display_name(self.endpoint)} hooks={hooks} "
                f"failure-policy={self.failure_policy.value} timeout={self.timeout:g}s")


class RegistrationError(ValueError):
    """A registration file that is ignored; ``str()`` is ``"<file>: <reason>"``."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{display_name(file)}: {reason}")
        self.file = file
        self.reason = reason


def display_name(name: str) -> str:
    """File names come from whoever can write the directory: escape anything that could forge log lines."""
    return name if name.isprintable() else ascii(name)


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {dict: "object", list: "array", str: "string", type(None): "null"}.get(type(value), type(value).__name__)


_FIELDS = ("remote-endpoint", "failure-policy", "runtime-hooks", "timeout-seconds")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _read(path: Path, name: str) -> bytes:
    """Read the file only if root alone could have written it, without following links or blocking on fifos."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise RegistrationError(name, f"is a symlink (to {_show(os.readlink(path))}); "
                                      "registrations must be regular files")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC) \
        if stat.S_ISREG(st.st_mode) else None
    try:
        if fd is not None:
            st = os.fstat(fd)  # the file we opened, not the one we looked at before
        if not stat.S_ISREG(st.st_mode):
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
        assert fd is not None
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
    """Match field names case-insensitively like Go's encoding/json, so files written for upstream keep working.

    An exact match wins over a case-folded one; null means absent, as in Go.
    """
    found: dict[str, Any] = {}
    for key, value in doc.items():
        field = key if key in _FIELDS else next((f for f in _FIELDS if f == key.lower()), None)
        if field is None:
            log.debug("plugin registration %s: ignoring unknown field %s", display_name(name), _show(key))
        elif value is not None and (field == key or field not in doc):
            found[field] = value
    return found


def _endpoint(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise RegistrationError(name, f"remote-endpoint must be a string, got {_json_type(value)}")
    if value.startswith("unix://"):
        path = value[len("unix://"):]
    elif value.startswith("unix:"):
        path = value[len("unix:"):]
    elif m := _SCHEME.match(value):
        raise RegistrationError(name, f"remote-endpoint {_show(value)} uses scheme {m.group(1)!r}; "
                                      "only unix sockets are supported")
    else:
        path = value
    if not path:
        raise RegistrationError(name, "remote-endpoint is empty")
    if "\0" in path:
        raise RegistrationError(name, "remote-endpoint contains a NUL character")
    if not path.startswith("/"):
        raise RegistrationError(name, f"remote-endpoint {_show(value)} is not an absolute unix socket path")
    size = len(path.encode("utf-8", "surrogateescape"))
    if size > UNIX_PATH_MAX:
        raise RegistrationError(name, f"remote-endpoint is {size} bytes, longer than the "
                                      f"{UNIX_PATH_MAX}-byte limit of unix socket paths")
    return path


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


def parse_registration(path: Path, default_timeout: float) -> PluginRegistration:
    """Read and validate one registration file; raises RegistrationError saying what is wrong."""
    name = path.name
    try:
        data = _read(path, name)
    except OSError as e:
        raise RegistrationError(name, f"cannot be read: {e.strerror or e}") from None
    fields = _fields(_decode(data, name), name)
    if "remote-endpoint" not in fields:
        raise RegistrationError(name, "remote-endpoint is required")
    return PluginRegistration(
        name=name,
        path=path,
        endpoint=_endpoint(fields["remote-endpoint"], name),
        failure_policy=_policy(fields.get("failure-policy", ""), name),
        hooks=_hooks(fields.get("runtime-hooks", []), name),
        timeout=_timeout(fields["timeout-seconds"], name) if "timeout-seconds" in fields else default_timeout,
    )


def _is_candidate(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


StatKey = tuple[int, int, int, int, int, int, int]


def _stat_key(st: os.stat_result) -> StatKey:
    """ctime is in it so that chmod/chown, which leave mtime alone, count as a change."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode, st.st_uid)


@dataclass(frozen=True)
class _Snapshot:
    registrations: tuple[PluginRegistration, ...]
    by_hook: Mapping[HookPoint, tuple[PluginRegistration, ...]]
    invalid: Mapping[str, str]

    @classmethod
    def build(cls, registrations: tuple[PluginRegistration, ...], invalid: dict[str, str]) -> _Snapshot:
        by_hook = {h: tuple(r for r in registrations if h in r.hooks) for h in HookPoint}
        return cls(registrations, MappingProxyType(by_hook), MappingProxyType(dict(invalid)))


class _Handler(FileSystemEventHandler):
    def __init__(self, manager: PluginsManager, directory: str) -> None:
        self._manager = manager
        self._dir = directory

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        paths = [os.fsdecode(event.src_path), os.fsdecode(event.dest_path)]
        if event.event_type == "deleted" and paths[0] == self._dir:
            self._manager._watch_lost()
        elif any(p and _is_candidate(os.path.basename(p)) for p in paths):
            self._manager._request_rescan()


class PluginsManager:
    """Keeps the snapshot of valid registrations in step with the config dir."""

    def __init__(self, config_dir: Path, default_timeout: float = 5.0,
                 on_change: Callable[[], None] | None = None) -> None:
        if isinstance(default_timeout, bool) or not math.isfinite(default_timeout) or default_timeout <= 0:
            raise ValueError(f"default hook timeout must be a finite number of seconds > 0, got {default_timeout!r}")
        self._dir = Path(config_dir)
        self._default_timeout = float(default_timeout)
        self._on_change = on_change
        self._snap = _Snapshot.build((), {})
        self._fingerprint: tuple[Any, ...] | None = None
        self._reported: dict[str, tuple[str, StatKey]] = {}  # invalid file -> state already logged
        self._scan_lock = threading.Lock()
        self._cond = threading.Condition()
        self._due: float | None = None
        self._stopping = False
        self._worker: threading.Thread | None = None
        self._observer: BaseObserver | None = None
        self._watch: ObservedWatch | None = None
        self._watched_id: tuple[int, int] | None = None

    # -- public API -------------------------------------------------------------------------

    def start(self) -> None:
        """Load the directory synchronously (the proxy must not serve with a half-read config), then watch it."""
        if self._dir.exists() and not self._dir.is_dir():
            raise NotADirectoryError(f"runtime hook config dir {self._dir} exists but is not a directory")
        if not self._dir.exists():
            self._dir.mkdir(mode=0o755, parents=True)
            os.chmod(self._dir, 0o755)  # mkdir's mode is masked by the umask
            log.info("created runtime hook config dir %s", self._dir)
        self._stopping = False
        self._rescan()
        observer = Observer()
        observer.daemon = True
        try:
            observer.start()
        except Exception as e:  # e.g. out of inotify instances: polling still keeps us current
            log.warning("cannot watch runtime hook config dir %s (%s); checking it every %gs instead",
                        self._dir, e, POLL_SECONDS)
        else:
            self._observer = observer
            self._arm_watch()
        self._worker = threading.Thread(target=self._run, name="pluginsmanager", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join()
            self._worker = None
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()
            self._observer = None
            self._watch = None
            self._watched_id = None

    def plugins_for(self, hook: HookPoint) -> tuple[PluginRegistration, ...]:
        """The plugins to call for ``hook``, in lexical file-name order."""
        return self._snap.by_hook[hook]

    def snapshot(self) -> tuple[PluginRegistration, ...]:
        return self._snap.registrations

    def invalid(self) -> dict[str, str]:
        """File name -> reason, for the files currently ignored."""
        return dict(self._snap.invalid)

    # -- watching ---------------------------------------------------------------------------

    def _watch_lost(self) -> None:
        """The directory was removed: a new one may get the same inode number, so forget the old one."""
        self._watched_id = None
        self._request_rescan()

    def _request_rescan(self) -> None:
        with self._cond:
            if self._due is None:
                self._due = time.monotonic() + DEBOUNCE_SECONDS
                self._cond.notify_all()

    def _run(self) -> None:
        next_poll = time.monotonic() + POLL_SECONDS
        while True:
            with self._cond:
                deadline = next_poll if self._due is None else min(next_poll, self._due)
                timeout = deadline - time.monotonic()
                if timeout > 0 and not self._stopping:
                    self._cond.wait(timeout)
                if self._stopping:
                    return
                now = time.monotonic()
                event_due = self._due is not None and now >= self._due
                if event_due:
                    self._due = None
            try:
                if event_due:
                    self._rescan()
                if now >= next_poll:
                    next_poll = now + POLL_SECONDS
                    self._arm_watch()
                    if self._listing()[1] != self._fingerprint:
                        self._rescan()
            except Exception:
                log.exception("plugins manager: rescan of %s failed; retrying in %gs", self._dir, POLL_SECONDS)

    def _arm_watch(self) -> None:
        """(Re)watch the directory when it appeared or was replaced: inotify watches die with the inode."""
        try:
            st = os.stat(self._dir)
        except OSError:
            return
        ident = (st.st_dev, st.st_ino)
        if ident == self._watched_id or self._observer is None:
            return
        if self._watch is not None:
            try:
                self._observer.unschedule(self._watch)
            except Exception:  # the emitter may have stopped itself when the directory went away
                log.debug("unscheduling the old watch of %s failed", self._dir, exc_info=True)
            self._watch = None
        try:
            self._watch = self._observer.schedule(_Handler(self, str(self._dir)), str(self._dir),
                                                 recursive=False)
            self._watched_id = ident
            log.debug("watching runtime hook config dir %s", self._dir)
        except Exception as e:
            log.warning("cannot watch runtime hook config dir %s (%s); checking it every %gs instead",
                        self._dir, e, POLL_SECONDS)

    # -- scanning ---------------------------------------------------------------------------

    def _listing(self) -> tuple[dict[str, StatKey], tuple[Any, ...]]:
        """Candidate files with their lstat keys, and a fingerprint that changes when any of them does."""
        entries: dict[str, StatKey] = {}
        try:
            with os.scandir(self._dir) as it:
                for entry in it:
                    if _is_candidate(entry.name):
                        try:
                            entries[entry.name] = _stat_key(entry.stat(follow_symlinks=False))
                        except FileNotFoundError:
                            continue
        except (FileNotFoundError, NotADirectoryError):
            pass
        return entries, tuple(sorted(entries.items()))

    def _rescan(self) -> None:
        with self._scan_lock:
            entries, fingerprint = self._listing()
            old = self._snap
            previous = {r.name: r for r in old.registrations}
            valid: list[PluginRegistration] = []
            invalid: dict[str, str] = {}
            for name in sorted(entries):
                try:
                    reg = parse_registration(self._dir / name, self._default_timeout)
                except RegistrationError as e:
                    if not os.path.lexists(self._dir / name):
                        continue  # deleted while we scanned; the delete event rescans
                    invalid[name] = e.reason
                    self._report(name, e.reason, entries[name], name in previous)
                    continue
                except Exception as e:  # a bug must cost one file, not the proxy
                    invalid[name] = f"unexpected error while loading: {e!r}"
                    self._report(name, invalid[name], entries[name], name in previous)
                    continue
                self._reported.pop(name, None)
                valid.append(reg)
                self._log_registered(reg, previous.get(name))
            for name in self._reported.keys() - invalid.keys():
                del self._reported[name]
            registrations = tuple(valid)
            kept = {r.name for r in registrations} | invalid.keys()
            for name, reg in previous.items():
                if name not in kept:
                    log.info("plugin removed: %s", reg.describe())
            self._fingerprint = fingerprint
            if registrations == old.registrations and invalid == old.invalid:
                return
            self._snap = _Snapshot.build(registrations, invalid)
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:
                log.exception("plugins manager: on_change callback failed")

    def _report(self, name: str, reason: str, key: StatKey, was_registered: bool) -> None:
        if self._reported.get(name) == (reason, key):
            return
        self._reported[name] = (reason, key)
        suffix = "; the plugin it registered is no longer called" if was_registered else ""
        log.warning("plugin registration ignored: %s: %s%s", display_name(name), reason, suffix)

    @staticmethod
    def _log_registered(reg: PluginRegistration, before: PluginRegistration | None) -> None:
        if reg == before:
            return
        log.info("plugin %s: %s", "registered" if before is None else "updated", reg.describe())
        if not reg.hooks:
            log.warning("plugin %s lists no runtime-hooks: it will get no calls", display_name(reg.name))

"""Plugins manager: the runtime plugins registered as ``*.json`` files in the hook config dir.

The registrations are held in one immutable snapshot that a rescan replaces with a single
attribute assignment: the dispatcher reads ``plugins_for(hook)`` without locks, and a call
already under way keeps the registrations it started with while the directory changes.

What a valid file is (``koord.hookapi.Registration``) is shared with the plugins that write
them. A bad file never takes the others down; it is reported with one warning per distinct
state, so a rescan loop does not flood the log.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from koord.filewatch import DirWatcher
from koord.hookapi import FailurePolicy, HookPoint, Registration, RegistrationError, display_name

log = logging.getLogger(__name__)

DEBOUNCE_SECONDS = 0.1
"""Editors write a file in several steps; one rescan shortly after the first event sees them all."""

POLL_SECONDS = 1.0
"""Safety net for missed inotify events and a deleted/recreated directory."""


@dataclass(frozen=True)
class PluginRegistration:
    """A registration file as the proxy loaded it, with its timeout resolved."""

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
        hooks = ",".join(HookPoint.ordered(self.hooks)) or "(none)"
        return (f"file={display_name(self.name)} endpoint={display_name(self.endpoint)} hooks={hooks} "
                f"failure-policy={self.failure_policy.value} timeout={self.timeout:g}s")


def parse_registration(path: Path, default_timeout: float) -> PluginRegistration:
    """Reads and validates one registration file; raises RegistrationError saying what is wrong."""
    reg = Registration.read(path)
    return PluginRegistration(name=path.name, path=path, endpoint=reg.endpoint, failure_policy=reg.failure_policy,
                              hooks=frozenset(reg.hooks),
                              timeout=default_timeout if reg.timeout is None else reg.timeout)


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
        self._watcher: DirWatcher | None = None

    # -- public API -------------------------------------------------------------------------

    def start(self) -> None:
        """Load the directory synchronously (the proxy must not serve with a half-read config), then watch it."""
        if self._dir.exists() and not self._dir.is_dir():
            raise NotADirectoryError(f"runtime hook config dir {self._dir} exists but is not a directory")
        if not self._dir.exists():
            self._dir.mkdir(mode=0o755, parents=True)
            os.chmod(self._dir, 0o755)  # mkdir's mode is masked by the umask
            log.info("created runtime hook config dir %s", self._dir)
        self._rescan()
        self._watcher = DirWatcher([self._dir], self._rescan, name="pluginsmanager", accept=_is_candidate,
                                   on_poll=self._check, debounce=DEBOUNCE_SECONDS, poll_interval=POLL_SECONDS)
        self._watcher.start()

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def plugins_for(self, hook: HookPoint) -> tuple[PluginRegistration, ...]:
        """The plugins to call for ``hook``, in lexical file-name order."""
        return self._snap.by_hook[hook]

    def snapshot(self) -> tuple[PluginRegistration, ...]:
        return self._snap.registrations

    def invalid(self) -> dict[str, str]:
        """File name -> reason, for the files currently ignored."""
        return dict(self._snap.invalid)

    def _check(self) -> None:
        """The periodic check: rescans only when a file's lstat changed since the last scan."""
        if self._listing()[1] != self._fingerprint:
            self._rescan()

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

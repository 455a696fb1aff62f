"""SystemConfig (gate SystemConfig, off by default as upstream): node-wide memory settings
from NodeSLO ``spec.systemStrategy``, reconciled every ``--reconcile-interval-seconds``.

- ``minFreeKbytesFactor`` -> ``<proc>/sys/vm/min_free_kbytes`` = Node capacity memory in KiB
  x factor / 10000, written only within [10240, 10485760] KiB;
- ``watermarkScaleFactor`` -> ``<proc>/sys/vm/watermark_scale_factor``, within [10, 400];
- ``memcgReapBackGround`` -> ``<sys>/kernel/mm/memcg_reaper/reap_background`` (0 or 1), only
  where the kernel has the file.

An unset field is not written; a value out of range is refused with one error naming the
field, and the other fields still apply (upstream's per-value check). Beyond upstream, which
never restores anything: the value a file held before koordlet first wrote it is kept and
written back when its field (or the whole ``systemStrategy``) is removed from the NodeSLO,
and when the strategy stops (koordlet exiting, e.g. to restart with the gate off). Those
values live in memory only: after a ``kill -9`` the kernel keeps koordlet's values.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..features import SYSTEM_CONFIG
from .framework import Context, Strategy
from .nodeinfo import NodeInfoError, capacity_memory

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 4096


@dataclass(frozen=True)
class Knob:
    field: str
    lo: int
    hi: int
    optional: bool
    """Written only where the kernel has the file (no error when it is missing)."""


MIN_FREE_KBYTES = Knob("minFreeKbytesFactor", 10 * 1024, 10 * 1024 * 1024, False)
WATERMARK_SCALE_FACTOR = Knob("watermarkScaleFactor", 10, 400, False)
MEMCG_REAP_BACKGROUND = Knob("memcgReapBackGround", 0, 1, True)
KNOBS = (MIN_FREE_KBYTES, WATERMARK_SCALE_FACTOR, MEMCG_REAP_BACKGROUND)


def knob_paths(proc_root: Path, sys_root: Path) -> dict[Knob, Path]:
    return {MIN_FREE_KBYTES: Path(proc_root) / "sys/vm/min_free_kbytes",
            WATERMARK_SCALE_FACTOR: Path(proc_root) / "sys/vm/watermark_scale_factor",
            MEMCG_REAP_BACKGROUND: Path(sys_root) / "kernel/mm/memcg_reaper/reap_background"}


def wanted_values(strategy: Mapping[str, Any] | None, capacity_bytes: int) -> tuple[dict[Knob, int], list[str]]:
    """(knob -> value for every set, valid field; one error per field refused)."""
    values: dict[Knob, int] = {}
    errors: list[str] = []
    for knob in KNOBS:
        raw = (strategy or {}).get(knob.field)
        if raw is None:
            continue
        where = f"spec.systemStrategy.{knob.field}={raw!r:.40}"
        if isinstance(raw, bool) or not isinstance(raw, int):
            errors.append(f"{where}: want an integer")
            continue
        value = capacity_bytes // 1024 * raw // 10000 if knob is MIN_FREE_KBYTES else raw
        if not knob.lo <= value <= knob.hi:
            what = f"min_free_kbytes {value}" if knob is MIN_FREE_KBYTES else f"{value}"
            errors.append(f"{where}: {what} is outside [{knob.lo}, {knob.hi}]; not written")
            continue
        values[knob] = value
    return values, errors


def _read(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(MAX_FILE_BYTES).decode("ascii", "replace").strip()


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class SystemConfig(Strategy):
    name = "SystemConfig"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, ctx.config.reconcile_interval, SYSTEM_CONFIG)
        self.paths = knob_paths(ctx.config.proc_root, ctx.config.sys_root)
        self.originals: dict[Knob, str] = {}

    def run_once(self) -> None:
        ctx = self.ctx
        node_slo = ctx.node_slo(self.name)
        if node_slo is None:
            return
        strategy = node_slo.merged["spec"].get("systemStrategy")
        if strategy is not None and not isinstance(strategy, dict):
            ctx.log_once(self.name, f"spec.systemStrategy: want an object, got {type(strategy).__name__}; "
                         "nothing written", logging.ERROR)
            return
        try:
            capacity = capacity_memory(ctx.informer.get_node() or {})
        except NodeInfoError as exc:
            ctx.log_once(self.name, f"skipped, nothing written: {exc}", logging.ERROR)
            return
        ctx.log_once(self.name, None)
        wanted, errors = wanted_values(strategy, capacity)
        ctx.log_once(self.name + "/values", "; ".join(errors) or None, logging.ERROR)
        for knob, value in wanted.items():
            self._apply(knob, str(value))
        for knob in [k for k in self.originals if k not in wanted]:
            self._restore(knob, "its field left the NodeSLO")

    def teardown(self) -> None:
        for knob in list(self.originals):
            self._restore(knob, "SystemConfig stopping")

    def _apply(self, knob: Knob, text: str) -> None:
        path = self.paths[knob]
        try:
            current = _read(path)
            if knob not in self.originals:
                self.originals[knob] = current
            if current == text:
                return
            _write(path, text)
        except FileNotFoundError:
            level = logging.INFO if knob.optional else logging.ERROR
            self.ctx.log_once(f"{self.name}/{knob.field}", f"{path} does not exist on this kernel; "
                              f"{knob.field} not written", level)
            return
        except OSError as exc:
            self.ctx.log_once(f"{self.name}/{knob.field}", f"write {text} to {path} failed: "
                              f"{exc.strerror or exc}", logging.ERROR)
            return
        self.ctx.log_once(f"{self.name}/{knob.field}", None)
        log.info("%s: %s: %s -> %s (value before koordlet: %s)", self.name, path, current, text,
                 self.originals[knob])

    def _restore(self, knob: Knob, why: str) -> None:
        path, text = self.paths[knob], self.originals.pop(knob)
        try:
            if _read(path) != text:
                _write(path, text)
                log.info("%s: %s restored to %s (%s)", self.name, path, text, why)
        except OSError as exc:
            log.error("%s: restoring %s to %s failed: %s", self.name, path, text, exc.strerror or exc)

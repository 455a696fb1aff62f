"""Hostile and malformed registration files in the hook dir of a running proxy.

The proxy must survive them all, report each exactly once in its log, and keep calling
the good plugin in the same directory.
"""

from __future__ import annotations

import json
import os
import random
import re
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord_testing.hookplugin import Behaviour

from .rig import Rig, eventually

pytestmark = pytest.mark.e2e

Writer = Callable[[Path], None]
"""Creates the hostile entry at the given (temporary) path; it is renamed into the dir afterwards."""

GOOD = {"remote-endpoint": "/run/koord/never-called.sock", "failure-policy": "Ignore",
        "runtime-hooks": ["PreRunPodSandbox"], "timeout-seconds": 2}


def _text(content: str | bytes, mode: int = 0o644, uid: int = 0) -> Writer:
    def write(path: Path) -> None:
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        os.chmod(path, mode)
        os.chown(path, uid, 0)
    return write


_ABSENT = object()


def _doc(**changes) -> Writer:
    """GOOD with fields replaced (or removed with _ABSENT)."""
    doc = {**GOOD, **changes}
    return _text(json.dumps({k: v for k, v in doc.items() if v is not _ABSENT}))


def _fuzzed(count: int, seed: int = 3) -> list[Writer]:
    """Byte-level mutations of a good file that no longer parse as JSON."""
    rng = random.Random(seed)
    base = json.dumps(GOOD, indent=1).encode()
    out: list[Writer] = []
    while len(out) < count:
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            op, at = rng.choice(("flip", "cut", "insert", "truncate")), rng.randrange(len(data))
            if op == "flip":
                data[at] = rng.randrange(256)
            elif op == "cut":
                del data[at:at + rng.randint(1, 8)]
            elif op == "insert":
                data[at:at] = bytes(rng.choice(b'{}[]",:\\\x00\xff') for _ in range(rng.randint(1, 3)))
            else:
                del data[at:]
        try:
            json.loads(bytes(data).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            out.append(_text(bytes(data)))
    return out


def _symlink(target: str) -> Writer:
    return lambda path: os.symlink(target, path)


def _fifo(path: Path) -> None:
    os.mkfifo(path, 0o644)


def _directory(path: Path) -> None:
    path.mkdir(mode=0o755)


def _char_device(path: Path) -> None:
    os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero


def _huge(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(50 * 1024 * 1024)  # sparse: costs no disk, but a naive reader 50 MiB of memory
    os.chmod(path, 0o644)


def hostile_entries(good_file: Path) -> dict[str, Writer]:
    structural: dict[str, Writer] = {
        "empty": _text(""),
        "whitespace": _text("  \n\t "),
        "top-array": _text("[]"),
        "top-string": _text('"remote-endpoint"'),
        "top-number": _text("42"),
        "top-null": _text("null"),
        "nan-timeout": _text('{"remote-endpoint": "/run/p.sock", "timeout-seconds": NaN}'),
        "infinity-timeout": _text('{"remote-endpoint": "/run/p.sock", "timeout-seconds": Infinity}'),
        "deeply-nested": _text("[" * 20000 + "]" * 20000),
        "huge-integer": _text('{"remote-endpoint": "/run/p.sock", "timeout-seconds": ' + "9" * 5000 + "}"),
        "invalid-utf8": _text(b'{"remote-endpoint": "/run/\xff\xfe.sock"}'),
        "utf16": _text(json.dumps(GOOD).encode("utf-16")),
        "big-but-valid-json": _text(json.dumps({**GOOD, "padding": "x" * (256 * 1024)})),
        "no-endpoint": _doc(**{"remote-endpoint": _ABSENT}),
        "endpoint-number": _doc(**{"remote-endpoint": 7}),
        "endpoint-list": _doc(**{"remote-endpoint": ["/run/p.sock"]}),
        "endpoint-object": _doc(**{"remote-endpoint": {"path": "/run/p.sock"}}),
        "endpoint-true": _doc(**{"remote-endpoint": True}),
        "endpoint-empty": _doc(**{"remote-endpoint": ""}),
        "endpoint-relative": _doc(**{"remote-endpoint": "run/p.sock"}),
        "endpoint-unix-relative": _doc(**{"remote-endpoint": "unix://run/p.sock"}),
        "endpoint-tcp": _doc(**{"remote-endpoint": "tcp://127.0.0.1:9000"}),
        "endpoint-http": _doc(**{"remote-endpoint": "http://evil.example/hook"}),
        "endpoint-nul": _doc(**{"remote-endpoint": "/run/p\u0000.sock"}),
        "endpoint-too-long": _doc(**{"remote-endpoint": "/run/" + "p" * 200 + ".sock"}),
        "policy-lowercase": _doc(**{"failure-policy": "fail"}),
        "policy-unknown": _doc(**{"failure-policy": "Always"}),
        "policy-number": _doc(**{"failure-policy": 1}),
        "policy-list": _doc(**{"failure-policy": ["Fail"]}),
        "hooks-string": _doc(**{"runtime-hooks": "PreRunPodSandbox"}),
        "hooks-unknown": _doc(**{"runtime-hooks": ["PreRunPodSandbox", "PreDestroyTheNode"]}),
        "hooks-lowercase": _doc(**{"runtime-hooks": ["prerunpodsandbox"]}),
        "hooks-number": _doc(**{"runtime-hooks": [1]}),
        "hooks-nested": _doc(**{"runtime-hooks": [["PreRunPodSandbox"]]}),
        "hooks-object": _doc(**{"runtime-hooks": {"PreRunPodSandbox": True}}),
        "timeout-string": _doc(**{"timeout-seconds": "1"}),
        "timeout-zero": _doc(**{"timeout-seconds": 0}),
        "timeout-negative": _doc(**{"timeout-seconds": -1}),
        "timeout-bool": _doc(**{"timeout-seconds": True}),
        "timeout-huge": _doc(**{"timeout-seconds": 1e300}),
        "timeout-list": _doc(**{"timeout-seconds": [1]}),
        "group-writable": _text(json.dumps(GOOD), mode=0o664),
        "world-writable": _text(json.dumps(GOOD), mode=0o666),
        "world-writable-sticky": _text(json.dumps(GOOD), mode=0o1646),
        "owned-by-nobody": _text(json.dumps(GOOD), uid=65534),
        "owned-by-user": _text(json.dumps(GOOD), mode=0o600, uid=1000),
        "symlink-to-good": _symlink(str(good_file)),
        "symlink-dangling": _symlink("/nonexistent/registration.json"),
        "symlink-to-dir": _symlink("/etc"),
        "symlink-to-dev-zero": _symlink("/dev/zero"),
        "symlink-to-proc": _symlink("/proc/self/environ"),
        "fifo": _fifo,
        "directory": _directory,
        "char-device": _char_device,
        "huge-sparse": _huge,
        "log-forging\nWARNING fake line": _text("{"),
        "escape-\x1b[31mred": _text("{"),
        "spaces and ünïcödé": _text("{"),
    }
    entries = {f"bad-{name}.json": writer for name, writer in structural.items()}
    for i, writer in enumerate(_fuzzed(60)):
        entries[f"fuzz-{i:03d}.json"] = writer
    return entries


def shown(name: str) -> str:
    """How a file name may appear in a log line: control characters escaped."""
    return name if name.isprintable() else ascii(name)


def ignored_reports(log: str, names: list[str]) -> dict[str, int]:
    counts = {}
    for name in names:
        pattern = re.compile(r"plugin registration ignored: " + re.escape(shown(name)) + r": ")
        counts[name] = len(pattern.findall(log))
    return counts


# What the one log line about a file must say, by file-name part.
EXPECTED_REASON = {
    "bad-symlink": "symlink", "bad-owned-by": "must be owned by root", "writable": "writable",
    "bad-fifo": "not a regular file", "bad-directory": "not a regular file", "bad-char-device": "not a regular file",
    "bad-huge-sparse": "larger than", "bad-big-but-valid": "larger than", "bad-top-": "top level must be a JSON object",
    "bad-endpoint": "remote-endpoint", "bad-no-endpoint": "remote-endpoint is required",
    "bad-policy": "failure-policy", "bad-hooks": "runtime-hooks", "bad-timeout": "timeout-seconds",
    "fuzz-": "JSON|UTF-8", "bad-utf16": "UTF-8", "bad-invalid-utf8": "UTF-8",
}


def reason_problems(log: str, names: list[str]) -> list[str]:
    problems = []
    for name in names:
        wanted = [reason for part, reason in EXPECTED_REASON.items() if part in name]
        if not wanted:
            continue
        found = re.search(r"plugin registration ignored: " + re.escape(shown(name)) + r": (.*)", log)
        said = found.group(1) if found else ""
        if not all(re.search(reason, said) for reason in wanted):
            problems.append(f"{name}: expected {wanted}, log says {said!r}")
    return problems


def install(directory: Path, entries: dict[str, Writer]) -> None:
    """Each entry appears at once, fully formed (as a careful admin or an attacker would do)."""
    for name, write in entries.items():
        tmp = directory / f".tmp-{uuid.uuid4().hex}"
        write(tmp)
        os.rename(tmp, directory / name)


def test_hostile_registration_files_never_crash_the_proxy_and_are_reported_once(rig: Rig) -> None:
    good = rig.plugin("50-good.json", hooks=["PreRunPodSandbox"])
    good.behaviours["PreRunPodSandbox"] = Behaviour(
        answer=lambda req: hook.PodSandboxHookResponse(labels={"good": req.pod_meta.name}))
    proxy = rig.start_proxy()
    kubelet = rig.kubelet()
    entries = hostile_entries(rig.hook_dir / "50-good.json")
    assert len(entries) >= 100
    names = sorted(entries)

    # Half before and half after a pod start, in two bursts, while the proxy serves.
    install(rig.hook_dir, dict(list(entries.items())[: len(entries) // 2]))
    sid = kubelet.run_pod("during")
    install(rig.hook_dir, dict(list(entries.items())[len(entries) // 2:]))

    eventually(lambda: all(ignored_reports(proxy.logs(), names).values()), timeout=10,
               what="every hostile file being reported")
    # An unrelated change makes the proxy rescan the directory: nothing is reported again.
    rig.plugin("60-extra.json", hooks=["PostStopPodSandbox"])
    eventually(lambda: "60-extra.json" in proxy.logs(), what="the extra registration being loaded")
    kubelet.stop_pod(sid)
    rig.plugins[-1].wait_for("PostStopPodSandbox")

    assert proxy.running, "the proxy must survive its hook dir"
    counts = ignored_reports(proxy.logs(), names)
    assert {n: c for n, c in counts.items() if c != 1} == {}, "each bad file is reported exactly once"
    assert reason_problems(proxy.logs(), names) == []
    for name in names:
        if not name.isprintable():
            assert name not in proxy.logs(), f"{name!r} must be escaped in the log"
    sid2 = kubelet.run_pod("after")
    assert kubelet.pod_status(sid).status.labels["good"] == "during"
    assert kubelet.pod_status(sid2).status.labels["good"] == "after"
    assert len(good.requests("PreRunPodSandbox")) == 2

    # Starting with all of them already there works too, reported once more each.
    previous = len(proxy.logs())
    proxy.stop()
    proxy.start()
    restarted_log = proxy.logs()[previous:]
    assert ignored_reports(restarted_log, names) == {name: 1 for name in names}
    sid3 = rig.kubelet().run_pod("restarted")
    assert rig.clients[-1].pod_status(sid3).status.labels["good"] == "restarted"

"""Plugins manager: registration parsing, ordering, directory watching, and hostile files."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import socket
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from koord.hookapi import FailurePolicy, HookPoint, RegistrationError, display_name
from koord.hookapi import registration as schema
from koord.runtimeproxy import pluginsmanager as pm
from koord.runtimeproxy.pluginsmanager import PluginsManager, parse_registration


@pytest.fixture(autouse=True)
def _root_only() -> None:
    """Registration files must be owned by root, so these tests need root: fail, never skip."""
    if os.geteuid() != 0:
        pytest.fail("the plugins manager tests must run as root (registrations must be owned by uid 0)")

EFFECT_DEADLINE = 1.0
"""Issue 3: a created, changed, renamed or deleted file takes effect within 1 s."""

RECREATED_DIR_DEADLINE = 3 * pm.POLL_SECONDS
"""A recreated directory is picked up by the periodic check, not by inotify."""

LOGGER = "koord.runtimeproxy.pluginsmanager"

GOOD = {"remote-endpoint": "/run/koordlet/koordlet.sock", "failure-policy": "Fail",
        "runtime-hooks": ["PreRunPodSandbox", "PreStartContainer"]}


def write(directory: Path, name: str, content: Any, mode: int = 0o644) -> Path:
    """Write like a careful admin (temp file + rename), so no reader ever sees half a file."""
    data = content if isinstance(content, bytes) else \
        content.encode() if isinstance(content, str) else json.dumps(content).encode()
    tmp = directory / f".{name}.tmp"
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    target = directory / name
    os.replace(tmp, target)
    return target


def wait_for(condition: Callable[[], bool], deadline: float = EFFECT_DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {deadline}s")
        time.sleep(0.01)


def names(regs: tuple[pm.PluginRegistration, ...]) -> list[str]:
    return [r.name for r in regs]


def ignored_counts(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    """How many times each file was reported as ignored (keyed by its display name)."""
    return Counter(r.args[0] for r in caplog.records
                   if r.name == LOGGER and r.levelno == logging.WARNING
                   and r.msg.startswith("plugin registration ignored"))


@pytest.fixture
def hookdir(tmp_path: Path) -> Path:
    d = tmp_path / "hookserver.d"
    d.mkdir()
    return d


@pytest.fixture
def manager(hookdir: Path) -> Iterator[PluginsManager]:
    m = PluginsManager(hookdir, default_timeout=5.0)
    yield m
    m.stop()


# -- parsing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("content,endpoint,policy,hooks,timeout", [
    pytest.param({"remote-endpoint": "/var/run/koordlet.sock", "failure-policy": "Ignore",
                  "runtime-hooks": ["PreRunPodSandbox"]},
                 "/var/run/koordlet.sock", FailurePolicy.IGNORE, {"PreRunPodSandbox"}, 5.0, id="upstream-doc"),
    pytest.param({"remote-endpoint": "unix:///run/a.sock", "runtime-hooks": [h.value for h in HookPoint]},
                 "/run/a.sock", FailurePolicy.IGNORE, {h.value for h in HookPoint}, 5.0, id="unix-scheme-all-hooks"),
    pytest.param({"remote-endpoint": "unix:/run/a.sock", "runtime-hooks": []},
                 "/run/a.sock", FailurePolicy.IGNORE, set(), 5.0, id="unix-colon-empty-hooks"),
    pytest.param({"remote-endpoint": "/a.sock"}, "/a.sock", FailurePolicy.IGNORE, set(), 5.0, id="no-hooks"),
    pytest.param({"remote-endpoint": "/a.sock", "failure-policy": "Fail", "timeout-seconds": 1},
                 "/a.sock", FailurePolicy.FAIL, set(), 1.0, id="int-timeout"),
    pytest.param({"remote-endpoint": "/a.sock", "timeout-seconds": 0.25, "runtime-hooks":
                  ["PostStopContainer", "PostStopContainer"]},
                 "/a.sock", FailurePolicy.IGNORE, {"PostStopContainer"}, 0.25, id="float-timeout-dup-hook"),
    pytest.param({"remote-endpoint": "/a.sock", "failure-policy": "", "runtime-hooks": None,
                  "timeout-seconds": None}, "/a.sock", FailurePolicy.IGNORE, set(), 5.0, id="null-and-empty-policy"),
    pytest.param({"Remote-Endpoint": "/a.sock", "FAILURE-POLICY": "Fail", "runtime-Hooks": ["PreStartContainer"]},
                 "/a.sock", FailurePolicy.FAIL, {"PreStartContainer"}, 5.0, id="go-case-insensitive-keys"),
    pytest.param({"remote-endpoint": "/exact.sock", "Remote-Endpoint": "/folded.sock"},
                 "/exact.sock", FailurePolicy.IGNORE, set(), 5.0, id="exact-key-wins"),
    pytest.param({"remote-endpoint": "/a.sock", "comment": "ours", "priority": 3, "nested": {"x": [1]}},
                 "/a.sock", FailurePolicy.IGNORE, set(), 5.0, id="unknown-keys-ignored"),
    pytest.param('{\n  "remote-endpoint": "/a.sock",\n  "runtime-hooks": ["PreCreateContainer"]\n}\n',
                 "/a.sock", FailurePolicy.IGNORE, {"PreCreateContainer"}, 5.0, id="pretty-printed"),
])
def test_good_registrations(hookdir, content, endpoint, policy, hooks, timeout) -> None:
    reg = parse_registration(write(hookdir, "10-p.json", content), default_timeout=5.0)
    assert reg.name == "10-p.json" and reg.path == hookdir / "10-p.json"
    assert reg.endpoint == endpoint
    assert reg.failure_policy is policy
    assert {h.value for h in reg.hooks} == hooks
    assert reg.timeout == timeout


LONG_PATH = "/" + "s" * 107


@pytest.mark.parametrize("content,problem", [
    ("", "malformed JSON at line 1 column 1"),
    ('{"remote-endpoint": "/a.sock",', "malformed JSON at line 1 column"),
    ('{\n  "remote-endpoint": "/a.sock"\n  "runtime-hooks": []\n}', "malformed JSON at line 3 column 3"),
    ('{"remote-endpoint": "/a.sock", "timeout-seconds": NaN}', "NaN is not valid JSON"),
    ('{"remote-endpoint": "/a.sock", "timeout-seconds": ' + "9" * 5000 + "}", "malformed JSON"),
    ("[" * 60000, "nested too deeply"),
    (b'{"remote-endpoint": "/a\xff.sock"}', "not valid UTF-8 (byte offset 23)"),
    ("\ufeff" + json.dumps(GOOD), "malformed JSON"),
    ("[]", "top level must be a JSON object, got array"),
    ("null", "top level must be a JSON object, got null"),
    ('"x"', "top level must be a JSON object, got string"),
    ({}, "remote-endpoint is required"),
    ({"remote-endpoint": None}, "remote-endpoint is required"),
    ({"remote-endpoint": 5}, "remote-endpoint must be a string, got number"),
    ({"remote-endpoint": ["/a.sock"]}, "remote-endpoint must be a string, got array"),
    ({"remote-endpoint": ""}, "remote-endpoint is empty"),
    ({"remote-endpoint": "unix://"}, "remote-endpoint is empty"),
    ({"remote-endpoint": "run/a.sock"}, "'run/a.sock' is not an absolute unix socket path"),
    ({"remote-endpoint": "unix://run/a.sock"}, "is not an absolute unix socket path"),
    ({"remote-endpoint": "tcp://127.0.0.1:9000"}, "uses scheme 'tcp'; only unix sockets"),
    ({"remote-endpoint": "http://localhost/a.sock"}, "uses scheme 'http'"),
    ({"remote-endpoint": "/a\u0000b.sock"}, "NUL character"),
    ({"remote-endpoint": LONG_PATH}, "108 bytes, longer than the 107-byte limit"),
    ({"remote-endpoint": "/a.sock", "failure-policy": "fail"}, "failure-policy 'fail' is not one of Fail, Ignore"),
    ({"remote-endpoint": "/a.sock", "failure-policy": True}, "failure-policy must be a string, got boolean"),
    ({"remote-endpoint": "/a.sock", "runtime-hooks": "PreRunPodSandbox"},
     "runtime-hooks must be an array of hook point names, got string"),
    ({"remote-endpoint": "/a.sock", "runtime-hooks": ["PreRunPodSandbox", "PreStopContainer"]},
     "runtime-hooks[1]: unknown hook point 'PreStopContainer'"),
    ({"remote-endpoint": "/a.sock", "runtime-hooks": ["prerunpodsandbox"]}, "unknown hook point 'prerunpodsandbox'"),
    ({"remote-endpoint": "/a.sock", "runtime-hooks": [{"name": "x"}]}, "runtime-hooks[0] must be a string, got object"),
    ({"remote-endpoint": "/a.sock", "timeout-seconds": True}, "timeout-seconds must be a number, got boolean"),
    ({"remote-endpoint": "/a.sock", "timeout-seconds": "5"}, "timeout-seconds must be a number, got string"),
    ({"remote-endpoint": "/a.sock", "timeout-seconds": 0}, "timeout-seconds must be greater than 0, got 0"),
    ({"remote-endpoint": "/a.sock", "timeout-seconds": -1.5}, "timeout-seconds must be greater than 0, got -1.5"),
    ('{"remote-endpoint": "/a.sock", "timeout-seconds": 1e999}', "timeout-seconds must be greater than 0, got inf"),
    ({"remote-endpoint": "/a.sock", "timeout-seconds": 1e9}, "timeout-seconds 1000000000.0 is more than 3600"),
], ids=lambda v: v[:40] if isinstance(v, str) else None)
def test_bad_registration_content(hookdir, content, problem) -> None:
    path = write(hookdir, "10-bad.json", content)
    with pytest.raises(RegistrationError) as info:
        parse_registration(path, default_timeout=5.0)
    assert info.value.file == "10-bad.json"
    assert problem in info.value.reason
    assert str(info.value) == f"10-bad.json: {info.value.reason}"


def test_bad_registration_files(hookdir, tmp_path) -> None:
    good = json.dumps(GOOD)
    cases: dict[str, str] = {}

    os.symlink("/etc/passwd", hookdir / "passwd.json")
    cases["passwd.json"] = "is a symlink (to '/etc/passwd')"
    os.symlink(write(hookdir, "target.txt", good), hookdir / "link-to-good.json")
    cases["link-to-good.json"] = "is a symlink"
    write(hookdir, "world.json", good, mode=0o666)
    cases["world.json"] = "mode 0666 is group and world-writable"
    write(hookdir, "group.json", good, mode=0o664)
    cases["group.json"] = "mode 0664 is group-writable"
    os.chown(write(hookdir, "user.json", good), 1000, 0)
    cases["user.json"] = "owned by uid 1000; registrations must be owned by root (uid 0)"
    write(hookdir, "huge.json", b" " * (schema.MAX_FILE_SIZE + 1))
    cases["huge.json"] = "is 65537 bytes, larger than the 65536-byte limit"
    os.mkfifo(hookdir / "fifo.json")
    cases["fifo.json"] = "is not a regular file (mode prw"
    (hookdir / "dir.json").mkdir()
    cases["dir.json"] = "is not a regular file (mode drw"
    cases["missing.json"] = "cannot be read"

    for name, problem in cases.items():
        with pytest.raises(RegistrationError) as info:
            parse_registration(hookdir / name, default_timeout=5.0)
        assert problem in info.value.reason, name

    os.chown(hookdir / "user.json", 0, 1000)  # a non-root group owner cannot write a 0644 file
    assert parse_registration(hookdir / "user.json", 5.0).endpoint == GOOD["remote-endpoint"]


def test_hostile_file_names_cannot_forge_log_lines() -> None:
    assert display_name("10-a.json") == "10-a.json"
    assert "\n" not in display_name("x\nplugin registered: y.json")
    err = RegistrationError("x\n.json", "bad")
    assert "\n" not in str(err)


def test_bad_default_timeout(hookdir) -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="default hook timeout"):
            PluginsManager(hookdir, default_timeout=bad)


# -- manager: loading and ordering ----------------------------------------------------------

def test_start_creates_missing_dir(tmp_path) -> None:
    d = tmp_path / "etc" / "runtime" / "hookserver.d"
    m = PluginsManager(d)
    try:
        m.start()
        assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o755
        assert m.snapshot() == () and m.invalid() == {}
    finally:
        m.stop()


def test_lexical_order_and_hook_filter(hookdir, manager) -> None:
    write(hookdir, "20-gpu.json", {"remote-endpoint": "/gpu.sock", "runtime-hooks": ["PreCreateContainer"]})
    write(hookdir, "10-koordlet.json", {"remote-endpoint": "/k.sock",
                                        "runtime-hooks": ["PreCreateContainer", "PreRunPodSandbox"]})
    write(hookdir, "100-late.json", {"remote-endpoint": "/l.sock", "runtime-hooks": ["PreCreateContainer"]})
    write(hookdir, "05-first.json", {"remote-endpoint": "/f.sock", "runtime-hooks": ["PostStopPodSandbox"]})
    manager.start()
    assert names(manager.snapshot()) == ["05-first.json", "10-koordlet.json", "100-late.json", "20-gpu.json"]
    assert names(manager.plugins_for(HookPoint.PRE_CREATE_CONTAINER)) == \
        ["10-koordlet.json", "100-late.json", "20-gpu.json"]
    assert names(manager.plugins_for(HookPoint.PRE_RUN_POD_SANDBOX)) == ["10-koordlet.json"]
    assert names(manager.plugins_for(HookPoint.POST_STOP_POD_SANDBOX)) == ["05-first.json"]
    assert manager.plugins_for(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES) == ()
    assert manager.plugins_for(HookPoint.PRE_CREATE_CONTAINER) is manager.plugins_for(HookPoint.PRE_CREATE_CONTAINER)


def test_bad_file_does_not_hide_good_ones(hookdir, manager, caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hookdir, "10-good.json", GOOD)
    write(hookdir, "15-bad.json", {"remote-endpoint": "tcp://x:1"})
    manager.start()
    assert names(manager.snapshot()) == ["10-good.json"]
    assert set(manager.invalid()) == {"15-bad.json"} and "scheme 'tcp'" in manager.invalid()["15-bad.json"]
    assert ignored_counts(caplog) == {"15-bad.json": 1}


def test_hidden_and_non_json_files_are_ignored_silently(hookdir, manager, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    write(hookdir, ".hidden.json", "garbage")
    write(hookdir, "notes.txt", "garbage")
    write(hookdir, "10-a.json.bak", "garbage")
    write(hookdir, "10-a.json", GOOD)
    manager.start()
    assert names(manager.snapshot()) == ["10-a.json"]
    assert manager.invalid() == {}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_empty_hooks_warns_once(hookdir, manager, caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hookdir, "10-idle.json", {"remote-endpoint": "/idle.sock"})
    manager.start()
    for _ in range(3):
        manager._rescan()
    assert names(manager.snapshot()) == ["10-idle.json"]
    assert all(manager.plugins_for(h) == () for h in HookPoint)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "lists no runtime-hooks" in warnings[0].getMessage()


# -- manager: watching ----------------------------------------------------------------------

def test_create_modify_rename_delete_take_effect(hookdir, manager, caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    changes: list[int] = []
    manager._on_change = lambda: changes.append(1)
    manager.start()
    pre_start = HookPoint.PRE_START_CONTAINER

    write(hookdir, "20-b.json", {"remote-endpoint": "/b.sock", "runtime-hooks": ["PreStartContainer"]})
    wait_for(lambda: names(manager.plugins_for(pre_start)) == ["20-b.json"])
    assert changes

    in_flight = manager.plugins_for(pre_start)
    write(hookdir, "20-b.json", {"remote-endpoint": "/b2.sock", "runtime-hooks": ["PreStartContainer"],
                                 "failure-policy": "Fail"})
    wait_for(lambda: [r.endpoint for r in manager.plugins_for(pre_start)] == ["/b2.sock"])
    assert manager.plugins_for(pre_start)[0].failure_policy is FailurePolicy.FAIL
    assert in_flight[0].endpoint == "/b.sock"  # a call under way keeps what it started with

    write(hookdir, "30-c.json", {"remote-endpoint": "/c.sock", "runtime-hooks": ["PreStartContainer"]})
    wait_for(lambda: names(manager.plugins_for(pre_start)) == ["20-b.json", "30-c.json"])
    os.rename(hookdir / "30-c.json", hookdir / "05-c.json")
    wait_for(lambda: names(manager.plugins_for(pre_start)) == ["05-c.json", "20-b.json"])
    os.rename(hookdir / "05-c.json", hookdir / "05-c.json.disabled")
    wait_for(lambda: names(manager.plugins_for(pre_start)) == ["20-b.json"])
    os.rename(hookdir / "05-c.json.disabled", hookdir / "05-c.json")
    wait_for(lambda: names(manager.plugins_for(pre_start)) == ["05-c.json", "20-b.json"])

    os.unlink(hookdir / "20-b.json")
    wait_for(lambda: names(manager.plugins_for(pre_start)) == ["05-c.json"])

    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("plugin registered: file=20-b.json endpoint=/b.sock") for m in messages)
    assert any(m.startswith("plugin updated: file=20-b.json endpoint=/b2.sock") for m in messages)
    assert any(m.startswith("plugin removed: file=20-b.json") for m in messages)


def test_permission_changes_take_effect(hookdir, manager) -> None:
    path = write(hookdir, "10-a.json", GOOD)
    manager.start()
    assert names(manager.snapshot()) == ["10-a.json"]
    os.chmod(path, 0o666)
    wait_for(lambda: "10-a.json" in manager.invalid())
    assert manager.snapshot() == () and "world-writable" in manager.invalid()["10-a.json"]
    os.chmod(path, 0o644)
    wait_for(lambda: names(manager.snapshot()) == ["10-a.json"])
    os.chown(path, 1000, 1000)
    wait_for(lambda: "uid 1000" in manager.invalid().get("10-a.json", ""))
    os.chown(path, 0, 0)
    wait_for(lambda: names(manager.snapshot()) == ["10-a.json"])
    assert manager.invalid() == {}


def test_invalid_file_becomes_valid_again(hookdir, manager) -> None:
    write(hookdir, "10-a.json", '{"remote-endpoint": ')
    manager.start()
    assert "malformed JSON" in manager.invalid()["10-a.json"]
    write(hookdir, "10-a.json", GOOD)
    wait_for(lambda: names(manager.snapshot()) == ["10-a.json"])
    assert manager.invalid() == {}


def test_directory_deleted_and_recreated(hookdir, manager) -> None:
    write(hookdir, "10-a.json", GOOD)
    manager.start()
    assert names(manager.snapshot()) == ["10-a.json"]
    shutil.rmtree(hookdir)
    wait_for(lambda: manager.snapshot() == ())
    hookdir.mkdir()
    write(hookdir, "20-b.json", GOOD)
    wait_for(lambda: names(manager.snapshot()) == ["20-b.json"], deadline=RECREATED_DIR_DEADLINE)
    write(hookdir, "30-c.json", GOOD)  # the new directory is watched again, not only polled
    wait_for(lambda: names(manager.snapshot()) == ["20-b.json", "30-c.json"])


def test_on_change_only_when_something_changed(hookdir, manager) -> None:
    calls: list[int] = []
    manager._on_change = lambda: calls.append(1)
    write(hookdir, "10-a.json", GOOD)
    manager.start()
    first = len(calls)
    manager._rescan()
    manager._rescan()
    assert len(calls) == first
    write(hookdir, "11-bad.json", "{")
    wait_for(lambda: "11-bad.json" in manager.invalid())
    assert len(calls) == first + 1


def test_on_change_that_raises_does_not_stop_the_manager(hookdir, manager) -> None:
    def boom() -> None:
        raise RuntimeError("metrics exploded")

    manager._on_change = boom
    manager.start()
    write(hookdir, "10-a.json", GOOD)
    wait_for(lambda: names(manager.snapshot()) == ["10-a.json"])
    write(hookdir, "20-b.json", GOOD)
    wait_for(lambda: names(manager.snapshot()) == ["10-a.json", "20-b.json"])


def test_one_warning_per_bad_file_state(hookdir, manager, caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hookdir, "10-good.json", GOOD)
    write(hookdir, "20-bad.json", {"remote-endpoint": "relative.sock"})
    manager.start()
    for _ in range(3):
        manager._rescan()
    os.utime(hookdir / "10-good.json")  # watcher-driven rescans
    write(hookdir, "15-other.json", GOOD)
    wait_for(lambda: "15-other.json" in names(manager.snapshot()))
    time.sleep(pm.POLL_SECONDS * 1.5)  # let the periodic check run too
    assert ignored_counts(caplog) == {"20-bad.json": 1}

    write(hookdir, "20-bad.json", {"remote-endpoint": "/a.sock", "failure-policy": "Sometimes"})
    wait_for(lambda: "Sometimes" in manager.invalid().get("20-bad.json", ""))
    manager._rescan()
    assert ignored_counts(caplog) == {"20-bad.json": 2}

    write(hookdir, "20-bad.json", GOOD)
    wait_for(lambda: "20-bad.json" in names(manager.snapshot()))
    assert ignored_counts(caplog) == {"20-bad.json": 2}


# -- fuzz: hostile directories --------------------------------------------------------------

WRONG_VALUES: dict[str, list[Any]] = {
    "remote-endpoint": [None, 0, -1, 1.5, True, False, "", "relative", "tcp://h:1", "unix://rel",
                        "/" + "x" * 300, [], ["/a.sock"], {}, {"path": "/a.sock"}],
    "failure-policy": [0, 1.5, True, False, "fail", "IGNORE", "Maybe", [], ["Fail"], {}],
    "runtime-hooks": [0, True, "PreRunPodSandbox", {}, {"PreRunPodSandbox": True}, [1], [None],
                      ["PreRunPodSandbox", "Bogus"], [["PreRunPodSandbox"]], ["preStartContainer"]],
    "timeout-seconds": [True, False, "5", 0, -1, -0.001, 1e9, [], {}, [5]],
}


def _fuzz_files(hookdir: Path, rng: random.Random) -> set[str]:
    """Write 150+ files, each invalid for a known reason; return their names."""
    made: set[str] = set()

    def add(name: str, content: Any, mode: int = 0o644) -> Path:
        made.add(name)
        return write(hookdir, name, content, mode)

    good = json.dumps(GOOD)
    for i in range(40):
        add(f"f-bytes-{i:03d}.json", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000))))
    for i in range(30):
        cut = rng.randrange(0, len(good) - 1)  # never the final brace: always unterminated
        add(f"f-trunc-{i:03d}.json", good[:cut])
    for field, values in WRONG_VALUES.items():
        for j, value in enumerate(values):
            add(f"f-type-{field}-{j:02d}.json", {**GOOD, field: value})
    for i, text in enumerate(["[" * 65000, '{"a":' * 13000, '{"remote-endpoint":' + "[" * 30000,
                              "{" * 20 + "}" * 20, "", "   \n\t", "1", '"str"', "null", "true", "[]",
                              '{"remote-endpoint": "/a.sock", "timeout-seconds": NaN}',
                              '{"remote-endpoint": "/a.sock", "timeout-seconds": -Infinity}',
                              '{"remote-endpoint": "/a.sock", "timeout-seconds": 1' + "0" * 5000 + "}",
                              "\ufeff" + good, good + good, good.replace('"', "'")]):
        add(f"f-json-{i:03d}.json", text)
    add("f-utf8-000.json", b'{"remote-endpoint": "/\xff\xfe.sock"}')
    add("f-utf8-001.json", good.encode("utf-16"))
    huge = add("f-huge-10MiB.json", b"{")
    os.truncate(huge, 10 * 1024 * 1024)
    add("f-just-over-limit.json", good.encode() + b" " * schema.MAX_FILE_SIZE)
    for i, target in enumerate(["/etc/passwd", "/dev/zero", "/nonexistent", str(hookdir / "00-good.json"), "/"]):
        os.symlink(target, hookdir / f"f-link-{i}.json")
        made.add(f"f-link-{i}.json")
    for i, mode in enumerate([0o666, 0o664, 0o646, 0o777, 0o622]):
        add(f"f-mode-{i}.json", good, mode=mode)
    for i, (uid, gid) in enumerate([(1000, 0), (1000, 1000), (65534, 65534)]):
        os.chown(add(f"f-owner-{i}.json", good), uid, gid)
    os.mkfifo(hookdir / "f-fifo.json")
    (hookdir / "f-dir.json").mkdir()
    made |= {"f-fifo.json", "f-dir.json"}
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(hookdir / "f-sock.json"))
    made.add("f-sock.json")
    add("f-evil\nplugin registered: file=x.json.json", "{")
    return made


def test_fuzzed_directory_never_crashes_and_reports_each_file_once(hookdir, manager, caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hookdir, "00-good.json", GOOD)
    bad = _fuzz_files(hookdir, random.Random(20240301))
    assert len(bad) >= 150

    manager.start()
    assert names(manager.snapshot()) == ["00-good.json"]
    assert set(manager.invalid()) == bad
    assert all(reason for reason in manager.invalid().values())

    # more rescans of every kind: direct, watcher-driven, periodic
    manager._rescan()
    write(hookdir, "01-good.json", GOOD)
    wait_for(lambda: names(manager.snapshot()) == ["00-good.json", "01-good.json"])
    time.sleep(pm.POLL_SECONDS * 1.5)
    manager._rescan()

    assert names(manager.plugins_for(HookPoint.PRE_RUN_POD_SANDBOX)) == ["00-good.json", "01-good.json"]
    assert set(manager.invalid()) == bad
    assert ignored_counts(caplog) == {display_name(n): 1 for n in bad}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_fuzzed_files_appearing_while_running(hookdir, manager, caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    write(hookdir, "00-good.json", GOOD)
    manager.start()
    staging = hookdir.parent / "staging"  # built aside and renamed in, so each file has one state only
    staging.mkdir()
    bad = _fuzz_files(staging, random.Random(7))
    for name in sorted(bad):
        os.rename(staging / name, hookdir / name)
    wait_for(lambda: set(manager.invalid()) == bad, deadline=RECREATED_DIR_DEADLINE)
    manager._rescan()
    assert names(manager.snapshot()) == ["00-good.json"]
    assert ignored_counts(caplog) == {display_name(n): 1 for n in bad}


def test_config_dir_that_is_a_file(tmp_path) -> None:
    path = tmp_path / "hookserver.d"
    path.write_text("")
    with pytest.raises(NotADirectoryError, match="hookserver.d"):
        PluginsManager(path).start()

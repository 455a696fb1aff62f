"""The registration file plugins write and the proxy reads: one schema for both."""

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.hookapi import FailurePolicy, HookPoint, registration
from koord.hookapi.registration import Registration


def test_content_lists_stages_in_protocol_order(tmp_path):
    reg = Registration.of("koordlet", "/var/run/koordlet/koordlet.sock", "Fail",
                          {HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_RUN_POD_SANDBOX})
    path = reg.write(tmp_path)
    assert path == tmp_path / "koordlet.json"
    assert json.loads(path.read_text()) == {
        "remote-endpoint": "/var/run/koordlet/koordlet.sock",
        "failure-policy": "Fail",
        "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer"],
    }


def test_dir_created_and_mode_0644_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        path = Registration.of("p", "/s", FailurePolicy.IGNORE, [HookPoint.PRE_START_CONTAINER]) \
            .write(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_rewrite_replaces_by_rename_and_leaves_no_temp_file(tmp_path):
    first = Registration.of("p", "/s", "Ignore", [HookPoint.PRE_START_CONTAINER]).write(tmp_path)
    inode = first.stat().st_ino
    Registration.of("p", "/s2", "Ignore", [HookPoint.PRE_START_CONTAINER]).write(tmp_path)
    assert first.stat().st_ino != inode
    assert json.loads(first.read_text())["remote-endpoint"] == "/s2"
    assert os.listdir(tmp_path) == ["p.json"]


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = Registration.of("p", "/old", "Ignore", [HookPoint.PRE_START_CONTAINER]).write(tmp_path)

    def broken_dump(*a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(registration.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        Registration.of("p", "/new", "Ignore", [HookPoint.PRE_START_CONTAINER]).write(tmp_path)
    assert json.loads(path.read_text())["remote-endpoint"] == "/old"
    assert os.listdir(tmp_path) == ["p.json"]


def test_remove_deletes_the_file_and_tolerates_absence(tmp_path):
    reg = Registration.of("p", "/s", "Ignore", [])
    reg.write(tmp_path)
    reg.remove(tmp_path)
    reg.remove(tmp_path)
    assert os.listdir(tmp_path) == []


def test_bad_failure_policy_is_rejected():
    with pytest.raises(ValueError):
        Registration.of("p", "/s", "Sometimes", [])


@given(st.sets(st.sampled_from(list(HookPoint))), st.sampled_from(list(FailurePolicy)),
       st.one_of(st.none(), st.floats(min_value=0.001, max_value=3600)),
       st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789/._-", min_size=1, max_size=90))
def test_what_plugins_write_the_proxy_reads_back(hooks, policy, timeout, tail) -> None:
    """One schema for both ends: every registration a plugin can write parses to the same value."""
    reg = Registration.of("p", "/" + tail, policy, hooks, timeout)
    with tempfile.TemporaryDirectory() as d:
        assert Registration.read(reg.write(Path(d))) == reg


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "x\0y"])
def test_bad_plugin_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="plain file stem"):
        Registration.of(name, "/s", "Ignore", [])


@given(st.binary(max_size=300) | st.dictionaries(st.sampled_from(
    ["remote-endpoint", "failure-policy", "runtime-hooks", "timeout-seconds", "Remote-Endpoint", "x"]),
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.lists(st.sampled_from([*HookPoint, "Nope", ""]), max_size=8), max_size=5).map(
    lambda d: json.dumps(d).encode()))
def test_any_content_is_a_registration_or_an_error_naming_the_file(data: bytes) -> None:
    try:
        reg = Registration.parse(data, "10-fuzz.json")
    except registration.RegistrationError as exc:
        assert exc.file == "10-fuzz.json" and str(exc).startswith("10-fuzz.json: ")
        return
    assert reg.name == "10-fuzz" and reg.endpoint.startswith("/")
    assert set(reg.hooks) <= set(HookPoint) and (reg.timeout is None or 0 < reg.timeout <= 3600)

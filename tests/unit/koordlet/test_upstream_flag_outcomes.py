"""What becomes of each upstream flag that has no plain counterpart: honoured (its value
reaches the code), accepted and ignored (named in the start-up warning), or refused (exit 2
with a line naming it) when a non-default value would make upstream act differently."""

from __future__ import annotations

import logging

import pytest

from koord.koordlet import cli, flags, upstreamflags

HONOURED, IGNORED, REFUSED = "honoured", "ignored", "refused"

CASES = [
    # argv, outcome, (dest, value) for honoured / the refusal's text for refused
    ([], HONOURED, ("kube_api_qps", 20.0)),
    ([], HONOURED, ("kube_api_burst", 30)),
    (["-kube-api-qps=5.5"], HONOURED, ("kube_api_qps", 5.5)),
    (["-kube-api-qps=-1"], HONOURED, ("kube_api_qps", -1.0)),
    (["-kube-api-burst=7"], HONOURED, ("kube_api_burst", 7)),
    (["-kube-api-qps=nan"], REFUSED, "--kube-api-qps"),
    (["-kube-api-burst=-1"], REFUSED, "--kube-api-burst"),
    ([], HONOURED, ("enable_pprof", False)),
    (["-enable-pprof"], HONOURED, ("enable_pprof", True)),
    ([], HONOURED, ("pprof_addr", ("", 9317))),
    (["-pprof-addr=127.0.0.1:6060"], HONOURED, ("pprof_addr", ("127.0.0.1", 6060))),
    (["-pprof-addr=[::1]:6060"], HONOURED, ("pprof_addr", ("::1", 6060))),
    (["-pprof-addr=6060"], REFUSED, "--pprof-addr"),
    (["-pprof-addr=:99999"], REFUSED, "--pprof-addr"),
    ([], HONOURED, ("resource_force_update_seconds", 60)),
    (["-resource-force-update-seconds=5"], HONOURED, ("resource_force_update_seconds", 5)),
    (["-disable-no-deepcopy"], IGNORED, "disable-no-deepcopy"),
    (["-disable-no-deepcopy=false"], IGNORED, "disable-no-deepcopy"),
    (["-disable-no-deepcopy=maybe"], REFUSED, "--disable-no-deepcopy"),
    (["-audit-verbose=3"], IGNORED, "audit-verbose"),
    (["-audit-verbose=4"], REFUSED, "--audit-verbose: '4' refused: there is no audit log here"),
    (["-audit-log-dir=/var/log/koordlet"], IGNORED, "audit-log-dir"),
    (["-audit-log-dir=/tmp/audit"], REFUSED, "--audit-log-dir"),
    (["-audit-max-disk-space-mb=32"], REFUSED, "--audit-max-disk-space-mb"),
    (["-audit-max-concurrent-readers=4"], IGNORED, "audit-max-concurrent-readers"),
    (["-audit-max-events-limit=1"], REFUSED, "--audit-max-events-limit"),
    (["-docker-endpoint="], IGNORED, "docker-endpoint"),
    (["-docker-endpoint=/var/run/docker.sock"], REFUSED, "Docker is not supported"),
    (["-pouch-endpoint=/var/run/pouchd.sock"], REFUSED, "--pouch-endpoint"),
    (["-default-runtime-type=containerd"], IGNORED, "default-runtime-type"),
    (["-default-runtime-type=docker"], REFUSED, "only containerd"),
    (["-report-interval=0"], IGNORED, "report-interval"),
    (["-report-interval=60s"], REFUSED, "--report-interval"),
    (["-enable-pod-taskids=false"], IGNORED, "enable-pod-taskids"),
    (["-enable-pod-taskids"], REFUSED, "--enable-pod-taskids"),
    (["-qos-extension-plugins="], IGNORED, "qos-extension-plugins"),
    (["-qos-extension-plugins=Foo=true"], REFUSED, "no QoS extension plugin"),
    ([], HONOURED, ("disable_unset_cpu_quota", False)),
    (["-disable-unset-cpu-quota=true"], HONOURED, ("disable_unset_cpu_quota", True)),
    (["-tsdb-stripe-size=1"], IGNORED, "tsdb-stripe-size"),
    (["-configmap-name=other"], IGNORED, "configmap-name"),
    (["-vmodule=x=4"], IGNORED, "vmodule"),
]


@pytest.mark.parametrize("argv, outcome, want", CASES)
def test_flag_outcome(argv: list[str], outcome: str, want, capsys, caplog) -> None:
    if outcome == REFUSED:
        with pytest.raises(SystemExit) as exit_:
            flags.parse_args(argv)
        assert exit_.value.code == 2
        assert want in capsys.readouterr().err.splitlines()[-1]
        return
    args = flags.parse_args(argv)
    if outcome == HONOURED:
        dest, value = want
        assert getattr(args, dest) == value
        assert upstreamflags.ignored_flags(args) == []
        return
    assert upstreamflags.ignored_flags(args) == [want]
    with caplog.at_level(logging.WARNING):
        cli.warn_about_upstream_only(args)
    assert [r.getMessage() for r in caplog.records] == [
        f"upstream flags without a feature here, ignored: --{want}"]


@pytest.mark.parametrize("name", sorted(upstreamflags.NOT_IMPLEMENTED))
def test_every_ignored_flag_takes_upstreams_default(name: str) -> None:
    kind, default = upstreamflags.NOT_IMPLEMENTED[name]
    args = flags.parse_args([f"-{name}={default}"])
    assert upstreamflags.ignored_flags(args) == [name]


@pytest.mark.parametrize("name", sorted(upstreamflags.REFUSED_UNLESS_DEFAULT))
def test_every_refused_flag_takes_upstreams_default(name: str) -> None:
    kind, default, _ = upstreamflags.REFUSED_UNLESS_DEFAULT[name]
    args = flags.parse_args([f"-{name}={default}"])
    assert upstreamflags.ignored_flags(args) == [name]
    assert upstreamflags.refused_flags(args) == []


def test_no_flag_is_both_honoured_and_listed() -> None:
    honoured = {"kube-api-qps", "kube-api-burst", "enable-pprof", "pprof-addr", "resource-force-update-seconds"}
    listed = set(upstreamflags.NOT_IMPLEMENTED) | set(upstreamflags.REFUSED_UNLESS_DEFAULT)
    assert not honoured & listed
    assert not set(upstreamflags.NOT_IMPLEMENTED) & set(upstreamflags.REFUSED_UNLESS_DEFAULT)

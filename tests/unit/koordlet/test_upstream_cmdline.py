"""koordlet's command line as upstream's: Go flag syntax, every upstream flag and klog's,
AllAlpha/AllBeta, ``--version``, help texts, DaemonSet defaults; the proxy's pflag syntax."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord import klog
from koord.commonflags import version_text
from koord.koordlet import cli, flags, goflags, upstreamflags
from koord.runtimeproxy import config as proxy_config
from koord_testing.klogparse import parse

UPSTREAM_DAEMONSET_ARGS = [  # upstream config/manager/koordlet.yaml, verbatim
    "-cgroup-root-dir=/host-cgroup/", "-feature-gates=AllAlpha=true,AllBeta=true",
    "-runtime-hooks-network=unix", "-runtime-hooks-addr=/host-var-run-koordlet/koordlet.sock",
    "-runtime-hooks-host-endpoint=/var/run/koordlet//koordlet.sock", "--logtostderr=true", "--v=4"]

KNOWN = {"addr": False, "enable-node-metric-report": True, "v": False, "feature-gates": False,
         "logtostderr": True}


@pytest.mark.parametrize("argv, pairs, rest", [
    # Go's flag package, case by case
    (["-addr=:1"], [("addr", ":1")], []),
    (["--addr=:1"], [("addr", ":1")], []),
    (["-addr", ":1"], [("addr", ":1")], []),
    (["--addr", ":1"], [("addr", ":1")], []),
    (["-addr", "-v"], [("addr", "-v")], []),  # a value flag takes the next argument, whatever it is
    (["-addr="], [("addr", "")], []),
    (["-v=4", "--v", "2"], [("v", "4"), ("v", "2")], []),
    (["-enable-node-metric-report"], [("enable-node-metric-report", None)], []),
    (["-enable-node-metric-report=false"], [("enable-node-metric-report", "false")], []),
    (["-enable-node-metric-report", "false"], [("enable-node-metric-report", None)], ["false"]),
    (["-v=1", "pos", "-addr=:1"], [("v", "1")], ["pos", "-addr=:1"]),  # stops at the first non-flag
    (["-v=1", "--", "-addr=:1"], [("v", "1")], ["-addr=:1"]),
    (["-", "-v=1"], [], ["-", "-v=1"]),
    (["-h"], [("help", None)], []),
    (["-help", "-v=1"], [("help", None), ("v", "1")], []),
    (["-feature-gates=A=true"], [("feature-gates", "A=true")], []),
])
def test_go_flag_syntax(argv, pairs, rest):
    assert goflags.parse(argv, KNOWN) == (pairs, rest)


@pytest.mark.parametrize("argv, message", [
    (["-nope"], "flag provided but not defined: -nope"),
    (["---addr=x"], "bad flag syntax: ---addr=x"),
    (["-=x"], "bad flag syntax: -=x"),
    (["-addr"], "flag needs an argument: -addr"),
    (["-x"] * (goflags.MAX_ARGS + 1), "more than"),
])
def test_go_flag_errors(argv, message):
    with pytest.raises(goflags.GoFlagError, match=message):
        goflags.parse(argv, KNOWN)


def test_repeated_map_flags_add_up_others_last_wins():
    pairs = [("feature-gates", "A=true"), ("v", "1"), ("feature-gates", "B=false"), ("v", "3"),
             ("logtostderr", None)]
    assert goflags.to_argparse(pairs, KNOWN) == [
        "--feature-gates=A=true,B=false", "--v=1", "--v=3", "--logtostderr=true"]


names = st.sampled_from(sorted(KNOWN))
values = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)



@given(st.lists(st.tuples(names, values), max_size=6), st.lists(st.sampled_from(["-", "--"]), min_size=6, max_size=6),
       st.lists(st.booleans(), min_size=6, max_size=6))
def test_every_spelling_gives_the_same_flags(flag_values, dashes, joined):
    """-name=value, --name=value, -name value and --name value are one flag to Go; booleans
    are only ever joined."""
    argv, want = [], []
    for (name, value), dash, join in zip(flag_values, dashes, joined, strict=False):
        if KNOWN[name] and value not in ("true", "false"):
            value = "true"
        if join or KNOWN[name]:
            argv.append(f"{dash}{name}={value}")
        else:
            argv += [f"{dash}{name}", value]
        want.append((name, value))
    assert goflags.parse(argv, KNOWN) == (want, [])



@given(st.lists(st.text(max_size=20), max_size=10))
def test_any_command_line_parses_or_is_refused(argv):
    try:
        pairs, rest = goflags.parse(argv, KNOWN)
    except goflags.GoFlagError:
        return
    assert all(name in KNOWN or name == "help" for name, _ in pairs)
    assert rest == argv[len(argv) - len(rest):]


def test_upstream_daemonset_arguments_parse(tmp_path, monkeypatch):
    monkeypatch.delenv("agent_mode", raising=False)
    argv = [a.replace("/host-cgroup/", str(tmp_path) + "/") for a in UPSTREAM_DAEMONSET_ARGS]
    args = flags.parse_args(argv)
    assert args.cgroup_root_dir == tmp_path
    assert args.runtime_hooks_addr == "/host-var-run-koordlet/koordlet.sock"
    assert args.runtime_hooks_host_endpoint == "/var/run/koordlet//koordlet.sock"
    assert args.feature_gates["BECPUEvict"] and args.feature_gates["CPUBurst"]
    assert (args.v, args.logtostderr, args.unparsed) == (4, True, [])


@pytest.mark.parametrize("argv, dest, want", [
    # every boolean accepts -name, -name=true and -name=false
    (["-enable-node-metric-report=false"], "enable_node_metric_report", False),
    (["-enable-node-metric-report"], "enable_node_metric_report", True),
    (["--kubelet-insecure-tls=true"], "kubelet_insecure_tls", True),
    (["-only-evict-by-api=false"], "only_evict_by_api", False),
    (["-only-evict-by-api"], "only_evict_by_api", True),
    (["--enable-pagecache-collector=0"], "enable_pagecache_collector", False),
    (["--logtostderr=false"], "logtostderr", False),
    (["-enable-pprof=false"], "enable_pprof", False),
    (["--version=false"], "version", False),
    # klog and the log level
    (["-v", "4"], "v", 4),
    (["--stderrthreshold=error"], "stderrthreshold", logging.ERROR),
    (["-stderrthreshold=2"], "stderrthreshold", logging.ERROR),
    (["--log-level=WARNING"], "log_level", "warning"),
    (["--log-level", "debug"], "log_level", "debug"),
    (["-kube-api-qps=50.5"], "kube_api_qps", 50.5),
    (["-feature-gates=AllAlpha=true", "-feature-gates=BECPUEvict=false"], "feature_gates",
     pytest.param("merged", id="merged")),
])
def test_flag_spellings(argv, dest, want):
    args = flags.parse_args(argv)
    if dest == "feature_gates":
        assert args.feature_gates["CPUEvict"] and not args.feature_gates["BECPUEvict"]
    else:
        assert getattr(args, dest) == want


@pytest.mark.parametrize("argv, named", [
    (["-kube-api-qps=fast"], "--kube-api-qps"),
    (["-tsdb-min-block-duration=10"], "--tsdb-min-block-duration"),
    (["-stderrthreshold=LOUD"], "--stderrthreshold"),
    (["-v=-1"], "--v"),
    (["-log-level=trace"], "--log-level"),
    (["-enable-pprof=yes"], "--enable-pprof"),
    (["-no-such-flag"], "flag provided but not defined: -no-such-flag"),
    (["-runtime-hooks-addr"], "flag needs an argument: -runtime-hooks-addr"),
    (["-tsdb"], "flag provided but not defined"),  # no abbreviations, as Go
])
def test_bad_values_exit_2_naming_the_flag(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        flags.parse_args(argv)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_every_flag_states_its_default_and_every_boolean_takes_a_value():
    parser = flags.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert "default" in (action.help or ""), f"{action.option_strings} has no default in its help"
        if action.nargs == 0:
            raise AssertionError(f"{action.option_strings}: a boolean that refuses =false")
    text = parser.format_help()
    assert "runtime-hooks module" not in text and "QoS manager" in text


def test_every_upstream_flag_is_known():
    """Upstream's flag names (its InitFlags, options.go, controller-runtime, klog) all parse."""
    upstream = {
        "addr", "enable-pprof", "pprof-addr", "kube-api-qps", "kube-api-burst", "kubeconfig",
        "configmap-name", "configmap-namespace", "cgroup-root-dir", "sys-root-dir", "sys-fs-root-dir",
        "proc-root-dir", "var-run-root-dir", "var-lib-kubelet-dir", "run-root-dir", "containerd-endpoint",
        "docker-endpoint", "pouch-endpoint", "default-runtime-type", "hami-core-library-directory-path",
        "pod-resources-proxy-path", "xpu-device-infos-dir", "kubelet-preferred-address-type",
        "kubelet-sync-interval", "kubelet-sync-timeout", "kubelet-insecure-tls", "kubelet-read-only-port",
        "node-topology-sync-interval", "disable-query-kubelet-config", "report-interval",
        "enable-node-metric-report", "enable-pod-taskids", "xpu-enforce-collect-from-device-infos",
        "collect-res-used-interval", "collect-sys-metric-outdated-interval", "collect-node-cpu-info-interval",
        "collect-node-storage-info-interval", "cpi-collector-interval", "psi-collector-interval",
        "collect-cpi-timewindow", "coldpage-collector-interval", "enable-pagecache-collector",
        "enable-resctrl-collector", "resctrl-collector-interval", "metric-gc-interval-seconds",
        "metric-expire-seconds", "tsdb-path", "tsdb-retention-duration", "tsdb-enable-prometheus-metric",
        "tsdb-stripe-size", "tsdb-max-bytes", "tsdb-wal-segment-size", "tsdb-max-block-chunk-segment-size",
        "tsdb-min-block-duration", "tsdb-max-block-duration", "tsdb-head-chunks-write-buffer-size",
        "reconcile-interval-seconds", "cpu-suppress-interval-seconds", "cpu-evict-interval-seconds",
        "memory-evict-interval-seconds", "memory-evict-cool-time-seconds", "cpu-evict-cool-time-seconds",
        "only-evict-by-api", "qos-extension-plugins", "runtime-hooks-network", "runtime-hooks-addr",
        "runtime-hooks-failure-policy", "runtime-hooks-plugin-failure-policy", "runtime-hooks-config-path",
        "runtime-hooks-host-endpoint", "runtime-hooks-nri-connect-timeout", "runtime-hooks-nri-backoff-duration",
        "runtime-hooks-nri-backoff-cap", "runtime-hooks-nri-backoff-steps", "runtime-hooks-nri-backoff-factor",
        "runtime-hooks-nri-socket-path", "runtime-hooks-nri-plugin-name", "runtime-hooks-nri-plugin-index",
        "runtime-hooks-disable-stages", "enable-nri-runtime-hook", "runtime-hooks-reconcile-interval",
        "disable-unset-cpu-quota", "audit-log-dir", "audit-verbose", "audit-max-disk-space-mb",
        "audit-max-concurrent-readers", "audit-max-events-limit", "prediction-checkpoint-filepath",
        "prediction-cold-start-duration", "prediction-safety-margin-percent",
        "prediction-memory-histogram-decay-halflife", "prediction-cpu-histogram-decay-halflife",
        "prediction-training-interval", "prediction-model-expiration-duration",
        "prediction-model-checkpoint-interval", "prediction-model-checkpoint-max-per-step",
        "resource-force-update-seconds", "feature-gates",
        # klog
        "v", "vmodule", "logtostderr", "alsologtostderr", "stderrthreshold", "log_dir", "log_file",
        "log_file_max_size", "add_dir_header", "skip_headers", "skip_log_headers", "one_output",
        "log_backtrace_at", "legacy_stderr_threshold_behavior",
    }
    assert upstream - set(goflags.known_flags(flags.build_parser())) == set()


def test_ignored_upstream_flags_and_gates_are_named_once(caplog):
    args = flags.parse_args(["-tsdb-stripe-size=1", "-audit-verbose=3", "-disable-no-deepcopy",
                             "-feature-gates=TerwayQoS=true", "-v=1", "left", "over"])
    with caplog.at_level(logging.WARNING):
        cli.warn_about_upstream_only(args)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].endswith(": --audit-verbose, --disable-no-deepcopy, --tsdb-stripe-size")
    assert lines[1].endswith("(no effect): TerwayQoS")  # RdtResctrl is on by default and built
    assert "left over" in lines[2]


@pytest.mark.parametrize("argv, level, stderr_level, to_file, formatter", [
    ([], logging.INFO, logging.INFO, False, klog.TextFormatter),
    (["--v=4"], logging.DEBUG, logging.DEBUG, False, klog.TextFormatter),
    (["-v=3", "-logging-format=json"], logging.INFO, logging.INFO, False, klog.JSONFormatter),
    (["--v=4", "--log-level=warning"], logging.WARNING, logging.WARNING, False, klog.TextFormatter),
    (["--v=4", "-stderrthreshold=ERROR"], logging.DEBUG, logging.ERROR, False, klog.TextFormatter),
    (["--logtostderr=false"], logging.INFO, logging.INFO, True, klog.TextFormatter),
    (["--logtostderr=false", "-stderrthreshold=WARNING"], logging.INFO, logging.WARNING, True, klog.TextFormatter),
    (["--logtostderr=false", "-stderrthreshold=ERROR", "--alsologtostderr"], logging.INFO, logging.INFO, True,
     klog.TextFormatter),
])
def test_klog_flags_map_onto_logging(tmp_path, argv, level, stderr_level, to_file, formatter):
    args = flags.parse_args([*argv, f"--log_dir={tmp_path}"])
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        upstreamflags.configure_logging(args)
        stderr = [h for h in root.handlers if type(h) is logging.StreamHandler]
        files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
        assert root.level == level and [h.level for h in stderr] == [stderr_level]
        assert [Path(h.baseFilename) for h in files] == ([tmp_path / "koordlet.log"] if to_file else [])
        assert {type(h.formatter) for h in root.handlers} == {formatter}
    finally:
        logging.captureWarnings(False)
        for h in root.handlers:
            h.close()
        root.handlers, root.level = saved[0], saved[1]


@pytest.mark.parametrize("argv, headers, want", [
    ([], True, "W1128 01:02:03.000000 "),
    (["-skip_headers"], False, "watch out\n"),
    (["-skip_log_headers=true"], False, "watch out\n"),
])
def test_koordlet_logs_klog_lines_to_its_file(tmp_path, monkeypatch, argv, headers, want):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    log_file = tmp_path / "k.log"
    args = flags.parse_args([*argv, "-logtostderr=false", f"-log_file={log_file}"])
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        upstreamflags.configure_logging(args)
        record = logging.LogRecord("koordlet", logging.WARNING, __file__, 7, "watch out", (), None)
        record.created = 1795827723.0
        root.handle(record)
    finally:
        logging.captureWarnings(False)
        for h in root.handlers:
            h.close()
        root.handlers, root.level = saved[0], saved[1]
        monkeypatch.undo()
        time.tzset()
    text = log_file.read_text()
    assert text.startswith(want)
    if headers:
        assert [(e.severity, e.thread, e.file, e.line, e.message) for e in parse(text)] == [
            ("W", threading.get_native_id(), Path(__file__).name, 7, "watch out")]


def test_daemonset_mode_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("agent_mode", "dsMode")
    args = flags.parse_args([f"-cgroup-root-dir={tmp_path}"])
    assert args.runtime_hooks_config_path == Path("/host-etc-hookserver/")
    assert args.sys_root_dir == Path("/host-sys/") and args.sys_fs_root_dir == Path("/host-sys-fs/")
    assert args.containerd_endpoint == "/host-var-run/containerd/containerd.sock"
    assert args.runtime_hooks_addr == "/host-var-run-koordlet/koordlet.sock"
    monkeypatch.setenv("agent_mode", "hostMode")
    assert flags.parse_args([]).sys_root_dir == Path("/sys")


@pytest.mark.parametrize("flag, env, want", [
    ("/a/flag", "/b/env", "/a/flag"),
    (None, "/b/env:/c/other", "/b/env"),
    (None, "", None),
])
def test_kubeconfig_flag_then_env(monkeypatch, flag, env, want):
    monkeypatch.setenv("KUBECONFIG", env)
    args = flags.parse_args([f"--kubeconfig={flag}"] if flag else [])
    assert cli.kubeconfig_path(args) == (Path(want) if want else None)


@pytest.mark.parametrize("argv", [["--version"], ["-version"], ["-version=true"]])
def test_koordlet_version(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        flags.parse_args(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.strip() == version_text("koordlet") and "v1.8.0" in out


@pytest.mark.parametrize("binary", ["koord.koordlet", "koord.runtimeproxy"])
def test_both_binaries_print_their_version(binary):
    done = subprocess.run([sys.executable, "-m", binary, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "follows Koordinator v1.8.0" in done.stdout and len(done.stdout.splitlines()) == 1


@pytest.mark.parametrize("argv, ok", [
    # pflag: double-dash long flags, '=' or a separate value, no abbreviations, no single dash
    (["--koord-runtimeproxy-endpoint=/run/p.sock"], True),
    (["--koord-runtimeproxy-endpoint", "/run/p.sock"], True),
    (["--log-level=DEBUG"], True),
    (["--koord-runtimeproxy=/run/p.sock"], False),
    (["-koord-runtimeproxy-endpoint=/run/p.sock"], False),
    (["--log-level=trace"], False),
])
def test_proxy_parses_like_pflag(argv, ok, capsys):
    if ok:
        options = proxy_config.parse_options(argv)
        assert options.log_level in (None, "debug")
        return
    with pytest.raises(SystemExit) as exc:
        proxy_config.parse_options(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize("argv, want", [
    ([], (None, 0, "text", logging.INFO)),
    (["--v=4"], (None, 4, "text", logging.DEBUG)),
    (["--v", "2", "--logging-format", "json"], (None, 2, "json", logging.INFO)),
    (["--v=4", "--log-level=error"], ("error", 4, "text", logging.ERROR)),
    (["--v=-1"], "argument --v: '-1': want a level from 0 to 2147483647"),
    (["--logging-format=klog"], "argument --logging-format: 'klog': want text or json"),
    (["-v=4"], "unrecognized arguments: -v=4"),
])
def test_proxy_klog_flags(argv, want, capsys):
    if isinstance(want, tuple):
        o = proxy_config.parse_options(argv)
        assert (o.log_level, o.verbosity, o.logging_format, klog.python_level(o.log_level, o.verbosity)) == want
        return
    with pytest.raises(SystemExit):
        proxy_config.parse_options(argv)
    assert want in capsys.readouterr().err


def test_every_proxy_flag_states_its_default():
    for action in proxy_config.build_parser()._actions:
        if action.dest not in ("help", "version"):
            assert "default" in (action.help or ""), action.option_strings

"""A NodeSLO file flapping between valid and invalid versions, read by koordlet's own wiring
(the states informer as the command line builds it, the runtime-hook rules' callback, a
QoS strategy's thresholds): each invalid version is said once, in one line naming the
problem, and every reader keeps the last good version."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from koord.koordlet import cli, flags, qosmanager
from koord.koordlet.metriccache import MetricCache
from koord.koordlet.qosmanager.framework import Context
from koord.koordlet.statesinformer import FileObjectsSource
from koord_testing.cgroupfs import make_fake_v1_cgroup


def node_slo(percent: object = 50, enable: object = True) -> str:
    return ("apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: n1}\nspec:\n"
            "  resourceUsedThresholdWithBE:\n"
            f"    enable: {enable}\n    cpuSuppressThresholdPercent: {percent}\n"
            "    cpuSuppressPolicy: cfsQuota\n")


INVALID = [  # (id, file content, what the one line must say)
    ("truncated-yaml", node_slo()[:-20], "invalid YAML"),
    ("threshold-fifty", node_slo(percent="fifty"), "cpuSuppressThresholdPercent='fifty'"),
    ("enable-sometimes", node_slo(enable="sometimes"), "enable='sometimes'"),
    ("threshold-10e30", node_slo(percent=10**30), f"cpuSuppressThresholdPercent={10**30}"),
    ("list-for-object", "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: n1}\n"
                        "spec:\n  resourceUsedThresholdWithBE:\n  - enable: true\n",
     "resourceUsedThresholdWithBE: want an object, got list"),
]


@pytest.fixture
def koordlet_readers(tmp_path: Path):
    """The informer with the command line's checks and rule callback (nothing started: the
    file is read when the test says), and the QoS manager's context a strategy reads from."""
    root = tmp_path / "cg"
    make_fake_v1_cgroup(root, "kubepods/besteffort")
    slo = tmp_path / "nodeslo.yaml"
    args = flags.parse_args([
        "--runtime-hooks-addr", str(tmp_path / "k.sock"), "--cgroup-root-dir", str(root),
        "--node-slo-file", str(slo), "--tsdb-path", str(tmp_path / "tsdb"), "--addr", "",
        "--containerd-endpoint", str(tmp_path / "no-cri.sock"), "--runtime-hooks-reconcile-interval", "0"])
    koordlet = cli.Koordlet(args)
    source = koordlet.informer.objects
    assert isinstance(source, FileObjectsSource)
    source.bind(koordlet.informer.set_object)
    cache = MetricCache(None)
    manager = qosmanager.QOSManager(qosmanager.QOSConfig.from_args(args, node_name="n1"),
                                    koordlet.informer, cache, koordlet.executor)
    try:
        yield slo, source, manager.ctx
    finally:
        cache.close()


@pytest.mark.parametrize(("text", "problem"), [pytest.param(t, p, id=i) for i, t, p in INVALID])
def test_an_invalid_nodeslo_version_is_said_once_and_the_last_good_one_kept(
        koordlet_readers: tuple[Path, FileObjectsSource, Context], text: str, problem: str,
        caplog: pytest.LogCaptureFixture) -> None:
    slo, source, ctx = koordlet_readers
    for good, bad in ((40, text), (45, text)):  # flapping: valid, invalid, valid, invalid
        slo.write_text(node_slo(percent=good))
        source.reload()
        config = ctx.thresholds("BECPUSuppress")
        assert config is not None and config.cpu_suppress_threshold_percent == good
        caplog.clear()
        with caplog.at_level(logging.INFO):
            slo.write_text(bad)
            source.reload()  # what the file watcher does after the write settled
            config = ctx.thresholds("BECPUSuppress")  # what the strategy reads on its next tick
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(said) == 1, said
        assert problem in said[0] and "keeping the last good" in said[0], said
        assert config is not None and config.cpu_suppress_threshold_percent == good, \
            "the last good NodeSLO stays in force"
        assert ctx.informer.get_node_slo_object()["spec"]["resourceUsedThresholdWithBE"][
            "cpuSuppressThresholdPercent"] == good


def test_a_refused_version_is_said_once_however_often_a_source_delivers_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """A list-watch relists every few minutes: the same refused version is not said again,
    and a version refused after a good one in between is."""
    from koord.koordlet.statesinformer import NODE_SLO, StatesInformer

    def check(obj: dict) -> None:
        if obj["spec"].get("bad"):
            raise ValueError("spec.bad: want nothing here")

    informer = StatesInformer(checks={NODE_SLO: check})
    changes: list[int] = []
    informer.register_callback(NODE_SLO, lambda: changes.append(1))

    def version(n: int, bad: bool = False) -> dict:
        return {"metadata": {"name": "n1"}, "spec": {"n": n, **({"bad": True} if bad else {})}}
    with caplog.at_level(logging.INFO):
        informer.set_object(NODE_SLO, version(1))
        for _ in range(3):
            informer.set_object(NODE_SLO, version(2, bad=True))
        informer.set_object(NODE_SLO, version(3))
        informer.set_object(NODE_SLO, version(4, bad=True))
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    line = "states informer: NodeSLO n1 refused: spec.bad: want nothing here; keeping the last good version"
    assert said == [line, line]
    assert informer.get_node_slo_object() == version(3) and len(changes) == 2
    assert informer.has_synced()

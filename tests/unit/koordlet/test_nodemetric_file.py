"""--node-metric-file: status replaced atomically, metadata and spec kept, hostile files."""

import json
import logging
import os
import time

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from koord.koordlet.metriccache import NODE_CPU_USAGE, NODE_MEMORY_USAGE, MetricCache, Sample
from koord.koordlet.metrics import KoordletMetrics
from koord.koordlet.statesinformer import FileObjectsSource, StatesInformer
from koord.koordlet.statesinformer.reporter import FileStatusWriter, NodeMetricReporter

NODE_METRIC = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
               "metadata": {"name": "node1", "labels": {"x": "y"}},
               "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 1,
                                                "aggregateDurationSeconds": 60}}}
STATUS = {"updateTime": "2026-01-01T00:00:00Z", "podsMetric": []}


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_status_replaced_rest_kept_in_the_file_format(tmp_path, fmt):
    f = tmp_path / f"nm.{fmt}"
    dump = (lambda o: json.dumps(o)) if fmt == "json" else (lambda o: yaml.safe_dump(o))
    f.write_text(dump(dict(NODE_METRIC, status={"old": True})))
    os.chmod(f, 0o640)
    assert FileStatusWriter(f).write(NODE_METRIC, STATUS)
    text = f.read_text()
    assert text.lstrip().startswith("{") == (fmt == "json")
    assert yaml.safe_load(text) == dict(NODE_METRIC, status=STATUS)
    assert os.stat(f).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == [f.name]  # no temp file left


@pytest.mark.parametrize("content", [b"{not json", b"- a\n- list\n", b"", b"x" * (5 * 2**20)])
def test_garbage_file_is_left_alone_and_logged_once(tmp_path, caplog, content):
    f = tmp_path / "nm.json"
    f.write_bytes(content)
    writer = FileStatusWriter(f)
    with caplog.at_level(logging.ERROR):
        assert not writer.write(NODE_METRIC, STATUS)
        assert not writer.write(NODE_METRIC, STATUS)
    assert f.read_bytes() == content
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and str(f) in errors[0] and "not written" in errors[0]


def test_path_that_is_not_a_file_is_logged_and_the_writer_recovers(tmp_path, caplog):
    f = tmp_path / "nm.json"
    f.mkdir()
    writer = FileStatusWriter(f)
    with caplog.at_level(logging.ERROR):
        assert not writer.write(NODE_METRIC, STATUS)
    assert any("cannot read" in r.getMessage() and str(f) in r.getMessage() for r in caplog.records)
    f.rmdir()
    f.write_text(json.dumps(NODE_METRIC))
    assert writer.write(NODE_METRIC, STATUS)


def test_unwritable_target_keeps_old_content(tmp_path, caplog, monkeypatch):
    f = tmp_path / "nm.json"
    f.write_text(json.dumps(NODE_METRIC))
    writer = FileStatusWriter(f)

    def no_space(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", no_space)
    with caplog.at_level(logging.ERROR):
        assert not writer.write(NODE_METRIC, STATUS)
    assert json.loads(f.read_text()) == NODE_METRIC
    assert any("No space left" in r.getMessage() for r in caplog.records)
    assert [p.name for p in tmp_path.iterdir()] == ["nm.json"]


def test_reporter_loop_writes_within_one_interval_and_prometheus_matches(tmp_path):
    f = tmp_path / "nm.json"
    f.write_text(json.dumps(NODE_METRIC))
    informer = StatesInformer(objects=FileObjectsSource({"node_metric": f}))
    cache = MetricCache(None)
    now = time.time()
    cache.append([Sample(NODE_CPU_USAGE, {}, now - 1, 1.25),
                  Sample(NODE_MEMORY_USAGE, {}, now - 1, 300 * 2**20)])
    metrics = KoordletMetrics("node1")
    reporter = NodeMetricReporter(informer, cache, FileStatusWriter(f), metrics)
    informer.start()
    reporter.start()
    try:
        deadline = time.monotonic() + 5
        while "status" not in json.loads(f.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        written = json.loads(f.read_text())
    finally:
        reporter.stop()
        informer.stop()
        cache.close()
    assert written["spec"] == NODE_METRIC["spec"] and written["metadata"] == NODE_METRIC["metadata"]
    assert written["status"]["nodeMetric"]["nodeUsage"] == {
        "resources": {"cpu": "1250m", "memory": "300Mi"}}
    value = metrics.registry.get_sample_value
    assert value("koordlet_node_metric_node_usage",
                 {"node": "node1", "resource": "cpu", "unit": "core"}) == 1.25
    assert value("koordlet_node_metric_node_usage",
                 {"node": "node1", "resource": "memory", "unit": "byte"}) == 300 * 2**20


@pytest.mark.parametrize("content,reason", [
    (b"a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b]\n",
     "alias"),
    (b"spec: " + b"[" * 100 + b"]" * 100 + b"\n", "nested more than"),
    (b'{"spec": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested more than"),
])
def test_hostile_yaml_is_rejected_naming_why(tmp_path, caplog, content, reason):
    from koord.koordlet.statesinformer.objects import parse_object
    with pytest.raises(ValueError, match=reason):
        parse_object(content, tmp_path / "nm.yaml", "NodeMetric")
    f = tmp_path / "nm.yaml"
    f.write_bytes(content)
    assert not FileStatusWriter(f).write(NODE_METRIC, STATUS)
    assert f.read_bytes() == content


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_parse_object_returns_a_mapping_or_a_value_error(raw):
    from koord.koordlet.statesinformer.objects import parse_object
    try:
        assert isinstance(parse_object(raw, "f", "Node"), dict)
    except ValueError as exc:
        assert "Node file f" in str(exc)


def test_node_metric_seen_after_start_shortens_the_wait(tmp_path):
    """Before the NodeMetric is known the default interval is 60 s; seeing one with 1 s must
    not leave the reporter asleep for the rest of the minute."""
    f = tmp_path / "nm.json"
    f.write_text(json.dumps(NODE_METRIC))
    informer = StatesInformer()
    cache = MetricCache(None)
    reporter = NodeMetricReporter(informer, cache, FileStatusWriter(f))
    reporter.start()
    try:
        time.sleep(0.2)
        informer.set_object("node_metric", NODE_METRIC)
        deadline = time.monotonic() + 5
        while "status" not in json.loads(f.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "status" in json.loads(f.read_text())
    finally:
        reporter.stop()
        cache.close()


def test_own_writes_are_neither_parsed_again_nor_read_back_by_the_informer(tmp_path, monkeypatch):
    """A report reuses the document it wrote last time, and the file source skips koordlet's
    own status writes; a user's edit in between is parsed and delivered as before."""
    from koord.koordlet.statesinformer import objects, reporter

    f = tmp_path / "nm.yaml"
    f.write_text(yaml.safe_dump(NODE_METRIC))
    parsed = []
    real_parse = objects.parse_object
    monkeypatch.setattr(reporter, "parse_object", lambda *a: parsed.append(a[1]) or real_parse(*a))
    source = FileObjectsSource({"node_metric": f})
    delivered = []
    source.bind(lambda kind, obj: delivered.append(obj))
    source.reload()
    writer = FileStatusWriter(f, on_written=lambda raw: source.expect("node_metric", raw))
    for i in range(3):
        assert writer.write(NODE_METRIC, dict(STATUS, updateTime=f"2026-01-01T00:00:0{i}Z"))
        source.reload()
    assert len(parsed) == 1  # the first report only
    assert len(delivered) == 1  # the initial load only
    assert yaml.safe_load(f.read_text())["status"]["updateTime"] == "2026-01-01T00:00:02Z"
    edited = dict(NODE_METRIC, spec={"metricCollectPolicy": {"reportIntervalSeconds": 30}})
    f.write_text(yaml.safe_dump(edited))
    source.reload()
    assert delivered[-1]["spec"] == edited["spec"]
    assert writer.write(NODE_METRIC, STATUS) and len(parsed) == 2
    assert yaml.safe_load(f.read_text()) == dict(edited, status=STATUS)

"""File-backed States Informer: loads, watches, keeps the last good value."""

import json
import logging
import os
import queue
import time

import pytest

from koord.koordlet.statesinformer import FileObjectsSource, StatesInformer

WAIT = 10.0  # generous upper bound for the watcher; tests finish as soon as the event arrives

SLO_YAML = """\
apiVersion: slo.koordinator.sh/v1alpha1
kind: NodeSLO
metadata: {name: node1}
spec:
  resourceQOSStrategy:
    beClass:
      cpuQOS: {enable: true, groupIdentity: -1}
"""
NODE_JSON = {"apiVersion": "v1", "kind": "Node",
             "metadata": {"name": "node1", "annotations": {"a": "1"}}}


def make_informer(**files):
    """An informer over files whose node/node_slo changes land in a queue as (slo, node)."""
    kinds = {"node_slo_file": "node_slo", "node_file": "node", "node_metric_file": "node_metric"}
    source = FileObjectsSource({kinds[k]: v for k, v in files.items()})
    informer = StatesInformer(objects=source)
    changes: queue.Queue = queue.Queue()
    for kind in ("node", "node_slo"):
        informer.register_callback(
            kind, lambda: changes.put((informer.get_node_slo_object(), informer.get_node())))
    source.bind(informer.set_object)
    informer.reload = source.reload  # tests reload synchronously instead of waiting for events
    return informer, changes


@pytest.fixture
def informer_for(tmp_path):
    made = []

    def make(**files):
        informer, changes = make_informer(**files)
        informer.start()
        made.append(informer)
        return informer, changes

    yield make
    for informer in made:
        informer.stop()


def test_start_loads_yaml_and_json(tmp_path, informer_for):
    (tmp_path / "slo.yaml").write_text(SLO_YAML)
    (tmp_path / "node.json").write_text(json.dumps(NODE_JSON))
    informer, changes = informer_for(node_slo_file=tmp_path / "slo.yaml",
                                     node_file=tmp_path / "node.json")
    changes.get(timeout=WAIT)  # one callback per object
    slo, node = changes.get(timeout=WAIT)
    assert slo["spec"]["resourceQOSStrategy"]["beClass"]["cpuQOS"]["groupIdentity"] == -1
    assert node == NODE_JSON
    assert informer.get_node() == NODE_JSON


def test_edit_in_place_is_seen(tmp_path, informer_for):
    f = tmp_path / "slo.yaml"
    f.write_text(SLO_YAML)
    informer, changes = informer_for(node_slo_file=f)
    changes.get(timeout=WAIT)
    f.write_text(SLO_YAML.replace("-1", "0"))
    slo, node = changes.get(timeout=WAIT)
    assert slo["spec"]["resourceQOSStrategy"]["beClass"]["cpuQOS"]["groupIdentity"] == 0
    assert node is None


def test_atomic_replace_is_seen(tmp_path, informer_for):
    f = tmp_path / "node.json"
    f.write_text(json.dumps(NODE_JSON))
    informer, changes = informer_for(node_file=f)
    changes.get(timeout=WAIT)
    tmp = tmp_path / ".node.json.tmp"
    tmp.write_text(json.dumps({**NODE_JSON, "metadata": {"name": "node1", "annotations": {"a": "2"}}}))
    os.replace(tmp, f)
    _, node = changes.get(timeout=WAIT)
    assert node["metadata"]["annotations"] == {"a": "2"}


def test_watched_bad_file_keeps_last_good_value_until_fixed(tmp_path, informer_for, caplog):
    f = tmp_path / "slo.yaml"
    f.write_text(SLO_YAML)
    informer, changes = informer_for(node_slo_file=f)
    good, _ = changes.get(timeout=WAIT)
    with caplog.at_level(logging.ERROR, logger="koord.koordlet.statesinformer"):
        f.write_text("spec: [unclosed\n")
        informer.reload()
    assert any("invalid YAML/JSON" in r.getMessage() and str(f) in r.getMessage()
               for r in caplog.records)
    assert informer.get_node_slo_object() == good
    f.write_text(SLO_YAML.replace("-1", "1"))
    slo, _ = changes.get(timeout=WAIT)
    assert slo["spec"]["resourceQOSStrategy"]["beClass"]["cpuQOS"]["groupIdentity"] == 1


def test_bad_file_direct_reload_keeps_value_and_logs_once(tmp_path, caplog):
    f = tmp_path / "slo.yaml"
    f.write_text(SLO_YAML)
    informer, changes = make_informer(node_slo_file=f)
    informer.reload()
    seen = [changes.get_nowait()[0]]
    f.write_text("- a list, not an object\n")
    with caplog.at_level(logging.ERROR, logger="koord.koordlet.statesinformer"):
        informer.reload()
        informer.reload()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert str(f) in errors[0] and "mapping" in errors[0]
    assert changes.empty() and informer.get_node_slo_object() == seen[0]


def test_unchanged_content_does_not_call_back(tmp_path):
    f = tmp_path / "node.json"
    f.write_text(json.dumps(NODE_JSON))
    informer, changes = make_informer(node_file=f)
    informer.reload()
    f.write_text(json.dumps(NODE_JSON, indent=4))
    informer.reload()
    assert changes.qsize() == 1


def test_missing_file_is_picked_up_when_it_appears(tmp_path, informer_for, caplog):
    f = tmp_path / "slo.yaml"
    with caplog.at_level(logging.ERROR, logger="koord.koordlet.statesinformer"):
        informer, changes = informer_for(node_slo_file=f)
    assert any("not found" in r.getMessage() and str(f) in r.getMessage() for r in caplog.records)
    assert changes.empty()
    f.write_text(SLO_YAML)
    slo, _ = changes.get(timeout=WAIT)
    assert slo["kind"] == "NodeSLO"


def test_informer_synced_without_files_then_picks_them_up(tmp_path):
    """A missing NodeSLO file must not keep /readyz down: no file is an answer (no object)."""
    informer, changes = make_informer(node_slo_file=tmp_path / "slo.yaml", node_file=tmp_path / "n.json")
    informer.reload()
    assert informer.has_synced() and informer.get_node_slo() is None and changes.empty()
    (tmp_path / "slo.yaml").write_text(SLO_YAML)
    informer.reload()
    assert informer.get_node_slo_object()["kind"] == "NodeSLO"
    (tmp_path / "slo.yaml").unlink()
    informer.reload()
    assert informer.get_node_slo_object()["kind"] == "NodeSLO"  # last good object kept


# A 50,000-deep list used to raise RecursionError in the watcher thread and end it:
# koordlet kept answering hooks but never applied another NodeSLO or Node change.
HOSTILE_DOCUMENTS = [
    ("deep list", "spec: " + "[" * 50000 + "]" * 50000 + "\n", "nested more than"),
    ("deep map", "spec: " + "{a: " * 50000 + "1" + "}" * 50000 + "\n", "nested more than"),
    ("alias bomb", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n", "alias"),
    ("5 MB", "spec:\n" + "".join(f"  k{i}: {'x' * 40}\n" for i in range(110_000)), "bytes, more than"),
    ("not a mapping", "- 1\n- 2\n", "expected an object"),
]


@pytest.mark.parametrize("content, reason", [c[1:] for c in HOSTILE_DOCUMENTS],
                         ids=[c[0] for c in HOSTILE_DOCUMENTS])
def test_hostile_file_keeps_last_good_value_and_the_watcher_keeps_running(
        tmp_path, informer_for, caplog, content, reason):
    f = tmp_path / "slo.yaml"
    f.write_text(SLO_YAML)
    informer, changes = informer_for(node_slo_file=f)
    good, _ = changes.get(timeout=WAIT)
    with caplog.at_level(logging.ERROR, logger="koord.koordlet.statesinformer"):
        f.write_text(content)
        # The watcher reads it and logs why it is refused; then a good file must still be applied.
        deadline = time.monotonic() + WAIT
        while not any(reason in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, f"no log line saying {reason!r}"
            time.sleep(0.05)
    assert any(str(f) in r.getMessage() and "keeping the last good value" in r.getMessage()
               for r in caplog.records)
    assert informer.get_node_slo_object() == good
    f.write_text(SLO_YAML.replace("-1", "1"))
    slo, _ = changes.get(timeout=WAIT)
    assert slo["spec"]["resourceQOSStrategy"]["beClass"]["cpuQOS"]["groupIdentity"] == 1

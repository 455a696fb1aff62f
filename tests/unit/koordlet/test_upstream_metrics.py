"""koordlet's metrics against upstream's: every upstream ``koordlet_*`` name is exported with
upstream's type, labels and page, or listed below with why koordlet has no data for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from koord.metricsdoc import MetricDoc, catalogue

UPSTREAM = json.loads((Path(__file__).parents[2] / "data" / "upstream-koordlet-metrics-a7a1b76b.json").read_text())

MISSING = {
    "koordlet_container_cpi": "no CPI collector: cycles and instructions need perf events, not built",
    "koordlet_collect_node_local_storage_info_status": "no node storage info collector",
}
"""Upstream names koordlet does not export, and why (one line each): no data, or data not wired yet."""


def exported() -> dict[str, MetricDoc]:
    return {d.name: d for d in catalogue() if d.binary == "koordlet"}


def test_the_upstream_list_is_upstreams_whole_list():
    names = [m["name"] for m in UPSTREAM["metrics"]]
    assert UPSTREAM["commit"].startswith("a7a1b76b")
    assert len(names) == len(set(names)) == 41
    assert all(n.startswith("koordlet_") for n in names)


@pytest.mark.parametrize("name", sorted(m["name"] for m in UPSTREAM["metrics"]))
def test_each_upstream_name_is_exported_or_listed_missing_never_both(name):
    assert (name in exported()) != (name in MISSING), f"{name}: exported and listed missing, or neither"


def test_the_missing_list_names_only_upstream_metrics_each_with_a_reason():
    upstream = {m["name"] for m in UPSTREAM["metrics"]}
    assert set(MISSING) <= upstream
    assert all(reason.strip() and "\n" not in reason for reason in MISSING.values())


@pytest.mark.parametrize("metric", [m for m in UPSTREAM["metrics"] if m["name"] not in MISSING],
                         ids=lambda m: m["name"])
def test_exported_upstream_metrics_have_upstreams_type_labels_and_page(metric):
    ours = exported()[metric["name"]]
    assert (ours.type, sorted(ours.labels), ours.page) == (
        metric["type"], metric["labels"], f"/{metric['page']}-metrics")

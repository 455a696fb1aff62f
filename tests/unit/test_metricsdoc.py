"""docs/metrics.md is what the code registers, and the catalogue behind it misses no metric."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from koord.metricsdoc import catalogue, render

ROOT = Path(__file__).parents[2]
DEFINITION = re.compile(r'(?:Gauge|Counter|Histogram|MetricFamily)\(\s*"((?:koordlet|koord_runtime_proxy)_\w+)"')


def test_docs_metrics_md_is_generated_from_the_code():
    assert (ROOT / "docs" / "metrics.md").read_text() == render(catalogue()), (
        "docs/metrics.md drifted: run `python -m koord.metricsdoc > docs/metrics.md`")


def defined_in(text: str) -> set[str]:
    return set(DEFINITION.findall(text))


@pytest.mark.parametrize("source,names", [
    ('Gauge("koordlet_a", "h", ["node"])', {"koordlet_a"}),
    ('CounterMetricFamily(\n    "koord_runtime_proxy_b", "h")', {"koord_runtime_proxy_b"}),
    ('Histogram("other_c", "h")', set()),
    ('log("koordlet_d")', set()),
])
def test_the_definition_pattern_finds_metric_constructors_only(source, names):
    assert defined_in(source) == names


def test_every_metric_defined_in_src_is_in_the_catalogue():
    documented = {d.name.removesuffix("_total") for d in catalogue()}
    defined = set().union(*(defined_in(p.read_text()) for p in (ROOT / "src").rglob("*.py")))
    assert {n.removesuffix("_total") for n in defined} - documented == set()

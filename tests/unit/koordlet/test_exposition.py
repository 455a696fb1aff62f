"""koordlet's pages written as upstream's Go client writes them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from koord.koordlet.exposition import go_float, render


@pytest.mark.parametrize("value,go", [
    (1.0, "1"), (0.0, "0"), (-0.0, "0"), (3.0, "3"), (100.0, "100"), (-2.5, "-2.5"), (0.5, "0.5"),
    (123456.0, "123456"), (1e6, "1e+06"), (1234567.0, "1.234567e+06"), (1732766000.5, "1.7327660005e+09"),
    (2.0**30, "1.073741824e+09"), (0.0001, "0.0001"), (0.00001, "1e-05"), (1.5e-7, "1.5e-07"),
    (1e21, "1e+21"), (1e100, "1e+100"), (0.64, "0.64"), (163.84, "163.84"),
    (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"),
])
def test_numbers_are_written_as_gos_strconv_g_shortest(value, go):
    assert go_float(value) == go


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_number_reads_back_exactly(value):
    assert float(go_float(value)) == value


def scrape(build) -> str:
    registry = CollectorRegistry()
    build(registry)
    return render([registry]).decode()


@pytest.mark.parametrize("build,want", [
    # a counter keeps its family's name: no _total, no _created
    (lambda r: Counter("koordlet_pod_eviction", "evictions", ["reason", "node"], registry=r)
     .labels("evictByCPU", "n1").inc(2),
     '# HELP koordlet_pod_eviction evictions\n# TYPE koordlet_pod_eviction counter\n'
     'koordlet_pod_eviction{node="n1",reason="evictByCPU"} 2\n'),
    # a family without a series is left out, as a Go vector without children is
    (lambda r: Gauge("koordlet_start_time", "start", ["node"], registry=r), ""),
    # histogram: labels sorted by name, le last, no _created
    (lambda r: Histogram("koordlet_h", "h", ["stage", "hook"], buckets=(0.01, 0.04), registry=r)
     .labels("PreRunPodSandbox", "cpuset").observe(0.02),
     '# HELP koordlet_h h\n# TYPE koordlet_h histogram\n'
     'koordlet_h_bucket{hook="cpuset",stage="PreRunPodSandbox",le="0.01"} 0\n'
     'koordlet_h_bucket{hook="cpuset",stage="PreRunPodSandbox",le="0.04"} 1\n'
     'koordlet_h_bucket{hook="cpuset",stage="PreRunPodSandbox",le="+Inf"} 1\n'
     'koordlet_h_sum{hook="cpuset",stage="PreRunPodSandbox"} 0.02\n'
     'koordlet_h_count{hook="cpuset",stage="PreRunPodSandbox"} 1\n'),
    # label values and help escaped as Go escapes them
    (lambda r: Gauge("koordlet_g", 'a\\b\nc', ["pod_name"], registry=r).labels('x"y\\z\n').set(1),
     '# HELP koordlet_g a\\\\b\\nc\n# TYPE koordlet_g gauge\nkoordlet_g{pod_name="x\\"y\\\\z\\n"} 1\n'),
    # families sorted by name, whatever the registration order
    (lambda r: (Gauge("koordlet_b", "b", registry=r).set(1), Gauge("koordlet_a", "a", registry=r).set(2)),
     '# HELP koordlet_a a\n# TYPE koordlet_a gauge\nkoordlet_a 2\n# HELP koordlet_b b\n# TYPE koordlet_b gauge\n'
     'koordlet_b 1\n'),
])
def test_pages_are_written_as_upstreams_go_client_writes_them(build, want):
    assert scrape(build) == want


def test_prometheus_parsers_read_the_pages_back():
    text = scrape(lambda r: Counter("koordlet_pod_eviction", "e", ["node"], registry=r).labels("n1").inc())
    [family] = text_string_to_metric_families(text)
    assert (family.name, family.type, [s.value for s in family.samples]) == ("koordlet_pod_eviction", "counter", [1])

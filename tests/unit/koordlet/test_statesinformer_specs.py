"""NodeSLO and NodeMetric specs over upstream's defaults."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.hookapi import parse_duration
from koord.koordlet.statesinformer import StatesInformer
from koord.koordlet.statesinformer.specs import (
    format_go_duration,
    merge_over,
    merged_node_slo,
    node_metric_collect_policy,
)


def test_node_slo_sections_merge_over_defaults():
    slo = {"metadata": {"name": "n"},
           "spec": {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 50},
                    "resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True}}}}}
    merged = merged_node_slo(slo)["spec"]
    be = merged["resourceUsedThresholdWithBE"]
    assert be == {"enable": True, "cpuSuppressThresholdPercent": 50, "cpuSuppressPolicy": "cpuset",
                  "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"}
    assert merged["resourceQOSStrategy"]["beClass"]["resctrlQOS"] == {
        "enable": True, "catRangeStartPercent": 0, "catRangeEndPercent": 30, "mbaPercent": 100}
    assert merged["resourceQOSStrategy"]["lsClass"]["resctrlQOS"]["catRangeEndPercent"] == 100
    assert merged_node_slo({"spec": "garbage"})["spec"]["resourceUsedThresholdWithBE"]["enable"] is False


@pytest.mark.parametrize("default,received,want", [
    ({"a": 1, "b": 2}, {"a": 3}, {"a": 3, "b": 2}),
    ({"a": {"x": 1, "y": 2}}, {"a": {"y": 5}}, {"a": {"x": 1, "y": 5}}),
    ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
    ({"a": {"x": 1}}, {"a": None}, {"a": None}),
    ({"a": 1}, {"z": {"k": 1}}, {"a": 1, "z": {"k": 1}}),
])
def test_merge_over_is_go_json_unmarshal_over_a_copy(default, received, want):
    before = repr(default)
    assert merge_over(default, received) == want
    assert repr(default) == before


def test_informer_get_node_slo_is_merged():
    informer = StatesInformer()
    informer.set_object("node_slo", {"spec": {}})
    node_slo = informer.get_node_slo()
    assert node_slo is not None and node_slo.thresholds.cpu_suppress_threshold_percent == 65
    assert node_slo.merged["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 65
    assert informer.get_node_slo_object() == {"spec": {}}


# upstream updateMetricSpec: empty -> defaults; getNodeMetricReportInterval: nil -> 60 s
@pytest.mark.parametrize("node_metric", [None, {}, {"spec": {}}, {"spec": {"metricCollectPolicy": {}}},
                                         {"spec": {"metricCollectPolicy": {"reportIntervalSeconds": None}}}])
def test_node_metric_spec_defaults(node_metric):
    assert node_metric_collect_policy(node_metric) == {
        "aggregateDurationSeconds": 300, "reportIntervalSeconds": 60,
        "durations": [300.0, 600.0, 1800.0], "nodeMemoryCollectPolicy": "usageWithoutPageCache"}


def test_node_metric_spec_given_values_and_small_intervals():
    policy = node_metric_collect_policy({"spec": {"metricCollectPolicy": {
        "aggregateDurationSeconds": 5, "reportIntervalSeconds": 1,
        "nodeAggregatePolicy": {"durations": ["10s", "1m0s"]},
        "nodeMemoryCollectPolicy": "usageWithPageCache"}}})
    assert policy == {"aggregateDurationSeconds": 5, "reportIntervalSeconds": 1,
                      "durations": [10.0, 60.0], "nodeMemoryCollectPolicy": "usageWithPageCache"}


@pytest.mark.parametrize("policy,field", [
    ({"reportIntervalSeconds": 0}, "reportIntervalSeconds"),
    ({"reportIntervalSeconds": "60"}, "reportIntervalSeconds"),
    ({"aggregateDurationSeconds": 1.5}, "aggregateDurationSeconds"),
    ({"aggregateDurationSeconds": True}, "aggregateDurationSeconds"),
    ({"nodeAggregatePolicy": {"durations": ["5 minutes"]}}, "durations[0]"),
    ({"nodeAggregatePolicy": {"durations": [300]}}, "durations[0]"),
    ({"nodeAggregatePolicy": {"durations": ["0s"]}}, "durations[0]"),
    ({"nodeAggregatePolicy": {"durations": "5m"}}, "durations"),
    ({"nodeAggregatePolicy": {"durations": ["1s"] * 17}}, "durations"),
    ({"nodeAggregatePolicy": []}, "nodeAggregatePolicy"),
    ({"nodeMemoryCollectPolicy": "all"}, "nodeMemoryCollectPolicy"),
])
def test_node_metric_spec_rejects_bad_fields_naming_them(policy, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        node_metric_collect_policy({"spec": {"metricCollectPolicy": policy}})


def test_informer_falls_back_to_default_spec_on_a_bad_one():
    informer = StatesInformer()
    informer.set_object("node_metric", {"spec": {"metricCollectPolicy": {"reportIntervalSeconds": -1}}})
    assert informer.get_node_metric_spec()["reportIntervalSeconds"] == 60


@pytest.mark.parametrize("seconds,text", [(300, "5m0s"), (600, "10m0s"), (1800, "30m0s"),
                                          (3600, "1h0m0s"), (90, "1m30s"), (5, "5s"), (0, "0s"),
                                          (0.5, "500ms"), (3725, "1h2m5s")])
def test_format_go_duration(seconds, text):
    assert format_go_duration(seconds) == text


@given(st.integers(min_value=1, max_value=10**7))
def test_go_duration_round_trips(seconds):
    assert parse_duration(format_go_duration(seconds)) == seconds


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                    max_leaves=10))
def test_collect_policy_never_crashes_on_any_json(value):
    try:
        node_metric_collect_policy({"spec": {"metricCollectPolicy": value}})
    except ValueError:
        pass

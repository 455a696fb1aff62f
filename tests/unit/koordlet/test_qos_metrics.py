"""The QoS manager's per-tick gauges: a tick shows what it set, nothing older."""

import pytest
from prometheus_client import CollectorRegistry, Gauge

from koord.koordlet.qosmanager.metrics import TickGauge


def series(registry: CollectorRegistry) -> dict[str, float]:
    return {s.labels["c"]: s.value for m in registry.collect() for s in m.samples}


@pytest.mark.parametrize("ticks, want", [
    # 1: what a tick sets is shown
    ([{"a": 1, "b": 2}], {"a": 1, "b": 2}),
    # 2: a label set not set again is gone at the end of the next tick
    ([{"a": 1, "b": 2}, {"b": 3}], {"b": 3}),
    # 3: a tick that sets nothing leaves nothing
    ([{"a": 1}, {}], {}),
    # 4: one that comes back is shown again
    ([{"a": 1}, {}, {"a": 5}], {"a": 5}),
])
def test_a_tick_gauge_shows_what_its_last_tick_set(ticks, want):
    registry = CollectorRegistry()
    gauge = TickGauge(Gauge("g", "help", ["c"], registry=registry))
    for tick in ticks:
        gauge.begin()
        for label, value in tick.items():
            gauge.set((label,), value)
        gauge.end()
    assert series(registry) == want

"""The advisor: one thread per enabled collector, stored samples, threads that survive
failing collectors, flags."""

from __future__ import annotations

import argparse
import logging
import threading
import time

import pytest

from koord.koordlet import flags
from koord.koordlet import metriccache as mc
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metricsadvisor import AdvisorConfig, MetricsAdvisor, add_flags, from_args
from koord.koordlet.metricsadvisor.framework import Collector
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord_testing.pods import FakeStatesInformer
from koord_testing.wait import wait_for


class Flaky(Collector):
    name = "Flaky"

    def __init__(self, env):
        super().__init__(env)
        self.calls = 0

    @property
    def interval(self):
        return 0.01

    def collect(self, now):
        self.calls += 1
        if self.calls % 2:
            raise RuntimeError("boom")
        out = mc.Samples(now)
        out.add(mc.NODE_CPU_USAGE, {}, self.calls)
        return out


def test_collector_thread_survives_exceptions_and_logs_once(tmp_path, caplog):
    cache = mc.MetricCache(None)
    advisor = MetricsAdvisor(AdvisorConfig(proc_root=tmp_path, sys_root=tmp_path),
                             FakeStatesInformer(), cache, CgroupExecutor(CgroupLayout(tmp_path)))
    flaky = Flaky(advisor.env)
    advisor.collectors = [flaky]
    advisor.start()
    try:
        wait_for(lambda: flaky.calls >= 10, "ten ticks of the flaky collector", 10)
    finally:
        advisor.stop()
    assert cache.aggregate(mc.NODE_CPU_USAGE, 0, time.time() + 1, mc.Aggregation.COUNT) >= 4
    errors = [r for r in caplog.records if "boom" in r.getMessage()]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR and errors[0].exc_info
    assert not [t for t in threading.enumerate() if t.name == "collector-Flaky"]


def test_real_machine_collects_node_usage(tmp_path):
    cache = mc.MetricCache(None)
    advisor = MetricsAdvisor(AdvisorConfig(), FakeStatesInformer(), cache, CgroupExecutor(CgroupLayout()))
    assert {c.name for c in advisor.collectors} == {"NodeInfo", "NodeResource", "PodResource", "HostApplication",
                                                    "SystemResource", "BEResource", "PodThrottled"}
    advisor.start()
    try:
        wait_for(lambda: cache.query(mc.SYS_CPU_USAGE, 0, time.time() + 1), "a system usage sample", 10)
    finally:
        advisor.stop()
    now = time.time()
    assert 0 <= cache.aggregate(mc.NODE_CPU_USAGE, 0, now, mc.Aggregation.LAST) <= 1024
    assert cache.aggregate(mc.NODE_MEMORY_USAGE, 0, now, mc.Aggregation.LAST) > 0
    assert cache.get_kv(mc.NODE_CPU_INFO)["total_cpus"] >= 1


def test_interval_below_one_second_disables(caplog):
    advisor = MetricsAdvisor(AdvisorConfig(collect_res_used_interval=0.5), FakeStatesInformer(), mc.MetricCache(None),
                             CgroupExecutor(CgroupLayout()))
    advisor.start()
    assert not advisor._threads
    assert "disabled" in caplog.text
    advisor.stop()


def test_flags():
    parser = flags.build_parser()
    cfg = from_args(parser.parse_args([]))
    assert (cfg.collect_res_used_interval, cfg.collect_sys_metric_outdated_interval,
            cfg.collect_node_cpu_info_interval, cfg.psi_collector_interval,
            cfg.enable_pagecache_collector, cfg.psi_collector, str(cfg.sys_root)) == (
        1, 10, 60, 10, False, False, "/sys")
    cfg = from_args(parser.parse_args(["--collect-res-used-interval", "2s", "--enable-pagecache-collector",
                                       "--sys-root-dir", "/host-sys", "--feature-gates", "PSICollector=true"]))
    assert (cfg.collect_res_used_interval, cfg.enable_pagecache_collector, str(cfg.sys_root), cfg.psi_collector) == (
        2, True, "/host-sys", True)
    for bad in (["--collect-res-used-interval", "soon"], ["--enable-pagecache-collector", "maybe"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    other = argparse.ArgumentParser()
    other.add_argument("--sys-root-dir", default="/x")
    add_flags(other)  # a koordlet that already has the flag keeps its own
    assert other.parse_args([]).sys_root_dir == "/x"


def test_a_failing_store_does_not_end_the_collectors_thread(tmp_path, caplog, monkeypatch):
    cache = mc.MetricCache(None)
    advisor = MetricsAdvisor(AdvisorConfig(proc_root=tmp_path, sys_root=tmp_path),
                             FakeStatesInformer(), cache, CgroupExecutor(CgroupLayout(tmp_path)))
    flaky = Flaky(advisor.env)
    advisor.collectors = [flaky]
    stores = []

    def broken(ticks):
        stores.append(ticks)
        raise RuntimeError("store bug")
    monkeypatch.setattr(cache, "append_ticks", broken)
    advisor.start()
    try:
        wait_for(lambda: len(stores) >= 3, "three stores tried", 10)
    finally:
        advisor.stop()
    errors = [r for r in caplog.records if "store bug" in r.getMessage()]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR and "next one runs" in errors[0].getMessage()

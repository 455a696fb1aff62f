"""SystemConfig on a fake proc/sys tree (never the host's /proc/sys): upstream's
system_config_test table, and restoring the values found at start."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metriccache import MetricCache
from koord.koordlet.qosmanager import QOSConfig, QOSManager
from koord.koordlet.qosmanager.sysconfig import KNOBS, SystemConfig, wanted_values
from koord.koordlet.resourceexecutor.updater import ResourceExecutor
from koord_testing.pods import FakeStatesInformer

NODE_MEMORY = 512 << 30  # upstream's nodeValidMemory
INITIAL = {"min_free_kbytes": str(NODE_MEMORY // 1024 * 100 // 10000), "watermark_scale_factor": "150",
           "reap_background": "0"}


def tree(tmp_path: Path, reaper: bool = True) -> dict[str, Path]:
    files = {"min_free_kbytes": tmp_path / "proc/sys/vm/min_free_kbytes",
             "watermark_scale_factor": tmp_path / "proc/sys/vm/watermark_scale_factor",
             "reap_background": tmp_path / "sys/kernel/mm/memcg_reaper/reap_background"}
    for name, f in files.items():
        if name == "reap_background" and not reaper:
            continue
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(INITIAL[name] + "\n")
    return files


def strategy(tmp_path: Path, system: dict | None, memory: int = NODE_MEMORY) -> tuple[SystemConfig, FakeStatesInformer]:
    spec = {} if system is None else {"systemStrategy": system}
    informer = FakeStatesInformer([], {"spec": spec}, {"status": {"capacity": {"memory": str(memory)}}})
    qos = QOSManager(QOSConfig(gates={"SystemConfig": True}, proc_root=tmp_path / "proc", sys_root=tmp_path / "sys"),
                     informer, MetricCache(None), ResourceExecutor(CgroupLayout(tmp_path, version=1)))
    s = next(x for x in qos.strategies if isinstance(x, SystemConfig))
    assert s.enabled()
    return s, informer


def read(files: dict[str, Path]) -> dict[str, str]:
    return {k: f.read_text().strip() for k, f in files.items() if f.exists()}


@pytest.mark.parametrize("name, system, want", [
    ("invalid", {"minFreeKbytesFactor": -1, "watermarkScaleFactor": -1, "memcgReapBackGround": -1}, INITIAL),
    ("too small", {"minFreeKbytesFactor": 0, "watermarkScaleFactor": 5, "memcgReapBackGround": -1}, INITIAL),
    ("valid", {"minFreeKbytesFactor": 88, "watermarkScaleFactor": 99, "memcgReapBackGround": 1},
     {"min_free_kbytes": str(NODE_MEMORY // 1024 * 88 // 10000), "watermark_scale_factor": "99",
      "reap_background": "1"}),
    ("too large", {"minFreeKbytesFactor": 400, "watermarkScaleFactor": 500, "memcgReapBackGround": 2}, INITIAL),
    ("unset", {}, INITIAL),
    ("part", {"minFreeKbytesFactor": 88},
     {**INITIAL, "min_free_kbytes": str(NODE_MEMORY // 1024 * 88 // 10000)}),
])
def test_upstream_table(tmp_path: Path, name: str, system: dict, want: dict) -> None:
    files = tree(tmp_path)
    s, _ = strategy(tmp_path, system)
    s.run_once()
    assert read(files) == want


def test_out_of_range_is_logged_naming_the_field(tmp_path: Path, caplog) -> None:
    tree(tmp_path)
    s, _ = strategy(tmp_path, {"watermarkScaleFactor": 500, "minFreeKbytesFactor": "8"})
    s.run_once()
    s.run_once()
    assert caplog.text.count("spec.systemStrategy.watermarkScaleFactor=500") == 1
    assert "minFreeKbytesFactor='8': want an integer" in caplog.text


def test_values_found_at_start_come_back(tmp_path: Path) -> None:
    files = tree(tmp_path)
    s, informer = strategy(tmp_path, {"minFreeKbytesFactor": 88, "watermarkScaleFactor": 99})
    s.run_once()
    assert read(files)["watermark_scale_factor"] == "99"
    informer.node_slo = {"spec": {"systemStrategy": {"minFreeKbytesFactor": 88}}}
    s.run_once()
    assert read(files)["watermark_scale_factor"] == "150", "field removed: value found at start back"
    assert read(files)["min_free_kbytes"] != INITIAL["min_free_kbytes"]
    s.teardown()
    assert read(files) == INITIAL


def test_missing_reaper_file_is_not_an_error(tmp_path: Path, caplog) -> None:
    files = tree(tmp_path, reaper=False)
    s, _ = strategy(tmp_path, {"memcgReapBackGround": 1, "watermarkScaleFactor": 99})
    s.run_once()
    assert read(files) == {"min_free_kbytes": INITIAL["min_free_kbytes"], "watermark_scale_factor": "99"}
    assert "does not exist on this kernel" in caplog.text
    assert not files["reap_background"].exists()


@given(st.dictionaries(st.sampled_from(["minFreeKbytesFactor", "watermarkScaleFactor", "memcgReapBackGround", "x"]),
                       st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.none(), st.text(max_size=4),
                                 st.floats(allow_nan=True)), max_size=4),
       st.integers(0, 1 << 50))
def test_system_strategy_parser_is_total(system: dict, capacity: int) -> None:
    values, errors = wanted_values(system, capacity)
    for knob, value in values.items():
        assert knob.lo <= value <= knob.hi
    assert len(values) + len(errors) == sum(1 for k in KNOBS if system.get(k.field) is not None)

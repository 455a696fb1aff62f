"""The metric cache: schema checks, queries by label subset, aggregations as upstream,
retention and size bounds, persistence across close and kill -9, KV."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord.koordlet import metriccache as mc
from koord.koordlet.metriccache import Aggregation, MetricCache, MetricCacheError, Sample


def pod(uid: str, ts: float, value: float, kind: str = mc.POD_CPU_USAGE) -> Sample:
    return Sample(kind, {mc.POD_UID: uid}, ts, value)


@pytest.fixture
def cache():
    c = MetricCache(None)
    yield c
    c.close()


# ---- aggregations (upstream's table cases) ------------------------------------------------

@pytest.mark.parametrize("p, want", [(0.9, 700), (0.5, 300), (0.95, 700), (0.99, 700), (0.1, 0)])
def test_percentile_nearest_rank_as_upstream(p, want):
    # Test_fieldPercentileOfMetricList
    assert mc.percentile([800, 100, 200, 600, 700, 0, 500, 400, 300], p) == want


def test_percentile_of_one_and_none():
    assert mc.percentile([5.0], 0.5) == 5.0
    with pytest.raises(ValueError):
        mc.percentile([], 0.5)


def test_append_and_query_avg_as_upstream(cache):
    # Test_tsdbStorage_Append_And_Querier: 4, 1, 1 at now-4s..now-1s -> avg 2, range 3 s.
    now = time.time()
    cache.append([Sample(mc.NODE_CPU_USAGE, {}, now - 4, 4), Sample(mc.NODE_CPU_USAGE, {}, now - 2, 1),
                  Sample(mc.NODE_CPU_USAGE, {}, now - 1, 1)])
    assert cache.aggregate(mc.NODE_CPU_USAGE, now - 10, now, Aggregation.AVG) == 2
    assert cache.aggregate(mc.NODE_CPU_USAGE, now - 10, now, Aggregation.COUNT) == 3
    assert cache.aggregate(mc.NODE_CPU_USAGE, now - 10, now, Aggregation.LAST) == 1
    assert cache.time_range(mc.NODE_CPU_USAGE, now - 10, now) == pytest.approx(3.0)


@pytest.mark.parametrize("agg, want", [(Aggregation.AVG, 3.0), (Aggregation.LAST, 2.0), (Aggregation.COUNT, 5.0),
                                       (Aggregation.P50, 2.0), (Aggregation.P90, 4.0),
                                       (Aggregation.P95, 4.0), (Aggregation.P99, 4.0)])
def test_aggregations_table(cache, agg, want):
    values = [1, 5, 3, 4, 2]  # in time order; last is 2
    cache.append([pod("a", 100 + i, v) for i, v in enumerate(values)])
    assert cache.aggregate(mc.POD_CPU_USAGE, 0, 1000, agg) == want


def test_empty_window_gives_none_and_zero_range(cache):
    cache.append([pod("a", 100, 1)])
    for agg in Aggregation:
        assert cache.aggregate(mc.POD_CPU_USAGE, 200, 300, agg) is None
    assert cache.time_range(mc.POD_CPU_USAGE, 0, 300) == 0.0
    assert cache.query(mc.CONTAINER_CPU_USAGE, 0, 300) == []


# ---- queries ------------------------------------------------------------------------------

def test_window_is_inclusive_and_sorted(cache):
    cache.append([pod("a", 3, 3), pod("a", 1, 1), pod("a", 2, 2), pod("a", 4, 4)])
    assert cache.query(mc.POD_CPU_USAGE, 2, 3) == [(2.0, 2.0), (3.0, 3.0)]


def test_label_subset_merges_series(cache):
    cache.append([pod("a", 1, 1), pod("b", 2, 2), pod("a", 3, 3),
                  pod("a", 1.5, 100, kind=mc.POD_MEMORY_USAGE)])
    assert cache.query(mc.POD_CPU_USAGE, 0, 10, {mc.POD_UID: "a"}) == [(1.0, 1.0), (3.0, 3.0)]
    assert cache.query(mc.POD_CPU_USAGE, 0, 10) == [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]
    assert cache.query(mc.POD_CPU_USAGE, 0, 10, {mc.POD_UID: "zzz"}) == []


def test_node_be_labels_subset(cache):
    def be(alloc, v):
        return Sample(mc.NODE_BE, {mc.BE_RESOURCE: "cpu", mc.BE_ALLOCATION: alloc}, 10, v)
    cache.append([be(mc.BE_ALLOCATION_USAGE, 4000), be(mc.BE_ALLOCATION_REAL_LIMIT, 8000)])
    assert cache.aggregate(mc.NODE_BE, 0, 20, Aggregation.LAST,
                           {mc.BE_ALLOCATION: mc.BE_ALLOCATION_REAL_LIMIT}) == 8000
    assert cache.aggregate(mc.NODE_BE, 0, 20, Aggregation.COUNT, {mc.BE_RESOURCE: "cpu"}) == 2


def test_same_series_same_timestamp_replaces(cache):
    cache.append([pod("a", 5, 1)])
    cache.append([pod("a", 5, 7)])
    assert cache.query(mc.POD_CPU_USAGE, 0, 10) == [(5.0, 7.0)]


def test_many_series_query_beyond_one_chunk(cache):
    cache.append([pod(f"p{i}", 2000 - i, i) for i in range(1200)])
    points = cache.query(mc.POD_CPU_USAGE, 0, 3000)
    assert len(points) == 1200
    assert [t for t, _ in points] == sorted(t for t, _ in points)


@pytest.mark.parametrize("sample, words", [
    (Sample("no_such_kind", {}, 1, 1), "unknown metric kind"),
    (Sample(mc.POD_CPU_USAGE, {}, 1, 1), "needs exactly the labels"),
    (Sample(mc.POD_CPU_USAGE, {mc.POD_UID: "a", "extra": "b"}, 1, 1), "needs exactly the labels"),
    (Sample(mc.NODE_CPU_USAGE, {mc.POD_UID: "a"}, 1, 1), "needs exactly the labels"),
    (Sample(mc.POD_CPU_USAGE, {mc.POD_UID: ""}, 1, 1), "non-empty string"),
    (Sample(mc.POD_CPU_USAGE, {mc.POD_UID: "x" * 300}, 1, 1), "at most"),
    (Sample(mc.NODE_CPU_USAGE, {}, 1, float("nan")), "finite"),
    (Sample(mc.NODE_CPU_USAGE, {}, float("inf"), 1), "finite"),
    (Sample(mc.NODE_CPU_USAGE, {}, -5, 1), "negative timestamp"),
])
def test_invalid_samples_rejected_whole_batch(cache, sample, words):
    with pytest.raises(MetricCacheError, match=words):
        cache.append([Sample(mc.NODE_CPU_USAGE, {}, 1, 1), sample])
    assert cache.query(mc.NODE_CPU_USAGE, 0, 10) == []


def tick(ts, *samples):
    out = mc.Samples(ts)
    for kind, labels, value in samples:
        out.add(kind, labels, value)
    return out


def test_finite_samples_whose_sum_overflows_are_stored(cache):
    """The known-series fast path checks a tick's sum; finite values that overflow it are
    still checked one by one, and stored."""
    cache.append_ticks([tick(1.0, (mc.NODE_CPU_USAGE, {}, 1.0), (mc.POD_CPU_USAGE, {mc.POD_UID: "a"}, 1.0))])
    cache.append_ticks([tick(2.0, (mc.NODE_CPU_USAGE, {}, 1e308), (mc.POD_CPU_USAGE, {mc.POD_UID: "a"}, 1e308))])
    assert cache.query(mc.NODE_CPU_USAGE, 0, 10) == [(1.0, 1.0), (2.0, 1e308)]


@pytest.mark.parametrize("bad, words", [
    ((mc.NODE_CPU_USAGE, {}, float("nan")), "finite"),  # a known series
    ((mc.NODE_CPU_USAGE, {}, True), "finite"),
    ((mc.NODE_CPU_USAGE, {}, "1"), "finite"),
    ((mc.NODE_CPU_USAGE, {}, 10**400), "finite"),
    ((mc.POD_CPU_USAGE, {mc.POD_UID: 5}, 1.0), "non-empty string"),  # a new series
    ((mc.POD_CPU_USAGE, {mc.POD_UID: "a"}, float("inf")), "finite"),
    (("no_such_kind", {}, 1.0), "unknown metric kind"),
])
def test_a_bad_sample_in_any_tick_stores_none_of_them(cache, bad, words):
    cache.append_ticks([tick(1.0, (mc.NODE_CPU_USAGE, {}, 1.0))])
    with pytest.raises(MetricCacheError, match=words):
        cache.append_ticks([tick(2.0, (mc.NODE_CPU_USAGE, {}, 2.0)), tick(3.0, (mc.NODE_CPU_USAGE, {}, 3.0), bad)])
    assert cache.query(mc.NODE_CPU_USAGE, 0, 10) == [(1.0, 1.0)]
    assert cache.series_labels(mc.POD_CPU_USAGE) == []


@pytest.mark.parametrize("ts, words", [(float("nan"), "finite"), (-1.0, "negative"), (None, "finite")])
def test_a_bad_tick_time_is_refused(cache, ts, words):
    with pytest.raises(MetricCacheError, match=words):
        cache.append_ticks([tick(ts, (mc.NODE_CPU_USAGE, {}, 1.0))])
    cache.append_ticks([tick(ts), tick(2.0, (mc.NODE_CPU_USAGE, {}, 1.0))])  # an empty tick stores nothing
    assert cache.query(mc.NODE_CPU_USAGE, 0, 10) == [(2.0, 1.0)]


def test_ticks_store_keyed_samples_as_samples(cache):
    key = mc.series_key(mc.POD_CPU_USAGE, {mc.POD_UID: "a"})
    first, second = mc.Samples(1.0), mc.Samples(2)
    first.add_keyed(key, 0.5)
    second.add_keyed(key, 3)  # an int time and value are numbers too
    second.add(mc.NODE_CPU_USAGE, {}, 1.5)
    cache.append_ticks([first, second, mc.Samples(3.0)])
    assert cache.query(mc.POD_CPU_USAGE, 0, 10, {mc.POD_UID: "a"}) == [(1.0, 0.5), (2.0, 3.0)]
    assert list(second) == [Sample(mc.POD_CPU_USAGE, {mc.POD_UID: "a"}, 2, 3),
                            Sample(mc.NODE_CPU_USAGE, {}, 2, 1.5)]


@pytest.mark.parametrize("labels", [["a"], {1: "a", "b": "c"}, None])
def test_labels_that_cannot_be_a_key_are_named(labels):
    with pytest.raises(MetricCacheError, match="not a mapping"):
        mc.Samples(1.0).add(mc.POD_CPU_USAGE, labels, 1.0)


@pytest.mark.parametrize("kind, labels", [("nope", None), (mc.POD_CPU_USAGE, {"container_id": "x"})])
def test_invalid_queries(cache, kind, labels):
    with pytest.raises(MetricCacheError):
        cache.query(kind, 0, 1, labels)


def test_concurrent_appends_and_queries(cache):
    errors: list[BaseException] = []

    def writer(uid: str) -> None:
        try:
            for i in range(200):
                cache.append([pod(uid, i, i)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"u{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        cache.aggregate(mc.POD_CPU_USAGE, 0, 1000, Aggregation.P95)
    for t in threads:
        t.join()
    assert not errors
    assert cache.aggregate(mc.POD_CPU_USAGE, 0, 1000, Aggregation.COUNT) == 800


@given(st.lists(st.tuples(st.integers(0, 10**6), st.floats(-1e12, 1e12, allow_nan=False)), max_size=60))
def test_query_returns_what_was_appended(points):
    c = MetricCache(None, clock=lambda: 1000.0)
    try:
        c.append([pod("a", t / 1000, v) for t, v in points])
        latest = {t: v for t, v in points}  # a later sample at the same ms replaces the earlier
        assert c.query(mc.POD_CPU_USAGE, 0, 10**4) == sorted((t / 1000, v) for t, v in latest.items())
    finally:
        c.close()


# ---- KV -----------------------------------------------------------------------------------

def test_kv_roundtrip_and_persistence(tmp_path):
    c = MetricCache(tmp_path)
    info = {"processors": [{"cpu": 0, "core": 0, "socket": 0, "node": 0, "online": True}], "total_cpus": 1}
    c.set_kv(mc.NODE_CPU_INFO, info)
    assert c.get_kv("missing") is None
    c.close()
    c = MetricCache(tmp_path)
    assert c.get_kv(mc.NODE_CPU_INFO) == info
    with pytest.raises(MetricCacheError, match="JSON"):
        c.set_kv("bad", object())
    c.close()


# ---- bounds -------------------------------------------------------------------------------

def test_retention_drops_old_samples():
    now = [10_000.0]
    c = MetricCache(None, retention_seconds=100, clock=lambda: now[0])
    c.append([pod("old", 9_000, 1), pod("new", 9_950, 2)])
    assert c.aggregate(mc.POD_CPU_USAGE, 0, 20_000, Aggregation.COUNT) == 2  # until the next GC
    now[0] = 10_100.0  # past the GC interval: both are now older than 100 s
    c.append([pod("newer", 10_090, 3)])
    assert c.query(mc.POD_CPU_USAGE, 0, 20_000) == [(10_090.0, 3.0)]
    c.close()


@pytest.mark.parametrize("samples, chunked, left", [
    # 1: a pod whose samples all expired, from the head: its series goes
    ([("gone", 9_000)], False, set()),
    # 2: the same from a chunk
    ([("gone", 9_000)], True, set()),
    # 3: a pod with a sample inside the retention keeps its series, head or chunk
    ([("gone", 9_000), ("kept", 10_050)], False, {"kept"}),
    ([("gone", 9_000), ("kept", 10_050)], True, {"kept"}),
    # 4: an old and a recent sample of one pod: the series stays with the recent one
    ([("both", 9_000), ("both", 10_050)], False, {"both"}),
    ([("both", 9_000), ("both", 10_050)], True, {"both"}),
])
def test_expiry_drops_the_series_left_without_samples(tmp_path, samples, chunked, left):
    now = [10_000.0]
    c = MetricCache(tmp_path, retention_seconds=100, clock=lambda: now[0])
    for uid, ts in samples:
        c.append([pod(uid, ts, 1)])
    if chunked:
        c.flush()
    now[0] = 10_100.0  # past the GC interval
    c.append([pod("tick", 10_090, 1)])
    want = sorted(left | {"tick"})
    assert sorted(labels[mc.POD_UID] for labels in c.series_labels(mc.POD_CPU_USAGE)) == want
    c.close()
    reopened = MetricCache(tmp_path, retention_seconds=100, clock=lambda: now[0])
    assert sorted(labels[mc.POD_UID] for labels in reopened.series_labels(mc.POD_CPU_USAGE)) == want
    reopened.close()


def test_size_bound_drops_oldest_first(tmp_path):
    bound = 2 * 1024 * 1024
    now = [990_000.0]
    c = MetricCache(tmp_path, max_bytes=bound, chunk_seconds=10, clock=lambda: now[0])
    for tick in range(600):
        now[0] = 990_000.0 + tick
        c.append([pod(f"p{i}", now[0], tick * 1.37 + i / 7) for i in range(400)])
        assert c.used_bytes() <= bound
    assert c.disk_bytes() <= bound + 512 * 1024
    assert len(c.query(mc.POD_CPU_USAGE, now[0], now[0])) == 400  # the latest tick is all there
    first = c.query(mc.POD_CPU_USAGE, 0, 2_000_000)[0][0]
    assert first > 990_000  # the oldest went first
    c.close()


def test_chunks_and_head_answer_together(tmp_path):
    now = [1000.0]
    c = MetricCache(tmp_path, chunk_seconds=5, clock=lambda: now[0])
    for i in range(12):
        now[0] = 1000.0 + i
        c.append([pod("a", now[0], i)])
    assert c.query(mc.POD_CPU_USAGE, 1003, 1008) == [(1000.0 + i, float(i)) for i in range(3, 9)]
    c.close()
    c = MetricCache(tmp_path, chunk_seconds=5, clock=lambda: now[0])  # head reloaded from disk
    assert [v for _, v in c.query(mc.POD_CPU_USAGE, 0, 2000)] == [float(i) for i in range(12)]
    c.close()


@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=50, unique=True),
       st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=50, max_size=50))
def test_chunk_encoding_roundtrip(times, values):
    times.sort()
    got_t, got_v = mc.chunks.decode_chunk(mc.chunks.encode_chunk(times, values[:len(times)]))
    assert (list(got_t), list(got_v)) == (times, values[:len(times)])


def test_a_chunk_whose_times_overflow_is_rejected():
    import struct
    import zlib
    from array import array
    blob = zlib.compress(struct.pack("<qI", 2**63 - 10, 2) + array("q", [100]).tobytes()
                         + array("d", [1.0, 2.0]).tobytes())
    with pytest.raises(ValueError, match="beyond int64"):
        mc.chunks.decode_chunk(blob)


@given(st.binary(max_size=200))
def test_garbage_chunks_rejected(blob):
    try:
        mc.chunks.decode_chunk(blob)
    except ValueError:
        pass


def test_bad_bounds_rejected():
    with pytest.raises(MetricCacheError):
        MetricCache(None, retention_seconds=0)
    with pytest.raises(MetricCacheError):
        MetricCache(None, max_bytes=1000)


# ---- persistence and directories ----------------------------------------------------------

def test_history_survives_close_and_reopen(tmp_path):
    c = MetricCache(tmp_path)
    now = time.time()
    c.append([pod("a", now - 5, 1.5)])
    c.close()
    c = MetricCache(tmp_path)
    assert c.query(mc.POD_CPU_USAGE, now - 10, now) == [(pytest.approx(now - 5, abs=1e-3), 1.5)]
    c.append([pod("a", now - 4, 2.5)])  # the series id is reused, not duplicated
    assert c.aggregate(mc.POD_CPU_USAGE, now - 10, now, Aggregation.COUNT, {mc.POD_UID: "a"}) == 2
    c.close()


def test_a_head_of_one_row_per_sample_from_an_older_file_is_migrated_once(tmp_path, caplog):
    """A file written before ticks were stored as one row keeps its head as one row per
    sample in ``head``: at open those rows become ticks, before the ticks stored since (they
    are older), and the table goes; the samples are answered and cut as any others."""
    c = MetricCache(tmp_path)
    now = time.time()
    c.append([pod("a", now - 3, 3.5)])
    c.close()
    db = sqlite3.connect(tmp_path / "metrics.db")
    sid = db.execute("SELECT id FROM series").fetchone()[0]
    db.execute("CREATE TABLE head (series_id INTEGER NOT NULL, ts INTEGER NOT NULL, value REAL NOT NULL)")
    db.executemany("INSERT INTO head VALUES (?, ?, ?)",
                   [(sid, round((now - 5) * 1000), 1.5), (sid, round((now - 4) * 1000), 2.5)])
    db.commit()
    db.close()
    with caplog.at_level(logging.INFO):
        c = MetricCache(tmp_path)
    assert "2 samples of an older file's head moved into 2 ticks" in caplog.text
    want = [(pytest.approx(now - t, abs=1e-3), v) for t, v in ((5, 1.5), (4, 2.5), (3, 3.5))]
    assert c.query(mc.POD_CPU_USAGE, now - 10, now) == want
    assert c._conn().execute("SELECT count(*) FROM sqlite_master WHERE name = 'head'").fetchone()[0] == 0
    c.flush()
    c.close()
    c = MetricCache(tmp_path)
    assert c.query(mc.POD_CPU_USAGE, now - 10, now) == want
    assert c._conn().execute("SELECT count(*) FROM head_ticks").fetchone()[0] == 0
    c.close()


def test_an_unreadable_stored_tick_is_skipped_and_named(tmp_path, caplog):
    c = MetricCache(tmp_path)
    now = time.time()
    for i, value in enumerate((1.0, 2.0, 3.0)):
        c.append([pod("a", now - 5 + i, value)])
    c.close()
    db = sqlite3.connect(tmp_path / "metrics.db")
    db.execute("UPDATE head_ticks SET vals = x'00' WHERE rowid = (SELECT min(rowid) + 1 FROM head_ticks)")
    db.commit()
    db.close()
    c = MetricCache(tmp_path)
    assert [v for _, v in c.query(mc.POD_CPU_USAGE, now - 10, now)] == [1.0, 3.0]
    assert "unreadable" in caplog.text and "skipped" in caplog.text
    c.close()


@given(st.lists(st.tuples(st.integers(1, 2**40), st.floats(allow_nan=False)), max_size=50))
def test_tick_encoding_roundtrip(samples):
    ids, values = [i for i, _ in samples], [v for _, v in samples]
    got_ids, got_values = mc.chunks.decode_tick(*mc.chunks.encode_tick(ids, values))
    assert (list(got_ids), list(got_values)) == (ids, values)


@given(st.binary(max_size=64), st.binary(max_size=64) | st.integers() | st.none())
def test_garbage_ticks_rejected(ids, values):
    try:
        got_ids, got_values = mc.chunks.decode_tick(ids, values)
    except ValueError:
        return
    assert len(got_ids) == len(got_values)


_WRITER = """
import sys, time
from koord.koordlet import metriccache as mc
c = mc.MetricCache(sys.argv[1])
i = 0
start = time.time() - 3600
while True:
    c.append([mc.Sample(mc.NODE_CPU_USAGE, {}, start + i / 100, float(i))])
    i += 1
    if i == 50:
        print("ready", flush=True)
"""


def test_survives_kill_9(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    c = MetricCache(tmp_path)  # the killed process's lock is gone with it
    values = [v for _, v in c.query(mc.NODE_CPU_USAGE, 0, time.time() + 1)]
    assert len(values) >= 50
    assert values == [float(i) for i in range(len(values))]  # every committed batch, in order
    c.close()


def test_two_caches_never_share_a_dir(tmp_path):
    a = MetricCache(tmp_path / "a")
    with pytest.raises(MetricCacheError, match="in use by another process"):
        MetricCache(tmp_path / "a")
    b = MetricCache(tmp_path / "b")
    a.append([pod("x", 1, 1)])
    assert b.query(mc.POD_CPU_USAGE, 0, 10) == []
    a.close()
    b.close()


def _populated(path, series: int = 200) -> None:
    """A metric cache file of a few hundred KiB: chunks of many series, a head, a KV."""
    c = MetricCache(path)
    now = time.time()
    for i in range(30):
        c.append([pod(f"pod-{j}", now - 60 + i, float(i * j)) for j in range(series)])
    c.flush()
    c.append([pod("pod-0", now, 1.0)])
    c.set_kv("k", {"v": 1})
    c._conn().execute("VACUUM")  # no free pages: every overwritten page holds data
    c.close()


def _garbage(db, at: float, size: int) -> None:
    """Overwrites ``size`` bytes at ``at`` (a fraction of the file) with a fixed pattern."""
    data = bytearray(db.read_bytes())
    start = int(len(data) * at) // 4096 * 4096
    data[start:start + size] = (b"\xde\xad\xbe\xef" * (size // 4 + 1))[:size]
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("case, damage", [
    ("not a database at all", lambda db: db.write_bytes(b"this is not sqlite" * 100)),
    ("4 KiB overwritten in the middle", lambda db: _garbage(db, 0.5, 4096)),
    ("4 KiB overwritten near the end", lambda db: _garbage(db, 0.9, 4096)),
    ("the schema page overwritten", lambda db: _garbage(db, 0.0, 4096)),
    ("truncated to half", lambda db: db.write_bytes(db.read_bytes()[: len(db.read_bytes()) // 2])),
])
def test_damaged_database_is_moved_aside_and_a_fresh_one_started(tmp_path, caplog, case, damage):
    _populated(tmp_path)
    db = tmp_path / mc.sqlitefile.DB_NAME
    damage(db)
    c = MetricCache(tmp_path)
    try:
        aside = list(tmp_path.glob("metrics.db.corrupt-*"))
        assert len(aside) == 1, case
        assert str(db) in caplog.text and str(aside[0]) in caplog.text, "both paths are logged"
        assert c.query(mc.POD_CPU_USAGE, 0, time.time() + 10) == [], "the fresh cache is empty"
        now = float(int(time.time()))
        c.append([pod("a", now, 1)])
        assert c.query(mc.POD_CPU_USAGE, 0, now + 1) == [(now, 1.0)]
        assert c.get_kv("k") is None
    finally:
        c.close()
    reopened = MetricCache(tmp_path)  # the fresh file is healthy: nothing more moved aside
    assert reopened.query(mc.POD_CPU_USAGE, 0, now + 1) == [(now, 1.0)]
    reopened.close()
    assert len(list(tmp_path.glob("metrics.db.corrupt-*"))) == 1


def test_healthy_database_is_kept(tmp_path):
    _populated(tmp_path, series=5)
    c = MetricCache(tmp_path)
    assert c.get_kv("k") == {"v": 1}
    assert not list(tmp_path.glob("metrics.db.corrupt-*"))
    c.close()


def test_disk_full_append_fails_cleanly_and_recovery_is_logged_once(tmp_path, caplog, monkeypatch):
    c = MetricCache(tmp_path)
    try:
        c.append([pod("known", 1, 1)])
        db = c._conn()
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count={pages}")  # SQLite's "database or disk is full"
        reloads = []
        monkeypatch.setattr(c, "_load_series", lambda: reloads.append(1))
        big = [pod(f"new-{i}", 2, 2) for i in range(2000)]
        for _ in range(3):
            with pytest.raises(MetricCacheError) as err:
                c.append(big)
            assert str(err.value).startswith("append of 2000 samples failed: database or disk is full")
        assert reloads == [], "a failed write does not reload the cache from disk"
        assert c.query(mc.POD_CPU_USAGE, 0, 10) == [(1.0, 1.0)], "rolled-back series are forgotten"
        assert "writes succeed again" not in caplog.text
        db.execute("PRAGMA max_page_count=1073741823")
        c.append(big)
        c.append([pod("known", 3, 3)])
        assert caplog.text.count("metric cache: writes succeed again after 3 failed appends") == 1
        assert len(c.query(mc.POD_CPU_USAGE, 0, 10)) == 2002
    finally:
        c.close()


def test_closed_cache_raises(tmp_path):
    c = MetricCache(tmp_path)
    c.close()
    c.close()  # idempotent
    with pytest.raises(MetricCacheError, match="closed"):
        c.query(mc.NODE_CPU_USAGE, 0, 1)


def test_flags_defaults_and_errors():
    import argparse
    parser = argparse.ArgumentParser()
    mc.add_flags(parser)
    args = parser.parse_args([])
    assert (str(args.tsdb_path), args.tsdb_retention_duration, args.tsdb_max_bytes) == (
        "/var/lib/koordlet/metric-data", 12 * 3600, 100 * 1024 * 1024)
    args = parser.parse_args(["--tsdb-retention-duration", "1h30m", "--tsdb-max-bytes", "2097152"])
    assert (args.tsdb_retention_duration, args.tsdb_max_bytes) == (5400, 2097152)
    for bad in (["--tsdb-retention-duration", "0"], ["--tsdb-retention-duration", "x"],
                ["--tsdb-max-bytes", "10"], ["--tsdb-max-bytes", "1e9"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


# ---- several aggregations and series at once (what a NodeMetric report asks) ---------------

@settings(deadline=None)  # a metric cache per example: a loaded machine takes its time
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 400),
                          st.floats(0, 1e6, allow_nan=False)), max_size=80),
       st.integers(0, 400), st.integers(0, 400))
def test_aggregate_by_and_aggregates_equal_one_query_each(points, lo, span):
    """aggregate_by gives, per label value, what aggregate gives for that value alone (head
    and chunks alike); aggregates what aggregate gives for each aggregation."""
    aggs = list(Aggregation)
    c = MetricCache(None, chunk_seconds=1e9)
    try:
        for i, (uid, ts, value) in enumerate(points):
            c.append([pod(uid, 1000 + ts, value)])
            if i == len(points) // 2:
                c.flush()  # half in chunks, half in the head
        start, end = 1000 + lo, 1000 + lo + span
        by = c.aggregate_by(mc.POD_CPU_USAGE, mc.POD_UID, start, end, aggs)
        for uid in "abc":
            one = {agg: v for agg in aggs
                   if (v := c.aggregate(mc.POD_CPU_USAGE, start, end, agg, {mc.POD_UID: uid})) is not None}
            assert by.get(uid, {}) == one
            assert c.aggregates(mc.POD_CPU_USAGE, start, end, aggs, {mc.POD_UID: uid}) == one
    finally:
        c.close()


def test_a_sample_at_an_instant_already_cut_is_dropped_also_after_a_restart(tmp_path, caplog):
    """The wall clock stepped back across a cut: the samples it stamps at or before the
    series' last cut are dropped and said, not stored beside the first value of their
    instant, and a reopened cache knows where each series was cut."""
    c = MetricCache(tmp_path, chunk_seconds=1e9, clock=lambda: 1100.0)
    try:
        c.append([pod("a", 1000, 1.0), pod("a", 1001, 2.0)])
        c.flush()
        with caplog.at_level(logging.WARNING, "koord.koordlet.metriccache"):
            c.append([pod("a", 1001, 9.0), pod("b", 1001, 5.0)])
        assert any("1 samples at 1001000 ms dropped" in r.getMessage() for r in caplog.records)
        c.append([pod("a", 1002, 3.0)])
        assert c.query(mc.POD_CPU_USAGE, 0, 2000, {mc.POD_UID: "a"}) == [(1000, 1.0), (1001, 2.0), (1002, 3.0)]
        assert c.query(mc.POD_CPU_USAGE, 0, 2000, {mc.POD_UID: "b"}) == [(1001, 5.0)]
    finally:
        c.close()
    reopened = MetricCache(tmp_path, chunk_seconds=1e9, clock=lambda: 1100.0)
    try:
        reopened.append([pod("a", 1000.5, 7.0), pod("a", 1002, 4.0)])  # 1002 is in the head: replaced
        assert reopened.query(mc.POD_CPU_USAGE, 0, 2000, {mc.POD_UID: "a"}) == \
            [(1000, 1.0), (1001, 2.0), (1002, 4.0)]
    finally:
        reopened.close()


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 400),
                          st.floats(0, 1e6, allow_nan=False)), max_size=60),
       st.sets(st.integers(0, 60), max_size=3), st.integers(0, 450), st.integers(0, 400))
def test_a_window_holds_exactly_the_samples_appended_in_it(points, flush_after, lo, span):
    """Against the samples as appended: each series' query and aggregate_by's count and last
    over any window, with late samples, instants sent twice, cuts into chunks anywhere, and
    windows after a series' last sample (which skip the series unread). An instant sent
    again replaces the value in the head; a sample at or before its series' last cut is
    dropped (the chunks are not rewritten), never kept beside the stored one."""
    c = MetricCache(None, chunk_seconds=1e9)
    kept: dict[str, dict[int, float]] = {uid: {} for uid in "abc"}
    cut: dict[str, int] = {}
    head: dict[str, list[int]] = {uid: [] for uid in "abc"}
    try:
        for i, (uid, ts, value) in enumerate(points):
            c.append([pod(uid, 1000 + ts, value)])
            if ts > cut.get(uid, -1):
                kept[uid][ts] = value
                head[uid].append(ts)
            if i in flush_after:
                c.flush()
                for one, times in head.items():
                    if times:
                        cut[one] = max(times)
                    times.clear()
        start, end = 1000 + lo, 1000 + lo + span
        by = c.aggregate_by(mc.POD_CPU_USAGE, mc.POD_UID, start, end, [Aggregation.COUNT, Aggregation.LAST])
        for uid in "abc":
            want = sorted((1000 + ts, v) for ts, v in kept[uid].items() if lo <= ts <= lo + span)
            assert c.query(mc.POD_CPU_USAGE, start, end, {mc.POD_UID: uid}) == want
            if want:
                assert by[uid] == {Aggregation.COUNT: len(want), Aggregation.LAST: want[-1][1]}
            else:
                assert uid not in by
    finally:
        c.close()


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 400),
                          st.floats(0, 1e6, allow_nan=False)), max_size=60),
       st.integers(0, 60), st.integers(0, 400), st.integers(0, 400))
def test_last_by_gives_aggregate_by_last(points, cut_at, lo, span):
    """last_by's direct look at each series' head answers what aggregate_by's LAST does,
    with late samples, chunks newer than a head, and windows ending before the newest sample;
    for a kind of two labels too (where it asks aggregate_by)."""
    c = MetricCache(None, chunk_seconds=1e9)
    try:
        for i, (uid, ts, value) in enumerate(points):
            c.append([pod(uid, 1000 + ts, value), Sample(mc.NODE_BE, {mc.BE_RESOURCE: uid, mc.BE_ALLOCATION: "x"},
                                                         1000 + ts, value)])
            if i == cut_at:
                c.flush()
        start, end = 1000 + lo, 1000 + lo + span
        for kind, label in ((mc.POD_CPU_USAGE, mc.POD_UID), (mc.NODE_BE, mc.BE_RESOURCE)):
            by = c.aggregate_by(kind, label, start, end, [Aggregation.LAST])
            assert c.last_by(kind, label, ["a", "b", "c", "d"], start, end) == {
                uid: got[Aggregation.LAST] for uid, got in by.items()}
    finally:
        c.close()


@pytest.mark.parametrize("kind, label, labels_of", [
    (mc.POD_CPU_USAGE, mc.POD_UID, lambda i: {mc.POD_UID: f"p{i}"}),  # one series a value
    (mc.NODE_BE, mc.BE_RESOURCE, lambda i: {mc.BE_RESOURCE: f"r{i % 7}", mc.BE_ALLOCATION: f"a{i}"}),  # several
])
def test_aggregate_by_in_batches_gives_each_values_own_aggregate(monkeypatch, kind, label, labels_of):
    """With more series than one batch holds (a value's series never split across two),
    every value still gets what a query of that value alone gives, head and chunks alike."""
    from koord.koordlet.metriccache import queries
    monkeypatch.setattr(queries, "_AGGREGATE_BATCH", 3)
    aggs = list(Aggregation)
    c = MetricCache(None, chunk_seconds=1e9)
    try:
        for ts in range(1000, 1020):
            c.append([Sample(kind, labels_of(i), ts, float((i * 31 + ts) % 17)) for i in range(40)])
            if ts == 1010:
                c.flush()
        by = c.aggregate_by(kind, label, 1005, 1015, aggs)
        values = sorted({labels_of(i)[label] for i in range(40)})
        assert sorted(by) == values
        for value in values:
            assert by[value] == {agg: c.aggregate(kind, 1005, 1015, agg, {label: value}) for agg in aggs}
    finally:
        c.close()


def test_aggregate_by_rejects_a_label_the_kind_has_not(cache):
    with pytest.raises(MetricCacheError, match="unknown labels"):
        cache.aggregate_by(mc.NODE_CPU_USAGE, mc.POD_UID, 0, 1, [Aggregation.AVG])


@pytest.mark.parametrize("window, want_chunk_reads", [
    ((995.0, 1012.0), 1),  # 1: a window reaching into the chunks reads them
    ((1000.0, 1012.0), 1),  # 2: ... also by its first instant only
    ((1011.0, 1012.0), 0),  # 3: one that starts after the newest chunk ends needs no lookup
    ((2000.0, 3000.0), 0),  # 4: ... nor one that holds nothing at all
])
def test_recent_windows_skip_the_chunks(tmp_path, window, want_chunk_reads):
    """What the QoS strategies ask every second (the last few seconds) is answered from the
    head alone, with the same answer; also after a reopen, which learns the newest chunk."""
    points = [(990.0 + i, float(i)) for i in range(11)] + [(1011.0, 11.0), (1012.0, 12.0)]
    c = MetricCache(tmp_path, clock=lambda: 1000.0)
    c.append([pod("a", t, v) for t, v in points[:11]])  # 990..1000
    c.flush()
    c.append([pod("a", t, v) for t, v in points[11:]])
    c.close()
    c = MetricCache(tmp_path, clock=lambda: 1000.0)
    try:
        statements: list[str] = []
        c._conn().set_trace_callback(statements.append)
        assert c.query(mc.POD_CPU_USAGE, *window) == [p for p in points if window[0] <= p[0] <= window[1]]
        assert sum("FROM chunks" in s for s in statements) == want_chunk_reads
    finally:
        c.close()


# ---- series idle past idle_seconds leave memory, not the disk --------------------------------

def _answers(c: MetricCache, start: float, end: float) -> tuple:
    """Everything a caller can ask about the pods' and the BE series in [start, end]."""
    aggs = list(Aggregation)
    out: list = [sorted(map(sorted, (d.items() for d in c.series_labels(mc.POD_CPU_USAGE))))]
    for kind, label in ((mc.POD_CPU_USAGE, mc.POD_UID), (mc.NODE_BE, mc.BE_RESOURCE)):
        out.append(c.query(kind, start, end))
        out.append(c.aggregate_by(kind, label, start, end, aggs))
        out.append(c.last_by(kind, label, ["a", "b", "c", "d"], start, end))
        for value in "abcd":
            labels = {label: value}
            out.append(c.query(kind, start, end, labels))
            out.append(c.aggregates(kind, start, end, aggs, labels))
    return tuple(out)


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 400),
                          st.floats(0, 1e6, allow_nan=False)), max_size=60),
       st.integers(0, 60), st.integers(0, 500), st.integers(0, 500))
def test_dropping_idle_series_from_memory_changes_no_answer(points, cut_at, lo, span):
    """The same appends into a cache that drops series idle for 100 s (and a clock past
    that) and one that keeps them: every query, old windows included, answers the same."""
    now = [1000.0]
    keep = MetricCache(None, chunk_seconds=1e9, clock=lambda: now[0])
    drop = MetricCache(None, chunk_seconds=1e9, idle_seconds=100, clock=lambda: now[0])
    try:
        for c in (keep, drop):
            for i, (uid, ts, value) in enumerate(points):
                c.append([pod(uid, 1000 + ts, value),
                          Sample(mc.NODE_BE, {mc.BE_RESOURCE: uid, mc.BE_ALLOCATION: "x"}, 1000 + ts, value)])
                if i == cut_at:
                    c.flush()
            c.flush()
        now[0] = 1000 + 400 + 100 + 61  # every series idle, the GC due
        for c in (keep, drop):
            c.append([pod("d", now[0], 1.0)])
        assert len(drop._series) <= 1 and len(keep._series) == len({uid for uid, _, _ in points} | {"d"}) * 2 - 1
        start, end = 1000 + lo, 1000 + lo + span
        assert _answers(drop, start, end) == _answers(keep, start, end)
    finally:
        keep.close()
        drop.close()


def test_an_idle_series_comes_back_with_its_history_and_goes_with_the_retention(tmp_path):
    now = [10_000.0]
    c = MetricCache(tmp_path, retention_seconds=1000, idle_seconds=100, clock=lambda: now[0])
    c.append([pod("a", 10_000, 1.0)])
    c.flush()
    now[0] = 10_200.0  # idle for 200 s, the GC due
    c.append([pod("b", 10_200, 2.0)])
    assert sorted(k[1] for k in c._series) == [((mc.POD_UID, "b"),)]  # "a" is out of memory...
    assert c.query(mc.POD_CPU_USAGE, 0, 20_000, {mc.POD_UID: "a"}) == [(10_000.0, 1.0)]  # ...not gone
    c.append([pod("a", 10_201, 3.0)])  # the pod has samples again: the same series
    assert c.query(mc.POD_CPU_USAGE, 0, 20_000, {mc.POD_UID: "a"}) == [(10_000.0, 1.0), (10_201.0, 3.0)]
    assert [r[0] for r in c._conn().execute("SELECT count(*) FROM series")] == [2]
    now[0] = 11_000.0  # "b" idle now too: out of memory, still on disk
    c.append([pod("c", 11_000, 4.0)])
    assert {uid for labels in c.series_labels(mc.POD_CPU_USAGE) for uid in labels.values()} == {"a", "b", "c"}
    now[0] = 11_300.0  # "a" and "b" past the retention: their rows go, though not in memory
    c.append([pod("c", 11_300, 5.0)])
    assert [labels[mc.POD_UID] for labels in c.series_labels(mc.POD_CPU_USAGE)] == ["c"]
    assert [r[0] for r in c._conn().execute("SELECT count(*) FROM series")] == [1]
    c.close()
    reopened = MetricCache(tmp_path, retention_seconds=1000, idle_seconds=100, clock=lambda: now[0])
    assert reopened.query(mc.POD_CPU_USAGE, 0, 20_000) == [(11_000.0, 4.0), (11_300.0, 5.0)]
    reopened.close()

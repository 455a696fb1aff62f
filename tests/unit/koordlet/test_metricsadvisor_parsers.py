"""Parsers of the files the metrics advisor reads: table cases and properties (any text
gives a value or a ValueError, nothing else; generated valid files parse back)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.koordlet.metricsadvisor import parsers as p
from koord.koordlet.metricsadvisor.openfiles import FIRST_READ, OpenFiles, on_cgroup_filesystem
from koord.koordlet.metricsadvisor.parsers import FileProblem

ANY_TEXT = st.text(max_size=400) | st.lists(
    st.sampled_from(["cpu", "cpu0", "some", "full", "avg10=1.5", "total=3", "MemTotal:", "kB", "processor",
                     ":", "1", "-1", "max", "100000", "x", "\n", " ", "Node 0", "usage_usec",
                     "total_inactive_anon", "99999999999999999999", "1e3", "nan"]),
    max_size=40).map(" ".join)

PARSERS = [p.parse_int, p.parse_flat_keyed, p.parse_proc_stat, p.parse_meminfo, p.parse_cpu_list,
           p.parse_psi, p.parse_cpuinfo, lambda t: p.cgroup_cpu_ns(t, 1), lambda t: p.cgroup_cpu_ns(t, 2),
           lambda t: p.parse_cpu_quota(t, 2), lambda t: p.parse_cpu_quota(t, 1, "100000")]


@pytest.mark.parametrize("parser", PARSERS)
@given(text=ANY_TEXT)
def test_any_text_gives_value_or_value_error(parser, text):
    try:
        parser(text)
    except ValueError:
        pass


PROC_STAT = """cpu  100 5 50 1000 20 3 2 7 0 0
cpu0 50 2 25 500 10 1 1 3 0 0
cpu1 50 3 25 500 10 2 1 4 0 0
intr 12345 1 2 3
ctxt 999
"""


def test_proc_stat_busy_excludes_idle_iowait_steal():
    stat = p.parse_proc_stat(PROC_STAT)
    assert stat["cpu"].busy == 100 + 5 + 50 + 3 + 2
    assert stat["cpu1"].busy == 50 + 3 + 25 + 2 + 1
    assert set(stat) == {"cpu", "cpu0", "cpu1"}


@given(st.lists(st.tuples(*[st.integers(0, 2**40)] * 10), min_size=1, max_size=8))
def test_proc_stat_roundtrip(rows):
    text = "\n".join(["cpu  " + " ".join(map(str, rows[0]))]
                     + [f"cpu{i} " + " ".join(map(str, r)) for i, r in enumerate(rows[1:])])
    stat = p.parse_proc_stat(text)
    for name, r in zip(["cpu"] + [f"cpu{i}" for i in range(len(rows) - 1)], rows, strict=True):
        assert stat[name].busy == r[0] + r[1] + r[2] + r[5] + r[6]


def test_meminfo_node_memory_as_upstream():
    info = p.parse_meminfo("MemTotal:       1048576 kB\nMemFree:         262144 kB\n"
                           "MemAvailable:    524288 kB\nHugePages_Total:       0\n")
    assert p.node_memory_bytes(info) == (536870912, 805306368)


def test_numa_meminfo():
    text = ("Node 0 MemTotal: 1000 kB\nNode 0 MemFree: 100 kB\nNode 0 Active(file): 200 kB\n"
            "Node 0 Inactive(file): 300 kB\nNode 0 SReclaimable: 50 kB\n")
    assert p.numa_memory_bytes(p.parse_meminfo(text)) == 350 * 1024
    assert p.numa_memory_bytes({"MemTotal": 1, "MemFree": 5, "Active(file)": 0, "Inactive(file)": 0,
                                "SReclaimable": 0}) == 0
    with pytest.raises(ValueError, match="MemFree"):
        p.numa_memory_bytes({"MemTotal": 1})


@given(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_()]{0,20}", fullmatch=True),
                       st.integers(0, 2**50), max_size=30))
def test_meminfo_roundtrip(values):
    assert p.parse_meminfo("".join(f"{k}: {v} kB\n" for k, v in values.items())) == values


@pytest.mark.parametrize("version, stat, want", [
    (1, {"total_inactive_anon": 104857600, "total_active_anon": 0, "total_unevictable": 0,
         "total_inactive_file": 5, "total_active_file": 6, "inactive_anon": 1}, (104857600, 104857611)),
    (2, {"inactive_anon": 104857600, "active_anon": 0, "unevictable": 0, "inactive_file": 5,
         "active_file": 6}, (104857600, 104857611)),
])
def test_cgroup_memory_without_page_cache(version, stat, want):
    text = "".join(f"{k} {v}\n" for k, v in stat.items())
    assert p.parse_memory_stat(text, version) == want
    assert p.parse_memory_stat(text.encode(), version) == want


def test_cgroup_memory_missing_key_named():
    with pytest.raises(ValueError, match="active_anon"):
        p.parse_memory_stat("inactive_anon 1\n", 2)


BYTES_PARSERS = [p.parse_int, p.parse_throttle, lambda d: p.parse_memory_stat(d, 1),
                 lambda d: p.parse_memory_stat(d, 2), lambda d: p.cgroup_cpu_ns(d, 1),
                 lambda d: p.cgroup_cpu_ns(d, 2)]


def _outcome(parser, data):
    try:
        return parser(data)
    except ValueError:
        return ValueError


@pytest.mark.parametrize("parser", BYTES_PARSERS)
@given(text=ANY_TEXT | st.sampled_from(["5\n", "123456789012345678\n", "1234567890123456789\n", "5", "\n5\n",
                                        "nr_periods 1\nnr_throttled 2\n", "\u0661\n"]))
def test_bytes_as_read_parse_as_their_text(parser, text):
    """The collectors parse the bytes a read gave: the same answer (or ValueError) as the text."""
    data = text.encode("utf-8", "surrogatepass")
    assert _outcome(parser, data) == _outcome(parser, text)


def test_bytes_not_utf8_are_a_value_error():
    with pytest.raises(ValueError, match="UTF-8"):
        p.parse_int(b"\xff\n")


@given(st.dictionaries(st.from_regex(r"[a-z_]{1,20}", fullmatch=True), st.integers(0, 2**63 - 1), max_size=40))
def test_flat_keyed_roundtrip(values):
    assert p.parse_flat_keyed("".join(f"{k} {v}\n" for k, v in values.items())) == values


@pytest.mark.parametrize("text, version, want", [
    ("12000000000\n", 1, 12000000000), ("usage_usec 1000000\nuser_usec 5\n", 2, 1000000000)])
def test_cgroup_cpu_ns(text, version, want):
    assert p.cgroup_cpu_ns(text, version) == want


@pytest.mark.parametrize("text", ["-5", "abc", "", "1 2", "99999999999999999999", "１２"])
def test_bad_counters(text):
    with pytest.raises(ValueError):
        p.parse_int(text)


@pytest.mark.parametrize("text, version, period, want", [
    ("max 100000", 2, None, (-1, 100000)), ("800000 100000\n", 2, None, (800000, 100000)),
    ("-1\n", 1, "100000\n", (-1, 100000)), ("800000", 1, "100000", (800000, 100000))])
def test_cpu_quota(text, version, period, want):
    assert p.parse_cpu_quota(text, version, period) == want


def test_psi():
    text = ("some avg10=1.50 avg60=0.00 avg300=0.00 total=123\n"
            "full avg10=0.25 avg60=0.00 avg300=0.00 total=45\n")
    assert p.parse_psi(text) == {"some": (1.5, 0.0, 0.0), "full": (0.25, 0.0, 0.0)}
    assert p.parse_psi("some avg10=2.00 avg60=1.25 avg300=0.5 total=1\n") == {"some": (2.0, 1.25, 0.5)}
    for bad in ("full avg10=1 avg60=0 avg300=0 total=1\n", "some avg10=nan avg60=0 avg300=0\n",
                "some avg10=500 avg60=0 avg300=0\n", "some avg10=1 avg300=0 total=1\n",
                "some avg10=1 avg60=0 avg300=101 total=1\n", "other x=1"):
        with pytest.raises(ValueError):
            p.parse_psi(bad)


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
physical id\t: 0
core id\t\t: 0

processor\t: 1
physical id\t: 1
core id\t\t: 0
"""


def test_cpuinfo():
    assert p.parse_cpuinfo(CPUINFO) == [{"cpu": 0, "socket": 0, "core": 0}, {"cpu": 1, "socket": 1, "core": 0}]
    assert p.parse_cpuinfo("processor : 3\nBogoMIPS : 100\n") == [{"cpu": 3, "socket": 0, "core": 3}]
    with pytest.raises(ValueError):
        p.parse_cpuinfo("processor : 0\n\nprocessor : 0\n")


def test_read_bounded(tmp_path):
    f = tmp_path / "f"
    f.write_text("x" * 100)
    assert p.read_bounded(f, 100) == "x" * 100
    with pytest.raises(p.FileProblem, match="larger than 10 bytes"):
        p.read_bounded(f, 10)
    with pytest.raises(p.FileProblem) as err:
        p.read_bounded(tmp_path / "missing")
    assert err.value.missing
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(p.FileProblem, match="UTF-8"):
        p.read_bounded(f)
    with pytest.raises(p.FileProblem, match="is a directory|read failed"):
        p.read_bounded(tmp_path)


# ---- cgroup files kept open ---------------------------------------------------------------

def test_open_files_read_the_current_content_and_stay_bounded(tmp_path):

    now = [0.0]
    files = OpenFiles(max_open=3, idle_seconds=10, clock=lambda: now[0])
    paths = [tmp_path / f"f{i}" for i in range(5)]
    for i, path in enumerate(paths):
        path.write_text(f"{i}\n")
    assert [files.read(path, 64) for path in paths] == [f"{i}\n" for i in range(5)]
    assert len(files) == 3  # the least recently read were closed
    with open(paths[4], "r+") as f:  # rewritten in place, as the kernel's files change
        f.write("44\n")
    assert files.read(paths[4], 64) == "44\n"
    now[0] = 11.0
    files.read(paths[0], 64)  # the sweep closes what was not read for idle_seconds
    assert len(files) == 1
    files.close()
    assert len(files) == 0


@pytest.mark.parametrize("size", [FIRST_READ - 1, FIRST_READ, FIRST_READ + 1, 3 * FIRST_READ, 64 * 1024])
def test_open_files_read_past_the_first_read_up_to_the_limit(tmp_path, size):
    """An open file is read with a small buffer first; one that fills it is read again
    whole, so a file of any size up to the limit comes back complete, and one byte more
    is too large."""
    path = tmp_path / "f"
    path.write_bytes(b"7" * size)
    files = OpenFiles()
    for _ in range(2):  # opened by the first read, read by pread after
        assert files.read_all([path], 64 * 1024) == [b"7" * size]
    path.write_bytes(b"7" * (64 * 1024 + 1))
    with pytest.raises(FileProblem, match="larger than 65536 bytes"):
        files.read(path, 64 * 1024)
    files.close()


def test_open_files_report_missing_too_large_and_unreadable(tmp_path):

    files = OpenFiles()
    with pytest.raises(FileProblem) as missing:
        files.read(tmp_path / "nope", 64)
    assert missing.value.missing
    (tmp_path / "big").write_text("x" * 100)
    with pytest.raises(FileProblem, match="larger than 64 bytes"):
        files.read(tmp_path / "big", 64)
    (tmp_path / "dir").mkdir()
    with pytest.raises(FileProblem, match="read failed"):
        files.read(tmp_path / "dir", 64)
    assert len(files) == 1  # only the readable (too large) file stays open


KEYED_TEXT = st.lists(st.tuples(
    st.sampled_from(["total_active_anon", "active_anon", "nr_periods", "nr_throttled", "x", ""]),
    st.sampled_from([" ", "  ", "\t", " \t", ""]),
    st.sampled_from(["1", "0", "42 ", "9223372036854775807", "9223372036854775808", "99999999999999999999",
                     "-1", "1e3", "\u0661", "7\r", "1 2", "", "x"]),
    st.sampled_from(["\n", "\r\n", "\n\n", "\x0b"])), max_size=8).map(
        lambda lines: "".join(k + sep + v + end for k, sep, v, end in lines))


@given(text=KEYED_TEXT | ANY_TEXT,
       keys=st.sampled_from([("total_active_anon", "active_anon"), ("active_anon",), ("nr_periods", "nr_throttled")]))
def test_keyed_fast_path_agrees_with_the_regex_scan(text, keys):
    """find_keyed answers only what scan_keyed would answer; otherwise it defers (None)."""
    fast = p.find_keyed(text.encode("utf-8", "surrogatepass"), keys)
    try:
        slow: dict | None = p.scan_keyed(text, keys)
    except ValueError:
        slow = None
    if fast is not None:
        assert slow is not None and fast == tuple(slow[k] for k in keys)
    try:
        assert p.parse_flat_keyed(text, keys) == slow
    except ValueError:
        assert slow is None


@pytest.mark.parametrize("text, want", [
    # 1: memory.stat-like, the last of a duplicated key counts
    ("active_anon 5\ntotal_active_anon 7\nactive_anon 6\n", {"total_active_anon": 7, "active_anon": 6}),
    # 2: the first line, no newline at the end
    ("active_anon 5\ntotal_active_anon 7", {"total_active_anon": 7, "active_anon": 5}),
    # 3: a prefix of another key is not it
    ("total_active_anon 7\nactive_anon_x 1\nactive_anon 2\n", {"total_active_anon": 7, "active_anon": 2}),
    # 4: a tab separator
    ("total_active_anon\t7\nactive_anon 2\n", {"total_active_anon": 7, "active_anon": 2}),
    # 5: an earlier line of a key is not read, even when it is garbage
    ("total_active_anon 99999999999999999999\ntotal_active_anon 7\nactive_anon 2\n",
     {"total_active_anon": 7, "active_anon": 2}),
])
def test_keyed_cases(text, want):
    assert p.parse_flat_keyed(text, ("total_active_anon", "active_anon")) == want


def test_open_files_read_all_gives_each_file_or_its_problem(tmp_path):
    """One batch read: a missing, a too large and a vanished-then-recreated file each give
    their own answer in place, and the readable ones are read."""
    files = OpenFiles()
    ok, big, gone = tmp_path / "ok", tmp_path / "big", tmp_path / "gone"
    ok.write_text("1\n")
    big.write_text("x" * 100)
    gone.write_text("2\n")
    got = files.read_all([str(ok), str(tmp_path / "missing"), str(big), str(gone)], 10)
    assert got[0] == b"1\n" and got[3] == b"2\n"
    assert isinstance(got[1], FileProblem) and got[1].missing
    assert isinstance(got[2], FileProblem) and "larger than 10 bytes" in got[2].reason
    gone.unlink()
    gone.write_text("3\n")  # a new file by the same name: read, not the open old one
    assert files.read_all([str(ok), str(gone)], 10) == [b"1\n", b"3\n"]
    ok.write_text("4\n")  # rewritten in place: read anew
    assert files.read_all([str(ok)], 10) == [b"4\n"]
    with pytest.raises(FileProblem, match="missing"):
        files.read(str(tmp_path / "missing"), 10)


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _remake_dir(path: Path, text: str) -> None:
    shutil.rmtree(path.parent)
    path.parent.mkdir()
    path.write_text(text)


def _rewrite(path: Path, text: str) -> None:
    path.write_text(text)


@pytest.mark.parametrize("change", [_replace, _remake_dir, _rewrite], ids=lambda f: f.__name__.strip("_"))
def test_open_files_outside_cgroupfs_read_what_the_path_holds_now(tmp_path, change):
    """A tree of plain files standing in for cgroupfs: a file replaced (a writer's atomic
    rename), its dir removed and made again, or rewritten in place is read as it is now,
    from the first read after the change, and the next read keeps the file open again."""
    path = tmp_path / "pod1" / "memory.stat"
    path.parent.mkdir()
    path.write_text("old\n")
    files = OpenFiles()
    assert files.read_all([path, path], 64) == [b"old\n", b"old\n"]
    change(path, "new\n")
    assert files.read_all([path], 64) == [b"new\n"]
    assert files.read_all([path], 64) == [b"new\n"] and len(files) == 1
    files.close()


def test_open_files_outside_cgroupfs_say_a_removed_file_is_missing(tmp_path):
    path = tmp_path / "pod1" / "memory.stat"
    path.parent.mkdir()
    path.write_text("1\n")
    files = OpenFiles()
    assert files.read_all([path], 64) == [b"1\n"]
    shutil.rmtree(path.parent)
    (problem,) = files.read_all([path], 64)
    assert isinstance(problem, FileProblem) and problem.missing
    assert len(files) == 0


def test_only_cgroup_filesystems_are_trusted_to_fail_reads_of_removed_files(tmp_path):
    """The kernel's cgroup files are read without a check (a removed cgroup fails the
    read); a plain file is not on a cgroup filesystem."""
    plain = tmp_path / "f"
    plain.write_text("1\n")
    cgroup_file = next(p for p in (Path("/sys/fs/cgroup/cgroup.controllers"),
                                   Path("/sys/fs/cgroup/memory/memory.stat"),
                                   Path("/sys/fs/cgroup/cpu/cpu.shares")) if p.exists())
    for path, want in ((plain, False), (cgroup_file, True)):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert on_cgroup_filesystem(fd) is want, path
        finally:
            os.close(fd)

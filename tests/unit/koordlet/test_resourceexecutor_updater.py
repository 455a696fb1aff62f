"""ResourceExecutor: cache of recent writes, leveled batches, EINVAL back-off, kube dir layouts."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path

import pytest

from koord.hookapi import parse_cpuset
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.metrics import KoordletMetrics
from koord.koordlet.resourceexecutor import executor as executor_module
from koord.koordlet.resourceexecutor.executor import CgroupError
from koord.koordlet.resourceexecutor.updater import ResourceExecutor, Update, merge_wider
from koord.koordlet.resources import Resources
from koord_testing.cgroupfs import make_fake_v1_cgroup
from koord_testing.scrape import labelled, samples

BE = "kubepods/besteffort"
POD = f"{BE}/pod1"
CTR = f"{POD}/c1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tree(tmp_path: Path) -> tuple[ResourceExecutor, Clock]:
    make_fake_v1_cgroup(tmp_path, CTR)
    clock = Clock()
    return ResourceExecutor(CgroupLayout(tmp_path, driver="cgroupfs"), clock=clock), clock


def quota_file(root: Path, d: str) -> Path:
    return root / "cpu" / d / "cpu.cfs_quota_us"


def cpus_file(root: Path, d: str) -> Path:
    return root / "cpuset" / d / "cpuset.cpus"


def test_cached_equal_value_skipped_for_60s_then_forced(tmp_path: Path) -> None:
    ex, clock = tree(tmp_path)
    assert ex.update(Update(BE, "cpu_quota", 50000)) is True
    quota_file(tmp_path, BE).write_text("-1\n")  # changed behind koordlet's back
    clock.now += 59
    assert ex.update(Update(BE, "cpu_quota", 50000)) is False  # cache trusted
    assert quota_file(tmp_path, BE).read_text().strip() == "-1"
    clock.now += 2
    assert ex.update(Update(BE, "cpu_quota", 50000)) is True  # > 60 s: written again
    assert quota_file(tmp_path, BE).read_text().strip() == "50000"


def test_uncacheable_always_checks_the_file(tmp_path: Path) -> None:
    ex, _ = tree(tmp_path)
    assert ex.update(Update(BE, "cpu_quota", 50000)) is True
    quota_file(tmp_path, BE).write_text("-1\n")
    assert ex.update(Update(BE, "cpu_quota", 50000), cacheable=False) is True


def test_different_value_is_not_skipped(tmp_path: Path) -> None:
    ex, _ = tree(tmp_path)
    ex.update(Update(BE, "cpu_quota", 50000))
    assert ex.update(Update(BE, "cpu_quota", 40000)) is True


def test_any_write_drops_the_cached_value(tmp_path: Path) -> None:
    """A runtime hook writing the same file makes the QoS manager's cache entry stale."""
    ex, _ = tree(tmp_path)
    ex.update(Update(BE, "cpu_quota", 50000))
    ex.write(BE, "cpu_quota", -1)
    assert ex.update(Update(BE, "cpu_quota", 50000)) is True


def test_a_write_drops_its_files_entries_only(tmp_path: Path) -> None:
    """v2's cpu.max holds the quota and the period: writing either drops both, nothing else."""
    for d in (BE, POD):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        (tmp_path / d / "cpu.max").write_text("max 100000\n")
    ex = ResourceExecutor(CgroupLayout(tmp_path, driver="cgroupfs", version=2))
    quota, period = Update(BE, "cpu_quota", 50000), Update(BE, "cpu_period", 100000)
    other = Update(POD, "cpu_quota", 50000)
    for u in (quota, period, other):
        ex.update(u)
    assert ex.uncached([quota, period, other]) == []
    ex.write(BE, "cpu_period", 200000)
    assert ex.uncached([quota, period, other]) == [quota, period]


def test_uncached_is_what_update_would_not_skip(tmp_path: Path) -> None:
    """One check for a batch: fresh entries out, others (and invalid ones) kept, in order."""
    ex, clock = tree(tmp_path)
    ex.update(Update(BE, "cpuset_cpus", "0-1"))
    ex.update(Update(POD, "cpuset_cpus", "0,1"))
    ex.update(Update(BE, "cpu_bvt_warp_ns", 1))
    batch = [Update(BE, "cpuset_cpus", "0-1"), Update(POD, "cpuset_cpus", "0-1"), Update(BE, "cpu_bvt_warp_ns", 1),
             Update(CTR, "cpuset_cpus", "0-1"), Update(BE, "cpuset_cpus", "1-0"),
             Update(BE, "cpu_bvt_warp_ns", True)]  # equal to 1 in Python, but no integer to the kernel
    assert ex.uncached(batch) == batch[3:]
    assert [ex.cached(u) for u in batch] == [True, True, True, False, False, False]
    with pytest.raises(CgroupError, match="not an integer"):
        ex.update(batch[-1])
    clock.now += 61
    assert ex.uncached(batch) == batch


def test_written_since_names_the_files_this_executor_wrote(tmp_path: Path) -> None:
    ex, _ = tree(tmp_path)
    be, pod = ex.path(BE, "cpu_quota"), ex.path(POD, "cpu_quota")
    seq = ex.write_seq
    assert not ex.written_since([be, pod], seq)
    ex.update(Update(BE, "cpu_quota", 50000))
    assert ex.write_seq == seq + 1
    assert ex.written_since([be, pod], seq) and not ex.written_since([pod], seq)
    assert not ex.written_since([be], ex.write_seq)
    ex.update(Update(BE, "cpu_quota", 50000), cacheable=False)  # the file holds it: no write
    assert ex.write_seq == seq + 1
    quota_file(tmp_path, POD).write_text("40000\n")  # behind its back: not its to know
    assert not ex.written_since([pod], seq)


def test_written_since_forgets_only_the_files_of_cgroups_that_are_gone(tmp_path: Path) -> None:
    """The record of writes is bounded by forgetting the files of cgroups that are gone (pods
    that left); a live file's last write is kept however many pods came and went."""
    ex, _ = tree(tmp_path)
    ex._written.min_size = ex._written.prune_at = 2
    pod = ex.path(POD, "cpu_quota")
    before = ex.write_seq
    ex.update(Update(POD, "cpu_quota", 40000))
    for i in range(20):  # pods that came, were written to and left
        make_fake_v1_cgroup(tmp_path, f"kubepods/besteffort/podgone{i}")
        ex.update(Update(f"kubepods/besteffort/podgone{i}", "cpu_quota", 50000))
        shutil.rmtree(tmp_path / "cpu" / f"kubepods/besteffort/podgone{i}")
        assert len(ex._written) <= 4
    assert ex.written_since([pod], before)


def test_cache_entries_expire(tmp_path: Path) -> None:
    ex, clock = tree(tmp_path)
    ex.update(Update(BE, "cpu_quota", 50000))
    clock.now += 121
    ex.update(Update(POD, "cpu_quota", 40000))
    assert len(ex._cache) == 1


def test_range_checked_before_any_write(tmp_path: Path) -> None:
    ex, _ = tree(tmp_path)
    with pytest.raises(CgroupError, match="out of range"):
        ex.update(Update(BE, "cpu_quota", 0))
    with pytest.raises(CgroupError, match="bad cpuset"):
        ex.update(Update(BE, "cpuset_cpus", "1-0"))
    assert quota_file(tmp_path, BE).read_text().strip() == "-1"


def test_einval_backs_off_same_value_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex, clock = tree(tmp_path)
    calls: list[bytes] = []
    real_write = os.write

    def kernel(fd: int, data: bytes) -> int:
        calls.append(data)
        if data == b"3000":
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(executor_module.os, "write", kernel)
    for _ in range(3):
        with pytest.raises(CgroupError, match="EINVAL|Invalid argument"):
            ex.update(Update(BE, "cpu_quota", 3000, owner="BECPUSuppress"))
    assert len(calls) == 1  # the kernel saw the value once, not three times
    clock.now += 1.5  # first back-off (1 s) over: tried again, then 2 s
    with pytest.raises(CgroupError, match="not retried for 2s"):
        ex.update(Update(BE, "cpu_quota", 3000))
    assert len(calls) == 2
    assert ex.update(Update(BE, "cpu_quota", 4000)) is True  # another value: at once
    assert len(calls) == 3


@pytest.mark.parametrize("resource, current, wanted, merged", [
    ("cpuset_cpus", "0-1", "2-3", "0-3"),
    ("cpuset_cpus", "0-7", "2", "0-7"),
    ("cpu_quota", "50000", "20000", 50000),
    ("cpu_quota", "20000", 50000, 50000),
    ("cpu_quota", "-1", 20000, -1),
    ("cpu_quota", "20000", -1, -1),
    ("cpu_quota", "max 100000", 20000, -1),
    ("cpu_quota", "30000 100000", 20000, 30000),
])
def test_merge_wider(resource: str, current: str, wanted: int | str, merged: int | str) -> None:
    assert merge_wider(resource, current, wanted) == merged


def test_leveled_cpuset_widens_top_down_then_narrows_bottom_up(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A child wider than its parent at any moment is what the kernel refuses; check every write."""
    ex, _ = tree(tmp_path)
    for d, cpus in ((BE, "0-1"), (POD, "0-1"), (CTR, "0-1")):
        cpus_file(tmp_path, d).write_text(cpus + "\n")
    order: list[tuple[str, str]] = []
    real = ResourceExecutor._write_file

    def checked(self: ResourceExecutor, path: Path, text: str) -> None:
        real(self, path, text)
        order.append((path.parent.relative_to(tmp_path / "cpuset").as_posix(), text))
        chain = [BE, POD, CTR]
        sets = [set(parse_cpuset(cpus_file(tmp_path, d).read_text())) for d in chain]
        assert sets[1] <= sets[0] and sets[2] <= sets[1], f"child wider than parent after {order}"

    monkeypatch.setattr(ResourceExecutor, "_write_file", checked)
    result = ex.leveled_update([[Update(BE, "cpuset_cpus", "2-3")], [Update(POD, "cpuset_cpus", "2-3")],
                                [Update(CTR, "cpuset_cpus", "2-3")]])
    assert result.errors == []
    assert order == [(BE, "0-3"), (POD, "0-3"), (CTR, "0-3"), (CTR, "2-3"), (POD, "2-3"), (BE, "2-3")]


def test_leveled_quota_larger_first(tmp_path: Path) -> None:
    ex, _ = tree(tmp_path)
    quota_file(tmp_path, BE).write_text("20000\n")
    quota_file(tmp_path, POD).write_text("20000\n")
    result = ex.leveled_update([[Update(BE, "cpu_quota", 10000)], [Update(POD, "cpu_quota", 5000)]])
    assert result.errors == []
    assert quota_file(tmp_path, BE).read_text().strip() == "10000"
    assert quota_file(tmp_path, POD).read_text().strip() == "5000"


def test_batch_reports_each_error_and_goes_on(tmp_path: Path) -> None:
    ex, _ = tree(tmp_path)
    result = ex.update_batch([Update("kubepods/gone", "cpu_quota", 5000, owner="pod a/b"),
                              Update(BE, "cpu_quota", 5000)])
    assert [u.cgroup_dir for u in result.written] == [BE]
    assert len(result.errors) == 1 and "missing" in result.errors[0] and "pod a/b" in result.errors[0]


REAL_ROOT = Path("/sys/fs/cgroup")


@pytest.mark.skipif(os.geteuid() != 0 or not (REAL_ROOT / "cpu" / "cpu.cfs_quota_us").is_file(),
                    reason="needs root and a cgroup v1 cpu hierarchy")
def test_real_kernel_einval_is_backed_off() -> None:
    """cgroup v1 refuses a child quota above its parent's with EINVAL (what a too small
    besteffort quota meets when a BE pod has a larger one)."""
    parent = f"koord-test-{uuid.uuid4().hex[:8]}"
    child = f"{parent}/child"
    (REAL_ROOT / "cpu" / child).mkdir(parents=True)
    try:
        ex = ResourceExecutor(CgroupLayout(REAL_ROOT))
        assert ex.update(Update(parent, "cpu_quota", 10000)) is True
        with pytest.raises(CgroupError) as first:
            ex.update(Update(child, "cpu_quota", 20000))
        assert first.value.errno == errno.EINVAL, first.value
        with pytest.raises(CgroupError, match="skipped: the kernel rejected it with EINVAL"):
            ex.update(Update(child, "cpu_quota", 20000))
        assert ex.update(Update(child, "cpu_quota", 5000)) is True
        assert (REAL_ROOT / "cpu" / child / "cpu.cfs_quota_us").read_text().strip() == "5000"
    finally:
        (REAL_ROOT / "cpu" / child).rmdir()
        (REAL_ROOT / "cpu" / parent).rmdir()


@pytest.mark.skipif(os.geteuid() != 0 or not (REAL_ROOT / "cpuset" / "cpuset.cpus").is_file()
                    or (os.cpu_count() or 1) < 2, reason="needs root, a cgroup v1 cpuset hierarchy, 2 cpus")
def test_real_kernel_leveled_cpuset_move() -> None:
    """Moving a parent/child pair from cpu 0 to cpu 1: written top-down exactly, the kernel
    refuses the parent with EBUSY (its child still uses cpu 0); leveled, both end on cpu 1."""
    parent = f"koord-test-{uuid.uuid4().hex[:8]}"
    child = f"{parent}/child"
    base = REAL_ROOT / "cpuset"
    (base / child).mkdir(parents=True)
    try:
        for d in (parent, child):
            (base / d / "cpuset.mems").write_text((base / "cpuset.mems").read_text())
            (base / d / "cpuset.cpus").write_text("0")
        ex = ResourceExecutor(CgroupLayout(REAL_ROOT))
        with pytest.raises(CgroupError) as refused:
            ex.update(Update(parent, "cpuset_cpus", "1"), cacheable=False)
        assert refused.value.errno == errno.EBUSY
        result = ex.leveled_update([[Update(parent, "cpuset_cpus", "1")], [Update(child, "cpuset_cpus", "1")]])
        assert result.errors == []
        assert [(base / d / "cpuset.cpus").read_text().strip() for d in (parent, child)] == ["1", "1"]
    finally:
        (base / child).rmdir()
        (base / parent).rmdir()


def update_counts(metrics: KoordletMetrics) -> dict[str, float]:
    """koordlet_resource_update_duration_milliseconds' count by status (type is always cgroup here)."""
    got = samples(metrics, "/internal-metrics", "koordlet_resource_update_duration_milliseconds_count")
    assert all(dict(labels)["type"] == "cgroup" for labels in got)
    return {dict(labels)["status"]: value for labels, value in got.items()}


def test_each_write_the_kernel_is_asked_to_take_is_timed_as_upstreams_histogram(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = KoordletMetrics("n1")
    make_fake_v1_cgroup(tmp_path, CTR)
    ex = ResourceExecutor(CgroupLayout(tmp_path, driver="cgroupfs"), observe_write=metrics.record_cgroup_update)
    assert update_counts(metrics) == {}  # no series before the first write, as upstream's
    assert ex.update(Update(CTR, "cpu_shares", 512)) is True
    assert ex.update(Update(CTR, "cpu_shares", 512), cacheable=False) is False  # the file holds it: no write
    assert ex.apply(POD, Resources(cpu_quota=50000, cpuset_cpus="0")) == ["cpu_quota", "cpuset_cpus"]  # the hooks'
    assert update_counts(metrics) == {"success": 3}
    [(labels, total)] = samples(metrics, "/internal-metrics",
                                "koordlet_resource_update_duration_milliseconds_sum").items()
    assert labels == labelled(type="cgroup", status="success") and total > 0

    real_write, real_open = os.write, os.open

    def kernel(fd: int, data: bytes) -> int:
        if data == b"3000":
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(executor_module.os, "write", kernel)
    for _ in range(2):  # the second is in back-off: not written, not timed
        with pytest.raises(CgroupError, match="EINVAL|Invalid argument"):
            ex.update(Update(BE, "cpu_quota", 3000))
    assert update_counts(metrics) == {"success": 3, "failed": 1}

    def gone_before_the_write(path: str, flags: int, *args: int) -> int:
        if flags & os.O_WRONLY:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        return real_open(path, flags, *args)

    monkeypatch.setattr(executor_module.os, "open", gone_before_the_write)
    with pytest.raises(CgroupError, match="missing"):
        ex.update(Update(CTR, "cpu_shares", 1024))
    assert update_counts(metrics) == {"success": 3, "failed": 1}  # a cgroup gone is no failure, as upstream

"""CgroupExecutor on fake v1/v2 trees, plus one round trip on the real cgroup v1 hierarchy."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from koord.hookapi import format_cpuset, parse_cpuset
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupError, CgroupExecutor, shares_to_weight
from koord.koordlet.resources import Resources

POD = "kubepods/besteffort/pod1"
V1_UNLIMITED = "9223372036854771712"


def v1_tree(root: Path, cgroup_dir: str = POD) -> CgroupExecutor:
    files = {
        "cpu": {"cpu.shares": "1024", "cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000",
                "cpu.bvt_warp_ns": "0", "tasks": "11\n12\n"},
        "memory": {"memory.limit_in_bytes": V1_UNLIMITED},
        "cpuset": {"cpuset.cpus": "0-3", "cpuset.mems": "0"},
    }
    for subsystem, content in files.items():
        d = root / subsystem / cgroup_dir
        d.mkdir(parents=True, exist_ok=True)
        for name, text in content.items():
            (d / name).write_text(text + "\n")
    return CgroupExecutor(CgroupLayout(root))


def v2_tree(root: Path, cgroup_dir: str = POD) -> CgroupExecutor:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    d = root / cgroup_dir
    d.mkdir(parents=True)
    for name, text in {"cpu.weight": "100", "cpu.max": "max 100000", "memory.max": "max",
                       "cpuset.cpus": "", "cpuset.mems": "", "cgroup.threads": "21\n22\n",
                       "memory.high": "max"}.items():
        (d / name).write_text(text + "\n")
    return CgroupExecutor(CgroupLayout(root))


def content(path: Path) -> str:
    return path.read_text().strip()


# ---- layout --------------------------------------------------------------------------------

def test_version_detected_from_root(tmp_path: Path) -> None:
    assert v1_tree(tmp_path / "a").version == 1
    assert v2_tree(tmp_path / "b").version == 2


@pytest.mark.parametrize("parent, expected", [
    ("/kubepods/besteffort/pod1", "kubepods/besteffort/pod1"),
    ("/kubepods/pod9", "kubepods/pod9"),
    ("kubepods-besteffort-pod1_2.slice",
     "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice"),
    ("kubepods-pod7.slice", "kubepods.slice/kubepods-pod7.slice"),
    ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3.slice",
     "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3.slice"),
])
def test_pod_dir(tmp_path: Path, parent: str, expected: str) -> None:
    assert CgroupExecutor(CgroupLayout(tmp_path)).pod_dir(parent) == expected


@pytest.mark.parametrize("parent, expected", [
    ("/kubepods/besteffort/pod1", "kubepods/besteffort/pod1/abc"),
    ("kubepods-besteffort-pod1.slice",
     "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope"),
])
def test_container_dir(tmp_path: Path, parent: str, expected: str) -> None:
    assert CgroupExecutor(CgroupLayout(tmp_path)).container_dir(parent, "abc") == expected


@pytest.mark.parametrize("parent", ["", "/kubepods/../../etc"])
def test_pod_dir_rejects_bad_parent(tmp_path: Path, parent: str) -> None:
    with pytest.raises(CgroupError):
        CgroupExecutor(CgroupLayout(tmp_path)).pod_dir(parent)


def test_path_v1_and_v2(tmp_path: Path) -> None:
    v1, v2 = CgroupExecutor(CgroupLayout(tmp_path, version=1)), CgroupExecutor(CgroupLayout(tmp_path, version=2))
    assert v1.path(POD, "cpu_shares") == tmp_path / "cpu" / POD / "cpu.shares"
    assert v1.path(POD, "memory_limit") == tmp_path / "memory" / POD / "memory.limit_in_bytes"
    assert v1.path(POD, "cpuset_cpus") == tmp_path / "cpuset" / POD / "cpuset.cpus"
    assert v2.path(POD, "cpu_shares") == tmp_path / POD / "cpu.weight"
    assert v2.path(POD, "cpu_quota") == tmp_path / POD / "cpu.max"
    assert v1.path(POD, "cpu_burst") == tmp_path / "cpu" / POD / "cpu.cfs_burst_us"
    assert v2.path(POD, "cpu_burst") == tmp_path / POD / "cpu.max.burst"
    with pytest.raises(CgroupError, match="unknown cgroup resource"):
        v1.path(POD, "cpu_idle_typo")


def test_path_not_kept_is_the_same_path_and_leaves_the_cache_as_it_was(tmp_path: Path) -> None:
    ex = CgroupExecutor(CgroupLayout(tmp_path, version=1))
    kept = ex.path(POD, "cpu_shares")
    assert ex.path(POD, "memory_stat", keep=False) == tmp_path / "memory" / POD / "memory.stat"
    assert ex.path(POD, "cpu_shares", keep=False) is kept  # a cached one is still handed out
    assert list(ex._paths) == [(POD, "cpu_shares")]


@pytest.mark.parametrize("version, name", [(1, "cpu.cfs_burst_us"), (2, "cpu.max.burst")])
def test_burst_is_range_checked_before_the_kernel(tmp_path: Path, version: int, name: str) -> None:
    ex = CgroupExecutor(CgroupLayout(tmp_path, version=version))
    path = ex.path(POD, "cpu_burst")
    path.parent.mkdir(parents=True)
    path.write_text("0\n")
    assert ex.write(POD, "cpu_burst", 200000) and path.read_text() == "200000"
    for bad in (-1, 1 << 44, "x"):
        with pytest.raises(CgroupError, match="cpu_burst"):
            ex.write(POD, "cpu_burst", bad)
    assert path.read_text() == "200000"


# ---- v1 ------------------------------------------------------------------------------------

def test_v1_write_then_skip_same_value(tmp_path: Path) -> None:
    ex = v1_tree(tmp_path)
    assert ex.write(POD, "cpu_shares", 512) is True
    assert content(tmp_path / "cpu" / POD / "cpu.shares") == "512"
    assert ex.read(POD, "cpu_shares") == "512"
    assert ex.write(POD, "cpu_shares", "512") is False


@pytest.mark.parametrize("resource, value, expect_write", [
    ("memory_limit", -1, False),             # reads back as LONG_MAX page-aligned: unlimited
    ("memory_limit", 2147483648, True),
    ("cpuset_cpus", "0,1,2,3", False),       # same set, other spelling
    ("cpuset_cpus", "0-1", True),
    ("cpu_quota", -1, False),
    ("cpu_quota", 50000, True),
    ("cpu_bvt_warp_ns", 0, False),
    ("cpu_bvt_warp_ns", -1, True),
])
def test_v1_skip_compares_normalized(tmp_path: Path, resource: str, value: int | str,
                                     expect_write: bool) -> None:
    ex = v1_tree(tmp_path)
    before = ex.read(POD, resource)
    assert ex.write(POD, resource, value) is expect_write
    assert (ex.read(POD, resource) != before) is expect_write


@pytest.mark.parametrize("resource, value, reason", [
    ("cpu_shares", 1, "out of range"),
    ("cpu_shares", 262145, "out of range"),
    ("cpu_bvt_warp_ns", 3, "out of range"),
    ("cpu_bvt_warp_ns", -2, "out of range"),
    ("cpu_quota", 0, "out of range"),
    ("cpu_quota", -5, "out of range"),
    ("memory_limit", 0, "out of range"),
    # batch-cpu 1e30, 2**63-1 and 10**40 used to reach cpu.cfs_quota_us as 1e32, 9.2e20, 1e39.
    ("cpu_quota", 10**32, "out of range"),
    ("cpu_quota", 922337203685477580700, "out of range"),
    ("cpu_quota", 10**39, "out of range"),
    ("cpu_quota", 2**44, "out of range"),
    ("cpu_quota", 999, "out of range"),
    ("memory_limit", 2**63, "out of range"),
    ("cpu_period", 10**7, "out of range"),
    ("cpu_shares", 1024 * 10**12, "out of range"),
    ("cpu_shares", "lots", "not an integer"),
    ("cpu_shares", True, "not an integer"),
    ("cpuset_cpus", "a-b", "rejected"),
    ("cpuset_cpus", "3-1", "rejected"),
    ("cpuset_mems", 0, "not a cpu list"),
])
def test_v1_rejects_out_of_range(tmp_path: Path, resource: str, value: object, reason: str) -> None:
    ex = v1_tree(tmp_path)
    before = ex.read(POD, resource)
    with pytest.raises(CgroupError, match=reason) as info:
        ex.write(POD, resource, value)
    assert str(ex.path(POD, resource)) in str(info.value)
    assert ex.read(POD, resource) == before


def test_missing_cgroup_is_an_error_and_not_created(tmp_path: Path) -> None:
    ex = v1_tree(tmp_path)
    with pytest.raises(CgroupError, match="missing"):
        ex.write("kubepods/podgone", "cpu_shares", 512)
    with pytest.raises(CgroupError, match="missing"):
        ex.read("kubepods/podgone", "cpu_shares")
    assert not (tmp_path / "cpu" / "kubepods" / "podgone").exists()
    assert ex.supports(POD, "cpu_bvt_warp_ns")
    assert not ex.supports("kubepods/podgone", "cpu_bvt_warp_ns")


def test_tasks_are_read_only(tmp_path: Path) -> None:
    ex = v1_tree(tmp_path)
    assert ex.read(POD, "tasks").split() == ["11", "12"]
    with pytest.raises(CgroupError, match="read-only"):
        ex.write(POD, "tasks", "1")


def test_v1_apply_writes_only_changes(tmp_path: Path) -> None:
    ex = v1_tree(tmp_path)
    res = Resources(cpu_shares=512, cpu_quota=50000, memory_limit=-1, cpuset_cpus="0-3",
                    cpu_bvt_warp_ns=2)
    assert ex.apply(POD, res) == ["cpu_quota", "cpu_shares", "cpu_bvt_warp_ns"]
    assert content(tmp_path / "cpu" / POD / "cpu.cfs_quota_us") == "50000"
    assert content(tmp_path / "cpu" / POD / "cpu.bvt_warp_ns") == "2"
    assert ex.apply(POD, res) == []


def test_v1_ignores_unified(tmp_path: Path) -> None:
    ex = v1_tree(tmp_path)
    assert ex.apply(POD, Resources(unified={"memory.high": "1000"})) == []


# ---- v2 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shares, weight", [(2, 1), (1024, 39), (262144, 10000)])
def test_v2_shares_become_weight(tmp_path: Path, shares: int, weight: int) -> None:
    ex = v2_tree(tmp_path)
    assert shares_to_weight(shares) == weight
    ex.write(POD, "cpu_shares", shares)
    assert content(tmp_path / POD / "cpu.weight") == str(weight)


@pytest.mark.parametrize("writes, expected", [
    ([("cpu_quota", 50000)], "50000 100000"),
    ([("cpu_quota", 50000), ("cpu_quota", -1)], "max 100000"),
    ([("cpu_period", 200000)], "max 200000"),
    ([("cpu_period", 200000), ("cpu_quota", 30000)], "30000 200000"),
])
def test_v2_cpu_max_keeps_other_half(tmp_path: Path, writes: list[tuple[str, int]], expected: str) -> None:
    ex = v2_tree(tmp_path)
    for resource, value in writes:
        assert ex.write(POD, resource, value) is True
    assert content(tmp_path / POD / "cpu.max") == expected


def test_v2_skips_unchanged_cpu_max_and_memory(tmp_path: Path) -> None:
    ex = v2_tree(tmp_path)
    assert ex.write(POD, "cpu_quota", -1) is False
    assert ex.write(POD, "memory_limit", -1) is False
    assert ex.write(POD, "memory_limit", 1 << 30) is True
    assert content(tmp_path / POD / "memory.max") == str(1 << 30)
    assert ex.write(POD, "memory_limit", -1) is True
    assert content(tmp_path / POD / "memory.max") == "max"


def test_v2_apply_quota_and_period_in_one_write(tmp_path: Path) -> None:
    ex = v2_tree(tmp_path)
    written = ex.apply(POD, Resources(cpu_quota=50000, cpu_period=50000, cpu_shares=1024,
                                      cpuset_cpus="0-1", unified={"memory.high": "1000"}))
    assert written == ["cpu_period", "cpu_quota", "cpu_shares", "cpuset_cpus", "unified:memory.high"]
    assert content(tmp_path / POD / "cpu.max") == "50000 50000"
    assert content(tmp_path / POD / "memory.high") == "1000"
    assert ex.read(POD, "tasks").split() == ["21", "22"]


def test_v2_unified_missing_file(tmp_path: Path) -> None:
    ex = v2_tree(tmp_path)
    with pytest.raises(CgroupError, match="missing"):
        ex.apply(POD, Resources(unified={"io.max": "8:0 rbps=1"}))


# ---- cpuset syntax -------------------------------------------------------------------------

@pytest.mark.parametrize("text, cpus, compact", [
    ("0-3,5", [0, 1, 2, 3, 5], "0-3,5"),
    ("5,0,1,2", [0, 1, 2, 5], "0-2,5"),
    ("", [], ""),
    ("7", [7], "7"),
])
def test_cpuset_syntax(text: str, cpus: list[int], compact: str) -> None:
    assert parse_cpuset(text) == cpus
    assert format_cpuset(cpus) == compact


@pytest.mark.parametrize("text", ["0-", "-1", "1,,2", "a", "4-2", "0 1"])
def test_cpuset_syntax_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpuset(text)


# ---- the real hierarchy --------------------------------------------------------------------

REAL_ROOT = Path("/sys/fs/cgroup")


@pytest.mark.skipif(os.geteuid() != 0 or not (REAL_ROOT / "cpu" / "cpu.shares").is_file(),
                    reason="needs root and a cgroup v1 cpu hierarchy")
def test_real_cgroup_v1_round_trip() -> None:
    name = f"koord-test-{uuid.uuid4().hex[:8]}"
    cgroup = REAL_ROOT / "cpu" / name
    cgroup.mkdir()
    try:
        ex = CgroupExecutor(CgroupLayout(REAL_ROOT))
        assert ex.version == 1
        assert ex.write(name, "cpu_shares", 512) is True
        assert ex.read(name, "cpu_shares") == "512"
        assert ex.write(name, "cpu_shares", 512) is False
        assert ex.apply(name, Resources(cpu_quota=50000, cpu_shares=256)) == ["cpu_quota", "cpu_shares"]
        assert (cgroup / "cpu.cfs_quota_us").read_text().strip() == "50000"
        with pytest.raises(CgroupError, match="out of range"):
            ex.write(name, "cpu_shares", 1)
    finally:
        cgroup.rmdir()


@pytest.mark.skipif(os.geteuid() != 0 or not (REAL_ROOT / "memory" / "memory.limit_in_bytes").is_file(),
                    reason="needs root and a cgroup v1 memory hierarchy")
def test_real_cgroup_v1_memory_unlimited_reads_back_as_huge_number() -> None:
    name = f"koord-test-{uuid.uuid4().hex[:8]}"
    cgroup = REAL_ROOT / "memory" / name
    cgroup.mkdir()
    try:
        ex = CgroupExecutor(CgroupLayout(REAL_ROOT))
        assert ex.write(name, "memory_limit", -1) is False
        assert ex.write(name, "memory_limit", 2147483648) is True
        assert ex.read(name, "memory_limit") == "2147483648"
        assert ex.write(name, "memory_limit", -1) is True
        assert ex.read(name, "memory_limit") == V1_UNLIMITED
    finally:
        cgroup.rmdir()


@pytest.mark.parametrize("version, made, asked, gone", [
    # 1: a container that left: its pod dir is there
    (1, "kubepods/besteffort/pod1", "kubepods/besteffort/pod1/c1", True),
    # 2: a pod that left with its containers: the QoS dir is there
    (1, "kubepods/besteffort", "kubepods/besteffort/pod1/c1", True),
    # 3: the cgroup is there without the file (a kernel without it)
    (1, "kubepods/besteffort/pod1/c1", "kubepods/besteffort/pod1/c1", False),
    # 4: no kube tree where it is looked for (a wrong cgroup root or kube dir)
    (1, "", "kubepods/besteffort/pod1", False),
    # 5-6: the same on the one v2 tree
    (2, "kubepods/besteffort", "kubepods/besteffort/pod1", True),
    (2, "", "kubepods/besteffort/pod1", False),
])
def test_gone_tells_a_cgroup_that_left_from_one_looked_for_in_the_wrong_place(
        tmp_path: Path, version: int, made: str, asked: str, gone: bool) -> None:
    base = tmp_path / "cpu" if version == 1 else tmp_path
    (base / made).mkdir(parents=True, exist_ok=True)
    ex = CgroupExecutor(CgroupLayout(tmp_path, driver="cgroupfs", version=version))
    with pytest.raises(CgroupError) as err:
        ex.read(asked, "cpu_shares")
    assert err.value.missing == ex.path(asked, "cpu_shares")
    assert ex.gone(err.value) is gone
    assert not ex.gone(CgroupError("write refused", errno=22))

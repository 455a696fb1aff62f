"""The cache of what is known per cgroup file: bounded by forgetting the files of cgroups
that are gone, however many pods a node runs over its life."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from koord.koordlet.resourceexecutor.pathcache import CgroupFileCache


def cache(min_size: int) -> CgroupFileCache[tuple[str, str], str]:
    return CgroupFileCache(lambda _, name: name, min_size=min_size)


@pytest.mark.parametrize("name, live, gone, min_size, want_kept, want_prune_at", [
    # 1: everything live: kept, and the next prune waits for twice as many
    ("all-live", 4, 0, 4, 4, 8),
    # 2: the files of removed cgroups go; the next prune at the minimum
    ("gone-dropped", 1, 3, 4, 1, 4),
    # 3: nothing live
    ("all-gone", 0, 4, 4, 0, 4),
])
def test_prune_cases(tmp_path: Path, name, live, gone, min_size, want_kept, want_prune_at) -> None:
    c = cache(min_size)
    for i in range(live + gone):
        (tmp_path / f"cg{i}").mkdir()
        c.put((f"cg{i}", "cpu_quota"), str(tmp_path / f"cg{i}" / "cpu.cfs_quota_us"))
    for i in range(live, live + gone):
        (tmp_path / f"cg{i}").rmdir()
    c.prune()
    assert len(c) == want_kept and c.prune_at == want_prune_at
    assert sorted(c) == [(f"cg{i}", "cpu_quota") for i in range(live)]
    assert all(c.get(k) is not None for k in c)


def test_bounded_by_the_live_cgroups_under_churn(tmp_path: Path) -> None:
    """1000 pods come and go (three files each) while 10 stay: the cache never holds more
    than twice the live files or the minimum, and the live ones are always there."""
    c = cache(16)
    live = [tmp_path / f"live{i}" for i in range(10)]
    for d in live:
        d.mkdir()
    for n in range(1000):
        pod = tmp_path / f"pod{n}"
        pod.mkdir()
        for d in [*live, pod]:
            for resource in ("cpu_quota", "cpu_burst", "memory_limit"):
                if c.get((d.name, resource)) is None:
                    c.put((d.name, resource), str(d / resource))
        shutil.rmtree(pod)
        assert len(c) <= max(16, 2 * 33)
        assert all(c.get((d.name, "cpu_quota")) is not None for d in live)

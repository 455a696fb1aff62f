"""MemoryTrimmer: one trim after a large message, none after small ones, never two at once."""

from __future__ import annotations

import asyncio

import pytest

from koord.runtimeproxy import memtrim


@pytest.mark.parametrize("sizes, trims", [
    ([], 0),
    ([1024, 4 << 20 - 1], 0),
    ([4 << 20], 1),
    ([60 << 20, 60 << 20, 60 << 20], 1),   # a burst: one trim after it
])
def test_trims_once_after_large_messages(sizes, trims) -> None:
    calls: list[int] = []

    async def main() -> memtrim.MemoryTrimmer:
        trimmer = memtrim.MemoryTrimmer(delay=0.01, trim=lambda pad: calls.append(pad) or 1)
        for size in sizes:
            trimmer.note(size)
        await asyncio.sleep(0.05)
        return trimmer

    trimmer = asyncio.run(main())
    assert len(calls) == trims == trimmer.trims
    assert all(pad == 0 for pad in calls)


def test_glibc_functions_are_found_here() -> None:
    # CI runs on glibc: a missing symbol would silently disable both measures.
    assert memtrim._load_malloc_trim() is not None
    assert memtrim.limit_arenas()

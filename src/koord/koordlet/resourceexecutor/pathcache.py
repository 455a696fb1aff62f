"""What is kept per cgroup file, forgotten when the file's cgroup is gone.

Resolving a (cgroup dir, resource) pair to its file costs more than reading the file, and
the collectors and QoS strategies ask for the same thousands of pairs every second, so
the answers are kept (and the executor keeps the number of its last write to each file).
Pods come and go all day, each leaving a few files behind: a dict cleared only when full
grows with every pod a node ever ran. This one, on reaching ``prune_at`` entries, drops
those whose file's directory no longer exists, and waits for the next prune until it has
doubled from what was left (and at least ``min_size``): it holds at most about twice the
live cgroups' files, and a node whose live files fill it is not pruned on every new one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULT_MIN_SIZE = 1024


class CgroupFileCache(Generic[K, V]):
    """key -> value, where ``file_of(key, value)`` names the cgroup file it is about."""

    def __init__(self, file_of: Callable[[K, V], str | os.PathLike[str]],
                 min_size: int = DEFAULT_MIN_SIZE) -> None:
        self.file_of = file_of
        self.min_size = min_size
        self.prune_at = min_size
        # A plain dict replaced whole by a prune: a thread racing a prune at worst loses
        # one entry, which is then made again.
        self._items: dict[K, V] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._items))

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        if len(self._items) >= self.prune_at:
            self.prune()
        self._items[key] = value

    def prune(self) -> None:
        """Forgets the entries of cgroups that are gone (one ``stat`` per distinct directory)."""
        alive: dict[str, bool] = {}
        kept: dict[K, V] = {}
        for key, value in list(self._items.items()):
            directory = os.path.dirname(os.fspath(self.file_of(key, value)))
            exists = alive.get(directory)
            if exists is None:
                exists = alive[directory] = os.path.isdir(directory)
            if exists:
                kept[key] = value
        self._items = kept
        self.prune_at = max(self.min_size, 2 * len(kept))

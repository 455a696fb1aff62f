"""Pods a periodic strategy need not pass over again: their last pass found every cgroup
file as wanted and wrote nothing, and nothing that pass depended on has changed since.

A pass over a pod reads its cgroup files and writes what differs. Given the same inputs
(the pod list, the strategy's config: ``begin`` forgets every pod when they change) a
second pass would read the same files and again write nothing, unless a file changed.
Files written by this process go through the resource executor, which says whether it
wrote any of them since (``written_since``); writers outside this process (kubelet,
runc) are caught by passing over each pod again every ``max_rounds`` rounds at the
latest, so such a change is noticed within that many rounds.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from ..resourceexecutor.updater import ResourceExecutor

T = TypeVar("T")


@dataclass(frozen=True)
class Settled(Generic[T]):
    round: int
    seq: int
    """The executor's write number before the quiet pass."""
    paths: tuple[Path, ...]
    """The files the pass read or would have written."""
    kept: T
    """What the strategy repeats for a pod it skips (the metric series the pass set)."""


class SettledPods(Generic[T]):
    def __init__(self, executor: ResourceExecutor, max_rounds: int) -> None:
        self.executor = executor
        self.max_rounds = max_rounds
        self.round = 0
        self._inputs: Hashable = None
        self._pods: dict[str, Settled[T]] = {}

    def begin(self, inputs: Hashable) -> None:
        """Starts a round; ``inputs`` differing from the last round's forgets every pod."""
        self.round += 1
        if inputs != self._inputs:
            self._pods.clear()
            self._inputs = inputs

    def get(self, uid: str) -> Settled[T] | None:
        """The pod's record while it holds: None when it has none, its files are due to be
        read again, or this process wrote one of them since."""
        found = self._pods.get(uid)
        if found is None:
            return None
        if self.round - found.round >= self.max_rounds or (
                self.executor.write_seq != found.seq and self.executor.written_since(found.paths, found.seq)):
            del self._pods[uid]
            return None
        return found

    def settle(self, uid: str, seq: int, paths: tuple[Path, ...], kept: T) -> None:
        """The pod's pass this round, begun at write number ``seq``, wrote nothing and failed
        nowhere (the caller checks both, and that the pass depended on nothing else)."""
        self._pods[uid] = Settled(self.round, seq, paths, kept)

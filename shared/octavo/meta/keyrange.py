"""Key ranges of etcd: the end of a prefix's range, and what a watch covers and how far it got."""

from __future__ import annotations

from dataclasses import dataclass


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with `prefix`."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[:i + 1])
    return b"\0"


@dataclass
class WatchPosition:
    """How far a watch got: every event up to `revision` (inclusive) was delivered to its caller. 0: not
    started (a watch given it starts after etcd's current revision)."""

    revision: int = 0


@dataclass(frozen=True)
class WatchRange:
    """A range of keys a watch_changes stream covers, and which changes it reports."""

    start: bytes
    end: bytes
    puts: bool = True
    deletes: bool = True

    @staticmethod
    def prefix(prefix: bytes, puts: bool = True, deletes: bool = True) -> WatchRange:
        return WatchRange(prefix, prefix_end(prefix), puts, deletes)

    @staticmethod
    def key(key: bytes, puts: bool = True, deletes: bool = True) -> WatchRange:
        return WatchRange(key, b"", puts, deletes)

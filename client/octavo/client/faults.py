"""Named fault points in the client: places where a test can make a writer's process die with SIGKILL, as a
crashed application would, to test what readers and recovery opens make of what it left behind.

Off unless the environment variable OCTAVO_CLIENT_FAULT_POINTS names them (comma-separated `name` or `name@N` to
die on the N-th hit), read once at import, as the bookie's OCTAVO_FAULT_POINTS (octavo.node.faults). A variable
of its own: a process that runs bookies and clients together must not have a bookie's point refused as unknown
here, nor the other way round. Applications never set it; `hit()` then costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
import threading

CLIENT_FAULT_POINTS_ENV = "OCTAVO_CLIENT_FAULT_POINTS"

# The writer's ensemble change, after the CAS that put the new segment in etcd and before the entries past the
# LAC are sent to the replacement bookie: the replacement then holds none of them.
ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS = "ensemble_change.after_segment_cas"
# Every point the code knows, so a test cannot name one that does not exist.
KNOWN_POINTS = frozenset({ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS})


def parse(spec: str) -> dict[str, int]:
    """`name` or `name@N` items, comma-separated, to {name: the hit to die on (1-based)}."""
    armed: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, nth = item.partition("@")
        if name not in KNOWN_POINTS:
            raise ValueError(f"unknown client fault point {name!r}; known: {', '.join(sorted(KNOWN_POINTS))}")
        count = int(nth) if nth else 1
        if count < 1:
            raise ValueError(f"client fault point {name!r}: the hit to die on must be >= 1, got {count}")
        armed[name] = count
    return armed


_armed = parse(os.environ.get(CLIENT_FAULT_POINTS_ENV, ""))
_hits: dict[str, int] = {}
_lock = threading.Lock()


def hit(name: str) -> None:
    """Die here with SIGKILL if this point is armed and this is the hit it waits for."""
    if not _armed or name not in _armed:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] >= _armed[name]:
            os.kill(os.getpid(), signal.SIGKILL)

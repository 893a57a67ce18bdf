"""Named fault points, shared by the bookie's (octavo.node.faults) and the client's (octavo.client.faults): places
where a test makes the process die with SIGKILL (or, at an IO point, makes the call fail with EIO). Off unless
the process's environment variable names them (comma-separated `name` or `name@N` to act on the N-th hit), read
once; `hit()` then costs one dict lookup."""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Callable


class FaultPoints:
    """The points a process knows and those armed in its environment variable (read once, at creation); shared
    by the client's points here and the bookie's (octavo.node.faults)."""

    def __init__(self, known: frozenset[str], env: str, label: str) -> None:
        self.known = known
        self.label = label
        self._armed = self.parse(os.environ.get(env, ""))
        self._hits: dict[str, int] = {}
        self._lock = threading.Lock()
        self._on_hit: Callable[[str], None] | None = None

    def arm(self, spec: str, on_hit: Callable[[str], None] | None = None) -> None:
        """Arm points from now on, as the environment variable does (`name` or `name@N`, comma-separated; ""
        disarms all). `on_hit`, when given, is called instead of killing this process (the deterministic
        simulation crashes one simulated node there: octavo.sim)."""
        armed = self.parse(spec)
        with self._lock:
            self._armed, self._hits, self._on_hit = armed, {}, on_hit

    def parse(self, spec: str) -> dict[str, int]:
        """`name` or `name@N` items, comma-separated, to {name: the hit to die on (1-based)}."""
        armed: dict[str, int] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, nth = item.partition("@")
            if name not in self.known:
                raise ValueError(f"unknown {self.label} {name!r}; known: {', '.join(sorted(self.known))}")
            count = int(nth) if nth else 1
            if count < 1:
                raise ValueError(f"{self.label} {name!r}: the hit to die on must be >= 1, got {count}")
            armed[name] = count
        return armed

    def hit(self, name: str) -> None:
        """Die here with SIGKILL if this point is armed and this is the hit it waits for."""
        if self._reached(name):
            if self._on_hit is not None:
                self._on_hit(name)
                return
            os.kill(os.getpid(), signal.SIGKILL)

    def fail_io(self, name: str) -> None:
        """Raise OSError(EIO) here if this point is armed and this is the hit it waits for, and at every hit after
        it: a disk that failed once goes on failing (a point for IO calls whose failure the code must survive,
        such as an fsync; the process is not killed)."""
        if self._reached(name):
            raise OSError(errno.EIO, f"{self.label} {name}: simulated disk error")

    def _reached(self, name: str) -> bool:
        if not self._armed or name not in self._armed:
            return False
        with self._lock:
            self._hits[name] = self._hits.get(name, 0) + 1
            return self._hits[name] >= self._armed[name]

"""Adds a bookie refused for the moment are sent to the same bookie again, not answered by an ensemble change.

UNAVAILABLE: the bookie cannot check the ledger's metadata in etcd now (its first contact with the ledger, etcd
unreachable for longer than the read's own resends). The bookie is healthy, and replacing it would need that
same etcd. So the write handle pauses the bookie (nothing more is sent to it meanwhile, so its answers stay in
order), waits a pause that doubles from RESEND_PAUSE_S to RESEND_PAUSE_S_MAX, half of it jittered (writers that
met the same outage do not come back in lock step), and sends it every entry past the LAC of its write sets
again, in one request. Bounded: a streak of refusals ends in an ensemble change once the next resend would go
out more than add_timeout_s after the streak's first refusal, or after RESEND_ATTEMPTS_MAX resends. An answer
that stores entries ends the streak.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

RESEND_PAUSE_S, RESEND_PAUSE_S_MAX = 0.05, 1.0
RESEND_ATTEMPTS_MAX = 100


class Loop(Protocol):
    """What Resends needs of the event loop (a test passes a clock of its own)."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> object: ...


def resend_pause_s(attempt: int, uniform: Callable[[float, float], float] = random.uniform) -> float:
    """The pause before resend `attempt` (0 for the first) of a streak."""
    if attempt < 0:
        raise ValueError(f"attempt must be non-negative, got {attempt}")
    cap = min(RESEND_PAUSE_S_MAX, RESEND_PAUSE_S * 2 ** min(attempt, 30))
    return float(cap / 2 + uniform(0, cap / 2))


class Resends:
    """The streaks of one write handle's bookies: (loop time of the first refusal, resends so far) per bookie.
    `resend(bookie_id)` sends the bookie its unacknowledged entries when its pause is over; `replace(bookie_id,
    reason)` starts an ensemble change when the bound is spent."""

    def __init__(self, timeout_s: float, loop: Loop, resend: Callable[[str], None],
                 replace: Callable[[str, str], None]) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self._loop = loop
        self._resend = resend
        self._replace = replace
        self.paused: set[str] = set()  # bookies waiting for their resend: the handle sends them nothing
        self.streaks: dict[str, tuple[float, int]] = {}
        self.sent = 0  # resends so far, all bookies

    def refused(self, bookie_id: str, reason: str) -> None:
        """The bookie refused adds for the moment: it is paused and gets them again after the pause, or, once the
        streak's bound is spent, the streak ends and the bookie is replaced."""
        now = self._loop.time()
        first, attempts = self.streaks.get(bookie_id, (now, 0))
        pause = resend_pause_s(attempts)
        if attempts >= RESEND_ATTEMPTS_MAX or now + pause - first > self.timeout_s:
            self.end(bookie_id)
            self._replace(bookie_id, f"{reason} (for {now - first:.1f}s, {attempts} resends; add_timeout_s="
                                     f"{self.timeout_s})")
            return
        self.streaks[bookie_id] = (first, attempts + 1)
        self.paused.add(bookie_id)
        self._loop.call_later(pause, self._resume, bookie_id)

    def _resume(self, bookie_id: str) -> None:
        if bookie_id in self.paused:  # not ended meanwhile
            self.paused.discard(bookie_id)
            self.sent += 1
            self._resend(bookie_id)

    def end(self, bookie_id: str) -> None:
        """The bookie stored entries, or left the ensemble: its next refusal starts a new streak."""
        self.streaks.pop(bookie_id, None)
        self.paused.discard(bookie_id)

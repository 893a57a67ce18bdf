"""Bounded compare-and-swap retries: exponential backoff with full jitter, and a message that names the rival.

A lost CAS means another party wrote the key between our read and our write. Retrying at once makes N
contenders spend N-1 wasted round trips per winner, and in lock step they keep colliding; waiting a random time
in [0, min(cap, base * 2^attempt)] ("full jitter") spreads them out, so each round has fewer rivals. Every loop
has a named bound on its attempts, and a loop that gives up says how often it lost and to what.

Pure but for the sleep: the delays come from a `random.Random` that a test can seed.
"""

from __future__ import annotations

import asyncio
import random

from octavo.meta.errors import MetadataUnavailableError

CAS_DELAY_MS_INITIAL = 2.0
CAS_DELAY_MS_MAX = 250.0


class ContentionError(MetadataUnavailableError):
    """A compare-and-swap loop lost its race `attempts_max` times in a row: the message says to what."""


class CasRetry:
    """One CAS loop's retry state. Call `lost(rival)` after each lost CAS: it waits the next backoff delay, or
    raises `error` (ContentionError by default) once `attempts_max` attempts have been lost.

        retry = CasRetry("ledger 5: close", CLOSE_CAS_ATTEMPTS_MAX)
        while True:
            if await try_cas():
                return
            await retry.lost(f"revision {rev}, state {state}")
    """

    def __init__(self, what: str, attempts_max: int, *, delay_ms_initial: float = CAS_DELAY_MS_INITIAL,
                 delay_ms_max: float = CAS_DELAY_MS_MAX, error: type[Exception] = ContentionError,
                 rng: random.Random | None = None) -> None:
        if attempts_max < 1:
            raise ValueError(f"attempts_max must be at least 1, got {attempts_max}")
        if not 0 < delay_ms_initial <= delay_ms_max:
            raise ValueError(f"need 0 < delay_ms_initial <= delay_ms_max, got {delay_ms_initial}, {delay_ms_max}")
        self.what = what
        self.attempts_max = attempts_max
        self.delay_ms_initial = delay_ms_initial
        self.delay_ms_max = delay_ms_max
        self.error = error
        self.rng = rng or _rng
        self.lost_count = 0
        self.waited_s = 0.0

    def delay_s(self) -> float:
        """The wait before the next attempt, after `lost_count` lost ones: full jitter under a doubling cap."""
        ceiling_ms = min(self.delay_ms_max, self.delay_ms_initial * 2 ** min(self.lost_count - 1, 30))
        return self.rng.uniform(0, ceiling_ms) / 1000

    def exhausted(self, rival: str) -> Exception:
        return self.error(f"{self.what}: lost the compare-and-swap {self.lost_count} times in a row "
                          f"(attempts_max={self.attempts_max}, {self.waited_s:.2f}s of backoff); the last time "
                          f"to {rival}")

    async def lost(self, rival: str) -> None:
        """Count a lost CAS (to `rival`: what the winner left, e.g. 'revision 17 (state OPEN)') and wait before
        the next attempt; raise when that was the last attempt allowed."""
        self.lost_count += 1
        if self.lost_count >= self.attempts_max:
            raise self.exhausted(rival)
        delay = self.delay_s()
        self.waited_s += delay
        await asyncio.sleep(delay)


_rng = random.Random()


def backoff_s(attempt: int, initial_s: float, max_s: float) -> float:
    """The pause before attempt `attempt` + 1 of a loop that retries for as long as its process runs (a watch
    established again): a doubling cap from initial_s to max_s, half of it fixed and half jittered, so that
    the bookies of a cluster that lost etcd together do not come back in lock step."""
    cap = min(max_s, initial_s * 2 ** min(attempt, 30))
    return float(cap / 2 + _rng.uniform(0, cap / 2))

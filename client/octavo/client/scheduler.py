"""One per client: the flushes of every write handle with appends this event-loop turn run in one callback,
and the explicit LAC updates of idle handles on one timer, instead of a callback or timer per handle."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger(__name__)

# How long a writer must be idle before it sends its LAC on its own.
LAC_UPDATE_DELAY_S = 0.05


class Scheduled(Protocol):
    """What the scheduler needs of a write handle (writer.WriteHandle implements it): three calls, made in the loop."""

    @property
    def ledger_id(self) -> int: ...

    def flush_now(self) -> None:
        """Hand every appended entry not sent yet to the bookies (the flush this loop turn asked for)."""

    def linger_expired(self) -> None:
        """A lingering batch waited long enough: flush it unless a flush is already scheduled."""

    def send_lac_if_idle(self) -> None:
        """Send the LAC on its own if the handle is still idle (else look again later)."""


class WriteScheduler:
    """One per client: runs the flushes of every handle with appends this event-loop turn in one callback,
    and the explicit LAC updates of idle handles on one timer, instead of a callback or timer per handle."""

    def __init__(self) -> None:
        self._flush: list[Scheduled] = []
        self._lac_due: set[Scheduled] = set()
        self._lac_timer: asyncio.TimerHandle | None = None

    def flush_soon(self, handle: Scheduled) -> None:
        self._flush.append(handle)
        if len(self._flush) == 1:
            asyncio.get_running_loop().call_soon(self._run_flushes)

    def flush_later(self, handle: Scheduled, delay_s: float) -> asyncio.TimerHandle:
        """One handle's flush after `delay_s` (a lingering batch); the handle may flush sooner and cancel it."""
        return asyncio.get_running_loop().call_later(delay_s, self._run_one, handle)

    def _run_one(self, handle: Scheduled) -> None:
        try:
            handle.linger_expired()
        except Exception:
            log.exception("ledger %d: flush failed", handle.ledger_id)

    def _run_flushes(self) -> None:
        todo, self._flush = self._flush, []
        for handle in todo:
            try:
                handle.flush_now()
            except Exception:  # one handle's bug must not strand the others' appends
                log.exception("ledger %d: flush failed", handle.ledger_id)

    def lac_later(self, handle: Scheduled) -> None:
        self._lac_due.add(handle)
        if self._lac_timer is None:
            self._lac_timer = asyncio.get_running_loop().call_later(LAC_UPDATE_DELAY_S, self._run_lacs)

    def _run_lacs(self) -> None:
        self._lac_timer = None
        due, self._lac_due = self._lac_due, set()
        for handle in due:
            try:
                handle.send_lac_if_idle()
            except Exception:
                log.exception("ledger %d: LAC update failed", handle.ledger_id)

    def cancel(self) -> None:
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None
        self._lac_due.clear()

"""When the self-healing loops look at etcd again: on a change, not on a clock.

The auditor, the replication workers and the replicas restore each read etcd on every pass (the election,
registrations, cookies, marks). Run every second in every bookie, that was about five requests a second per
idle bookie: 500 a second for a hundred bookies doing nothing. BookKeeper's auditor and workers wait on
ZooKeeper watches instead; these wait on one etcd watch stream per bookie over the keys their passes depend on
(registrations, cookies, the auditor key, the marks, the replication locks).

A loop's next pass starts at the earliest of:
- a change under a watched range that the loop wants (every change, unless it registered a filter: the
  auditor's pass of a bookie that is not the auditor wants only the auditor key's delete, as it does nothing but
  try the election);
- its own next due time (a mark's retry, a missing bookie's delay running out, the next full audit);
- `idle_s` after its last pass, a safety net for what no watch shows (this bookie turning writable again, a
  watch stream that stalls without breaking);
but never sooner than `tick_s` after its last pass began, so a burst of changes costs at most one pass a tick,
as the loops cost before. While the watch is not established (etcd unreachable, the stream broken), every loop
runs every `tick_s`, as before, and once it is established again every loop runs at once: changes in the gap
are not replayed, so each pass reads what it depends on afresh.

A stream can also stall without breaking (etcd frozen, a partition that drops packets without resetting the
connection): the watch is trusted only while `trusted()` says so (the bookie's registration lease is being
refreshed, which needs the same etcd), looked at every `trust_check_s`; untrusted, the loops tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from octavo.meta.errors import MetadataUnavailableError
from octavo.meta.etcd import EtcdClient
from octavo.meta.keyrange import WatchRange
from octavo.meta.retry import backoff_s

log = logging.getLogger(__name__)

# Pauses between attempts to establish the watch again (doubling, jittered); it is retried as long as the
# bookie runs (its loops tick meanwhile).
WATCH_RETRY_S_INITIAL = 0.5
WATCH_RETRY_S_MAX = 10.0


class Wakeups:
    def __init__(self, tick_s: float, idle_s: float, trusted: Callable[[], bool] = lambda: True,
                 trust_check_s: float = 10.0) -> None:
        self.tick_s = tick_s
        self.idle_s = idle_s
        self.trusted = trusted
        self.trust_check_s = trust_check_s
        self.watching = False
        self.changes_seen = 0
        self._events: dict[str, asyncio.Event] = {}
        self._wants: dict[str, Callable[[bytes], bool]] = {}

    def register(self, loop: str, wants: Callable[[bytes], bool] | None = None) -> None:
        """Before `loop`'s first pass: a change from then on wakes it (wake_all sets the events that exist), or
        only a change of a key `wants` accepts (asked at the change, so it may depend on the loop's state)."""
        self._event(loop)
        if wants is not None:
            self._wants[loop] = wants

    def _event(self, loop: str) -> asyncio.Event:
        event = self._events.get(loop)
        if event is None:
            event = self._events[loop] = asyncio.Event()
        return event

    def wake_all(self) -> None:
        for event in self._events.values():
            event.set()

    def wake_for(self, keys: Sequence[bytes]) -> None:
        """Wake the loops that want one of these changed keys."""
        for loop, event in self._events.items():
            wants = self._wants.get(loop)
            if wants is None or any(wants(key) for key in keys):
                event.set()

    async def sleep(self, loop: str, began: float, due: float | None = None) -> None:
        """Wait before `loop`'s next pass (its last one began at `began`, time.monotonic(); `due`: when it has
        work due, in the same clock)."""
        event = self._event(loop)
        earliest = began + self.tick_s
        until = began + self.idle_s if due is None else min(due, began + self.idle_s)
        while self.watching and self.trusted() and not event.is_set():
            left = until - time.monotonic()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(min(left, self.trust_check_s)):
                    await event.wait()
            except TimeoutError:
                pass
        # A change, or the watch down: not sooner than a tick after the last pass began.
        await asyncio.sleep(max(0.0, earliest - time.monotonic()))
        event.clear()

    async def watch(self, etcd: EtcdClient, ranges: Sequence[WatchRange]) -> None:
        """Keep a watch on `ranges` and wake the loops on each change; runs until cancelled."""
        attempt = 0
        while True:
            try:
                async for keys in etcd.watch_changes(ranges):
                    if not self.watching:
                        self.watching = True
                        attempt = 0
                        log.debug("autorecovery watch established")
                        self.changes_seen += 1 + len(keys)  # what changed in the gap is unknown: as if something had
                        self.wake_all()
                        continue
                    self.changes_seen += len(keys)
                    self.wake_for(keys)
            except MetadataUnavailableError as e:
                if self.watching:
                    log.warning("the autorecovery watch broke (%s): its loops run every %gs until it is back",
                                e, self.tick_s)
            finally:
                self.watching = False
            await asyncio.sleep(backoff_s(attempt, WATCH_RETRY_S_INITIAL, WATCH_RETRY_S_MAX))
            attempt += 1

"""The ensemble change of a write handle: a bookie failed (or is draining), so a new segment starting at the first
unacknowledged entry (LAC + 1), with a replacement in the failed bookie's position, is written to etcd with a
CAS; the handle then sends the replacement every unacknowledged entry whose write set now includes it.

The choice of the replacement is `placement.choose_replacement` (pure); this module does the IO around it: the
registrations read again, the wait for a usable bookie (ensemble_change_wait_s), the CAS and its retries, an
etcd outage waited out. A bookie that failed the handle is quarantined for bookie_quarantine_s (BookKeeper does
the same), unless it registers again from a new process. While a change is in flight the handle's LAC stands
still (as in BookKeeper): an entry acknowledged during the change would belong to the new segment without a
copy on the replacement. Changes and the close are ordered by one lock (`EnsembleChanges.lock`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Mapping, Sequence
from typing import Protocol

import grpc

import octavo.client.faults as faults
from octavo.client.context import ClientContext
from octavo.client.placement import CONNECTING, IDLE, READY, UNREGISTERED, Replacement, choose_replacement
from octavo.meta.errors import (
    BookieUnavailableError,
    EtcdSpaceExceededError,
    LedgerFencedError,
    MetadataUnavailableError,
    NotEnoughBookiesError,
    OctavoError,
)
from octavo.meta.ledger_metadata import OPEN, LedgerMetadata
from octavo.meta.metadata import BookieInfo
from octavo.meta.retry import CasRetry

log = logging.getLogger(__name__)

ENSEMBLE_CHANGE_ATTEMPTS_MAX = 10
ENSEMBLE_CHANGE_METADATA_WAIT_S = 30.0
# How often an ensemble change that waits for a usable bookie looks at the registrations again, and its
# shortest pause: the registrations come from memory while the client's watch is live, so no time passes in
# the look itself, and a pause of the float rounding left of ensemble_change_wait_s would not move the clock
# (the simulation's virtual clock did not move at all: a livelock, seed 2600299).
ENSEMBLE_CHANGE_POLL_S = 0.2
ENSEMBLE_CHANGE_POLL_S_MIN = 0.001


def connection_state(client: ClientContext, bookie_id: str) -> str:
    """The connection's state as placement.py names it; asking starts a connection attempt on an idle channel."""
    try:
        bookie = client.bookie_client(bookie_id)
    except BookieUnavailableError:
        return UNREGISTERED
    state = bookie.connectivity(True)
    if state == grpc.ChannelConnectivity.READY:
        return READY
    if state == grpc.ChannelConnectivity.IDLE:
        return IDLE
    return CONNECTING


async def replacement_now(client: ClientContext, ensemble: Sequence[str], failed: str, largest_entry: int
                          ) -> Replacement:
    """A replacement for `failed` from the registrations read again, with no quarantine and no wait (a recovery
    open replacing a bookie it cannot reach)."""
    registered = await client.bookies(refresh=True)
    return choose_replacement(failed, ensemble, registered, {}, 0.0, 0.0, largest_entry,
                              functools.partial(connection_state, client), random.choice)


class ChangingHandle(Protocol):
    """What an ensemble change needs of its write handle (writer.WriteHandle implements it)."""

    metadata: LedgerMetadata

    @property
    def ledger_id(self) -> int: ...

    @property
    def last_add_confirmed(self) -> int: ...

    @property
    def revision(self) -> int:
        """The etcd revision of `metadata`."""

    def adopt_metadata(self, metadata: LedgerMetadata, revision: int) -> None:
        """Take `metadata` (at `revision`) as the ledger's current record."""

    def change_not_needed(self, failed: str) -> bool:
        """The handle failed or closed, `failed` is no longer in the last ensemble, or a close waits with every
        entry acknowledged: the change stops quietly."""

    def largest_pending_entry(self) -> int:
        """The size of the largest entry not acknowledged yet (a replacement must take it)."""

    def replaced(self, failed: str, replacement: str) -> None:
        """The new segment is in etcd: count the replacement's answers from now and send it what it misses."""

    def fail(self, error: OctavoError) -> None: ...

    def changed(self) -> None:
        """A change ended (done, stopped or failed): the LAC may move again."""


class EnsembleChanges:
    """The ensemble changes of one write handle, and the bookies it quarantined."""

    def __init__(self, client: ClientContext, handle: ChangingHandle) -> None:
        self._client = client
        self._handle = handle
        self._options = client.options
        # Bookies that failed this handle, and when (loop time): not chosen again for bookie_quarantine_s,
        # unless no other bookie is usable and they are reachable again.
        self._quarantine: dict[str, float] = {}
        # ... and the started_unix_ms of the registration it had then (0: unknown): a new process is not quarantined.
        self._quarantined_process: dict[str, int] = {}
        self._failure_reasons: dict[str, str] = {}  # the last failure of each bookie, for error messages
        self.lock = asyncio.Lock()  # taken by every change and by the close, so they are ordered
        self._tasks: set[asyncio.Task[None]] = set()  # changes running (kept referenced)
        self.changing: set[str] = set()  # the failed bookies whose replacement is not in etcd yet
        self.count = 0  # changes done

    def start(self, bookie_id: str, reason: str) -> None:
        """Replace `bookie_id`, which failed the handle (the handle has stopped counting its answers), in a
        background task; it is quarantined from now."""
        ledger_id = self._handle.ledger_id
        log.info("ledger %d: bookie %s failed (%s); changing the ensemble", ledger_id, bookie_id, reason,
                 extra={"event": "bookie_failed", "ledger_id": ledger_id, "bookie_id": bookie_id})
        loop = asyncio.get_running_loop()
        self._quarantine[bookie_id] = loop.time()
        info = self._client.registrations.get(bookie_id)
        self._quarantined_process[bookie_id] = info.started_unix_ms if info is not None else 0
        self._failure_reasons[bookie_id] = reason
        self.changing.add(bookie_id)
        task = loop.create_task(self._change(bookie_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def can_move_off(self, bookie_id: str) -> bool:
        """For a draining bookie: whether a bookie that is not quarantined can take its place now, from the
        registrations as last read (no wait)."""
        choice = self._choose(bookie_id, self._client.registrations, asyncio.get_running_loop().time())
        if choice.bookie is None or choice.fallback:
            log.debug("ledger %d: bookie %s is draining but no other bookie can take its place (%s); writing "
                      "to it until it stops", self._handle.ledger_id, bookie_id, choice.reason)
            return False
        return True

    def _choose(self, failed: str, registered: Mapping[str, BookieInfo], now: float) -> Replacement:
        return choose_replacement(failed, self._handle.metadata.last_ensemble, registered, self._quarantine, now,
                                  self._options.bookie_quarantine_s, self._handle.largest_pending_entry(),
                                  functools.partial(connection_state, self._client), random.choice)

    async def _change(self, failed: str) -> None:
        """The background task of one change. A change that finds the close done (or not needed any more) stops
        quietly. It never ends with an exception: whatever goes wrong fails the handle with a typed error."""
        handle = self._handle
        try:
            async with self.lock:
                if handle.change_not_needed(failed):
                    return
                try:
                    replacement = await self._traced_new_segment(failed)
                except OctavoError as e:
                    handle.fail(e)
                    return
                if replacement is None:
                    return
                # The new segment is in etcd; the replacement holds nothing past the LAC until the resend below.
                faults.hit(faults.ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS)
                self.count += 1
                self._client.metrics.ensemble_changes.add(1)
                handle.replaced(failed, replacement)
        except Exception as e:  # a bug, or an error of a kind not foreseen: the handle fails, typed and logged
            log.exception("ledger %d: the ensemble change replacing %s failed", handle.ledger_id, failed)
            handle.fail(OctavoError(f"ledger {handle.ledger_id}: the ensemble change replacing bookie {failed} "
                                    f"failed: {type(e).__name__}: {e}"))
        finally:
            self.changing.discard(failed)
        handle.changed()

    async def _traced_new_segment(self, failed: str) -> str | None:
        tracing = self._client.tracing
        if not tracing.sampling.enabled:
            return await self._write_new_segment(failed)
        with tracing.operation("octavo.ensemble_change", **{"octavo.ledger_id": self._handle.ledger_id,
                                                             "octavo.failed_bookie": failed}) as span:
            replacement = await self._write_new_segment(failed)
            if span is not None and replacement is not None:
                span.set_attribute("octavo.replacement_bookie", replacement)
            return replacement

    async def _write_new_segment(self, failed: str) -> str | None:
        """Replace `failed` in a new segment; None if the change stopped being needed while it waited. An etcd
        outage is waited out for up to ENSEMBLE_CHANGE_METADATA_WAIT_S (appends stay pending meanwhile) before
        the handle fails."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ENSEMBLE_CHANGE_METADATA_WAIT_S
        while True:
            try:
                return await self._try_new_segment(failed)
            except MetadataUnavailableError as e:
                if loop.time() > deadline or isinstance(e, EtcdSpaceExceededError):  # a full etcd stays full
                    raise
                log.info("ledger %d: ensemble change waits for etcd: %s", self._handle.ledger_id, e)
                await asyncio.sleep(0.5)

    async def _try_new_segment(self, failed: str) -> str | None:
        handle = self._handle
        store = self._client.metadata_store
        retry = CasRetry(f"ledger {handle.ledger_id}: the ensemble change replacing {failed}",
                         ENSEMBLE_CHANGE_ATTEMPTS_MAX)
        while True:
            replacement = await self._wait_for_replacement(failed)
            if replacement is None:
                return None
            ensemble = list(handle.metadata.last_ensemble)
            position = ensemble.index(failed)
            ensemble[position] = replacement
            first = handle.last_add_confirmed + 1
            changed = handle.metadata.with_segment(first, tuple(ensemble))
            revision = await store.update_ledger(changed, handle.revision)
            if revision is not None:
                handle.adopt_metadata(changed, revision)
                return self._replaced(failed, replacement, first)
            current, current_revision = await store.read_ledger(handle.ledger_id)
            if current.state != OPEN:
                raise LedgerFencedError(f"ledger {handle.ledger_id} is {current.state} in etcd: a recovery open "
                                        "took it over")
            handle.adopt_metadata(current, current_revision)
            if failed not in current.last_ensemble:
                # The segment replacing `failed` is in etcd already: this change's own transaction, applied by
                # etcd though its answer was lost (the connection broke; the retry after MetadataUnavailableError
                # finds the revision moved). Only this handle adds segments to its open ledger, one change at a
                # time, so the bookie at `failed`'s place is its replacement, and it must be sent what it misses.
                # Returning None here left the replacement without the entries in flight: the appends waited
                # for ever (found by the simulation, seed 2300157).
                return self._replaced(failed, current.last_ensemble[position], current.ensembles[-1][0])
            await retry.lost(f"revision {current_revision} ({len(current.ensembles)} segments)")

    def _replaced(self, failed: str, replacement: str, first: int) -> str:
        self._quarantine.pop(replacement, None)
        log.info("ledger %d: bookie %s replaced by %s from entry %d", self._handle.ledger_id, failed, replacement,
                 first, extra={"event": "ensemble_change", "ledger_id": self._handle.ledger_id,
                               "from_bookie": failed, "to_bookie": replacement})
        return replacement

    def _lift_restarted_quarantines(self, registered: Mapping[str, BookieInfo]) -> None:
        """A quarantined bookie that registered again from a new process (a restart, a rolled pod) is a candidate
        again: the quarantine was for the process that failed (or drained) under this handle. In a rolling
        restart the bookie restarted a moment ago is often the only one outside the ensemble."""
        for bookie_id in list(self._quarantine):
            info = registered.get(bookie_id)
            if info is not None and info.started_unix_ms > 0 \
                    and info.started_unix_ms != self._quarantined_process.get(bookie_id, 0):
                log.info("ledger %d: bookie %s restarted since it failed this ledger: no longer quarantined",
                         self._handle.ledger_id, bookie_id)
                del self._quarantine[bookie_id]
                self._quarantined_process.pop(bookie_id, None)

    async def _wait_for_replacement(self, failed: str) -> str | None:
        """A bookie to take `failed`'s place (choose_replacement). With none, wait up to ensemble_change_wait_s
        for one (a bookie restarting, a connection coming back), looking at the registrations as they are now
        every ENSEMBLE_CHANGE_POLL_S; then NotEnoughBookiesError names every bookie and why it could not be used. None
        if the change stopped being needed meanwhile."""
        handle = self._handle
        loop = asyncio.get_running_loop()
        wait_s = self._options.ensemble_change_wait_s
        started = loop.time()
        while True:
            now = loop.time()
            registered = await self._client.bookies(refresh=True)
            self._lift_restarted_quarantines(registered)
            choice = self._choose(failed, registered, now)
            if choice.bookie is not None:
                if choice.fallback:
                    log.info("ledger %d: no other bookie is usable; taking back %s, which failed this ledger "
                             "earlier and is reachable again", handle.ledger_id, choice.bookie)
                return choice.bookie
            if handle.change_not_needed(failed):
                return None
            waited = now - started
            if waited >= wait_s:
                raise NotEnoughBookiesError(
                    f"ledger {handle.ledger_id}: no bookie can replace {failed}, which failed "
                    f"({self._failure_reasons.get(failed, 'reason not known')})"
                    + (f"; waited {waited:.1f}s (ensemble_change_wait_s={wait_s:g})" if wait_s else "") + ": "
                    + choice.reason)
            if waited == 0:
                log.info("ledger %d: no bookie can replace %s now; waiting up to %gs: %s", handle.ledger_id, failed,
                         wait_s, choice.reason)
            await asyncio.sleep(max(ENSEMBLE_CHANGE_POLL_S_MIN, min(ENSEMBLE_CHANGE_POLL_S, wait_s - waited)))

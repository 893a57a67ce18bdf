"""Self-healing in a bookie process: the auditor (one per cluster, elected on etcd) and the replication workers
(in every writable bookie). BookKeeper's Auditor and ReplicationWorker, on etcd instead of ZooKeeper.

The auditor is whichever bookie holds the `auditor` key, created on its registration lease: when that bookie
dies or loses its lease, the key goes and another bookie takes it at its next pass (the key's delete wakes
them: wakeups.py). As auditor a bookie:
- notices a bookie with a cookie but no registration, and once it has been gone for lost_bookie_delay_s marks
  every ledger naming it under-replicated (a bookie that restarts within the delay is left alone; a new
  auditor starts its own clock, so a takeover can only lengthen the delay);
- every audit_interval_s reads every ledger and marks those whose ensembles name a bookie with neither a
  registration nor a cookie (decommissioned, or lost before an auditor noticed).

A replication worker takes a marked ledger's lock (on its own registration lease, so a worker that dies
releases it), re-replicates the ledger (octavo.client.replication), deletes the mark if nothing changed it,
and releases the lock. A mark whose bookies are all registered again is dropped: a registered bookie has its
data (a bookie whose disk was lost cannot register: its cookie refuses the empty directory). A ledger left with
lost entries or an open last segment is retried later, not at every tick. An open ledger's last segment is
recovery-opened once its mark is open_ledger_grace_s old.

The loops that read etcd on each pass (the auditor, the workers, the replicas restore) run when what they depend
on changes in etcd, when work of theirs falls due, and at least every autorecovery_idle_interval_s, at most once a tick
(wakeups.py); the loops on intervals of their own (the replicas check, etcd compaction, dataset maintenance)
sleep until their interval is due or this bookie becomes or stops being the auditor (their work is the
auditor's), at most once a tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from octavo.client import Client, ClientOptions
from octavo.client.datasetmerge import MergeResult, merge_dataset
from octavo.client.replication import (
    DELETED,
    LOST,
    NOTHING_TO_DO,
    OPEN_SEGMENT_LEFT,
    REPLICATED,
    LedgerReplication,
    Replicator,
)
from octavo.meta.errors import MetadataUnavailableError, OctavoError
from octavo.meta.etcd import Txn
from octavo.meta.keyrange import WatchRange
from octavo.meta.layout import Layout
from octavo.meta.ledger_metadata import LedgerMetadata, MetadataError
from octavo.meta.underreplication import Mark, Taken, UnderReplication
from octavo.node import faults
from octavo.node.config import NodeConfig
from octavo.node.datasetmaintenance import DatasetMaintenance, DatasetMaintenanceSettings
from octavo.node.etcdcompaction import EtcdCompaction
from octavo.node.registration import Registration
from octavo.node.replicascheck import ReplicasCheck
from octavo.node.wakeups import Wakeups

log = logging.getLogger(__name__)

# The loops' tick: the most often a loop passes (and how often each passes while its etcd watch is down).
AUTORECOVERY_TICK_S = 1.0
# Marks are read in pages of this many, and each page is worked in an order of the bookie's own.
SPREAD_PAGE_MARKS = 1000
# A worker's pass down the marks ends after this, so that the next one reads registrations and its lease again.
WORK_PASS_S_MAX = 30.0
# A ledger whose re-replication left work (lost entries, an open segment, an error) is tried again after this.
RETRY_DELAY_S = 30.0
# How often the auditor counts the under-replication marks for the metrics (one etcd range read per page of
# marks).
MARKS_COUNT_INTERVAL_S = 10.0


@dataclass
class AuditorState:
    """What the auditor knows; reported by the admin API and `octavo cluster status`."""

    is_auditor: bool = False
    missing_since: dict[str, float] = field(default_factory=dict)  # bookie -> when it was first seen gone
    marked_lost: set[str] = field(default_factory=set)             # bookies whose ledgers were marked
    last_full_audit_unix_ms: int = 0
    ledgers_marked: int = 0
    # Counted by the auditor every MARKS_COUNT_INTERVAL_S (metrics: octavo.bookie.underreplicated_ledgers and
    # the oldest mark's age); -1 until counted.
    underreplicated_ledgers: int = -1
    oldest_mark_unix_ms: int = 0
    marks_counted_monotonic: float = float("-inf")
    marks_counted_at_change: int = -1  # Wakeups.changes_seen when they were counted


@dataclass
class WorkerState:
    ledgers_replicated: int = 0
    entries_copied: int = 0
    bytes_copied: int = 0
    in_progress: set[int] = field(default_factory=set)
    last_error: str = ""
    lost: list[str] = field(default_factory=list)  # the last lost ranges seen, in words


class AutoRecovery:
    def __init__(self, config: NodeConfig, bookie_id: str, registration: Registration,
                 writable: Callable[[], bool]) -> None:
        self.config = config
        self.bookie_id = bookie_id
        self.registration = registration
        self._writable = writable
        self.auditor = AuditorState()
        self.worker = WorkerState()
        self.etcd_compaction = EtcdCompaction(config.etcd_compaction_interval_s)  # run by the auditor
        self.dataset_maintenance = DatasetMaintenance(DatasetMaintenanceSettings(  # run by the auditor
            config.dataset_maintenance_interval_s, config.dataset_merge_target_bytes,
            config.dataset_merge_budget_bytes, config.dataset_orphan_interval_s, config.dataset_orphan_grace_s))
        self.replicas = ReplicasCheck(config.replicas_check_interval_s, config.replication_rate_bytes_per_s)
        self._next_full_audit = 0.0
        self._retry_at: dict[int, float] = {}
        self._slots = asyncio.Semaphore(config.replication_workers_max)
        self._tasks: set[asyncio.Task[None]] = set()
        self.wakeups = Wakeups(AUTORECOVERY_TICK_S, config.autorecovery_idle_interval_s,
                               lambda: registration.registered, registration.ttl_s)
        # Set when this bookie becomes or stops being the auditor: wakes the loops on intervals of their own.
        self._role_changed: dict[str, asyncio.Event] = {}

    @staticmethod
    def watched(layout: Layout) -> list[WatchRange]:
        """What the passes depend on: a change here wakes them (a new mark, a lock or the auditor key freed, a
        bookie coming or going, a cookie made or retired)."""
        return [WatchRange.prefix(layout.registrations), WatchRange.prefix(layout.cookies),
                WatchRange.key(layout.auditor, puts=False), WatchRange.prefix(layout.underreplicated, deletes=False),
                WatchRange.prefix(layout.replication_locks, puts=False),
                WatchRange.prefix(layout.replicas_missing, deletes=False)]

    async def run(self) -> None:
        cfg = self.config
        options = ClientOptions(ensemble_change_wait_s=0.0, tls_cert_file=cfg.tls_cert_file,
                                tls_key_file=cfg.tls_key_file, tls_ca_file=cfg.tls_ca_file,
                                etcd_tls_ca_file=cfg.etcd_tls_ca_file, etcd_tls_cert_file=cfg.etcd_tls_cert_file,
                                etcd_tls_key_file=cfg.etcd_tls_key_file, etcd_username=cfg.etcd_username,
                                etcd_password_file=cfg.etcd_password_file)
        async with Client(cfg.etcd, cfg.cluster, options) as client:
            replicator = Replicator(client, cfg.replication_rate_bytes_per_s, cfg.replication_batch_bytes_max)
            marks = UnderReplication(client.etcd, client.metadata_store.layout)

            async def work() -> None:
                if self._writable():
                    await self._work(client, marks, replicator)

            async def merge(name: str, target_bytes: int, budget_bytes: int) -> MergeResult:
                return await merge_dataset(client, name, target_bytes=target_bytes, budget_bytes=budget_bytes)

            async def restore_replicas() -> None:  # replicascheck.py: copies missing on live bookies
                if self._writable():
                    await self.replicas.restore_tick(client, self.registration.lease_id, self.bookie_id)

            # Loops of their own: a worker waiting for a free slot must not hold up the auditor, nor the other way
            # round.
            watch = asyncio.create_task(self.wakeups.watch(client.etcd, self.watched(client.metadata_store.layout)),
                                        name="octavo-autorecovery-watch")
            auditor_key = client.metadata_store.layout.auditor
            try:
                await asyncio.gather(
                    # Not the auditor, its pass only tries the election: only the auditor key's delete wakes it.
                    self._on_change("the auditor", lambda: self._audit(client, marks), self._auditor_due,
                                    lambda key: self.auditor.is_auditor or key == auditor_key),
                    self._on_change("replication", work, self._work_due),
                    self._every_tick("the replicas check", lambda: self.replicas.tick(
                        client, self.auditor.is_auditor, time.monotonic()), self.replicas.next_due),
                    self._on_change("replicas restore", restore_replicas, self.replicas.next_retry),
                    self._every_tick("etcd compaction", lambda: self.etcd_compaction.tick(
                        client.etcd, self.auditor.is_auditor, time.monotonic()), self.etcd_compaction.next_due),
                    self._every_tick("dataset maintenance", lambda: self.dataset_maintenance.tick(
                        client.datasets, merge, self.auditor.is_auditor, time.monotonic()),
                        self.dataset_maintenance.next_due))
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch

    async def _every_tick(self, what: str, step: Callable[[], Awaitable[None]],
                          next_due: Callable[[bool], float | None]) -> None:
        """A loop on a clock of its own, whose work is the auditor's: it passes when `next_due(is_auditor)` says
        (time.monotonic(); None: not until the auditor role changes) and when this bookie becomes or stops being
        the auditor (its step then starts or resets its clock), at most once a tick: the passes a tick every
        second would make, without the wake-ups that found nothing due."""
        changed = self._role_changed.setdefault(what, asyncio.Event())  # before the first pass: none is missed
        await self._passes(what, step, lambda began: self._sleep_until(changed, began, next_due(
            self.auditor.is_auditor)))

    async def _sleep_until(self, changed: asyncio.Event, began: float, due: float | None) -> None:
        """Until `due` (None: no time) or the auditor role changes, and never sooner than a tick after `began`."""
        while not changed.is_set() and (due is None or due > time.monotonic()):
            try:
                async with asyncio.timeout(None if due is None else due - time.monotonic()):
                    await changed.wait()
            except TimeoutError:
                break
        await asyncio.sleep(max(0.0, began + AUTORECOVERY_TICK_S - time.monotonic()))
        changed.clear()

    def _set_auditor(self, is_auditor: bool) -> None:
        if is_auditor != self.auditor.is_auditor:
            for event in self._role_changed.values():
                event.set()
        self.auditor.is_auditor = is_auditor

    async def _on_change(self, what: str, step: Callable[[], Awaitable[None]],
                         due: Callable[[float], float | None], wants: Callable[[bytes], bool] | None = None) -> None:
        """A loop woken by the watch (module docstring; `due(began)`: its next due time after a pass that began
        then; `wants`: the changed keys that wake it, Wakeups.register)."""
        self.wakeups.register(what, wants)  # a change during the first pass wakes it
        await self._passes(what, step, lambda began: self.wakeups.sleep(what, began, due(began)),
                           lambda began: self.wakeups.sleep(what, began, began + AUTORECOVERY_TICK_S))

    async def _passes(self, what: str, step: Callable[[], Awaitable[None]],
                      wait: Callable[[float], Awaitable[None]],
                      wait_failed: Callable[[float], Awaitable[None]] | None = None) -> None:
        """`step` again and again, `wait(began)` after each pass (`wait_failed(began)` after one that failed, when
        given: a failed pass is tried again at the next tick, not after the idle interval)."""
        quiet = False
        while True:
            began = time.monotonic()
            failed = True
            try:
                await step()
                quiet = failed = False
            except MetadataUnavailableError as e:
                if not quiet:
                    log.warning("%s waits for etcd: %s", what, e)
                quiet = True
            except Exception:  # the loop goes on: one bad ledger must not stop self-healing
                log.exception("%s: step failed", what)
            await (wait_failed if failed and wait_failed is not None else wait)(began)

    def _auditor_due(self, began: float) -> float | None:
        """When the auditor has work due: a missing bookie's delay running out, the marks count, the full audit."""
        a = self.auditor
        if not a.is_auditor:
            return None  # it passes again when the auditor key is freed, or after the idle interval
        times = [since + self.config.lost_bookie_delay_s for b, since in a.missing_since.items()
                 if b not in a.marked_lost]
        if self._marks_may_have_changed():
            times.append(a.marks_counted_monotonic + MARKS_COUNT_INTERVAL_S)
        times.append(self._next_full_audit)
        return min((t for t in times if t > began), default=None)

    def _work_due(self, began: float) -> float | None:
        """When a ledger this worker left is to be tried again."""
        return min((t for t in self._retry_at.values() if t > began), default=None)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the auditor ---------------------------------------------------------------------------------
    async def _audit(self, client: Client, marks: UnderReplication) -> None:
        lease = self.registration.lease_id
        if not lease or not self.registration.registered:
            # A lapsed registration (etcd unreachable for a TTL) means the election key on its lease is gone
            # too: another bookie may be the auditor by now. Never claim it from memory.
            if self.auditor.is_auditor:
                log.info("bookie %s is no longer the auditor (its registration lapsed)", self.bookie_id)
            self._set_auditor(False)
            return
        layout = client.metadata_store.layout
        etcd = client.etcd
        # Take the key if nobody holds it, else read who does: one round trip.
        took, resp = await etcd.txn(Txn().mod_revision_is(layout.auditor, 0)
                                    .put(layout.auditor, self.bookie_id.encode(), lease=lease)
                                    .get_on_failure(layout.auditor))
        holder = [] if took else resp.responses[0].response_range.kvs
        was = self.auditor.is_auditor
        self._set_auditor(took or (bool(holder) and holder[0].value.decode() == self.bookie_id))
        if self.auditor.is_auditor != was:
            log.info("bookie %s is %s the auditor", self.bookie_id, "now" if self.auditor.is_auditor else "no longer")
            self.auditor.missing_since.clear()
            self.auditor.marked_lost.clear()
        if not self.auditor.is_auditor:
            return
        now = time.monotonic()
        if now - self.auditor.marks_counted_monotonic >= MARKS_COUNT_INTERVAL_S and self._marks_may_have_changed():
            await self._count_marks(marks)
        registered = set(await client.bookies(refresh=True))
        cookies = await client.metadata_store.cookie_holders()
        for bookie_id in registered:
            self.auditor.missing_since.pop(bookie_id, None)
            self.auditor.marked_lost.discard(bookie_id)
        for bookie_id in sorted(cookies - registered):
            since = self.auditor.missing_since.setdefault(bookie_id, now)
            if bookie_id in self.auditor.marked_lost or now - since < self.config.lost_bookie_delay_s:
                continue
            count = 0
            async for meta in client.iter_ledger_metadata():
                if any(bookie_id in bookies for _, bookies in meta.ensembles):
                    if await marks.mark_new(meta.ledger_id, [bookie_id], by=f"auditor {self.bookie_id}"):
                        faults.hit(faults.AUDITOR_AFTER_MARK)
                    count += 1
            self.auditor.marked_lost.add(bookie_id)
            self.auditor.ledgers_marked += count
            log.warning("bookie %s has been gone for %.0fs: %d ledgers naming it marked under-replicated",
                        bookie_id, now - since, count)
        if now >= self._next_full_audit:
            self._next_full_audit = now + self.config.audit_interval_s
            await self._full_audit(client, marks, registered, cookies)

    def _marks_may_have_changed(self) -> bool:
        """Whether the count of marks may be stale: the watch saw a change since (a mark made; a mark finished
        goes with its lock, whose delete is watched), it is not watching, or an idle interval has passed."""
        w = self.wakeups
        return (not w.watching or w.changes_seen != self.auditor.marks_counted_at_change
                or time.monotonic() - self.auditor.marks_counted_monotonic >= w.idle_s)

    async def _count_marks(self, marks: UnderReplication) -> None:
        self.auditor.marks_counted_at_change = self.wakeups.changes_seen
        count, oldest = 0, 0
        async for mark in marks.marks():
            count += 1
            oldest = mark.marked_unix_ms if not oldest else min(oldest, mark.marked_unix_ms)
        self.auditor.underreplicated_ledgers, self.auditor.oldest_mark_unix_ms = count, oldest
        self.auditor.marks_counted_monotonic = time.monotonic()

    async def _full_audit(self, client: Client, marks: UnderReplication, registered: set[str],
                          cookies: set[str]) -> None:
        """Mark ledgers naming bookies that have neither a registration nor a cookie, or that are lost."""
        t0 = time.monotonic()
        count = await audit_ledgers(client, marks, registered, cookies, self.auditor.marked_lost,
                                    f"auditor {self.bookie_id}")
        self.auditor.last_full_audit_unix_ms = int(time.time() * 1000)
        self.auditor.ledgers_marked += count
        log.info("full audit in %.2fs: %d ledgers marked under-replicated", time.monotonic() - t0, count)
        if count:
            log.warning("full audit: %d ledgers name bookies that are gone; marked under-replicated", count)

    # -- the workers ---------------------------------------------------------------------------------
    async def _work(self, client: Client, marks: UnderReplication, replicator: Replicator) -> None:
        lease = self.registration.lease_id
        if not lease:
            return
        # The registrations are read at the first mark to work on, not before the marks: a pass with none (the
        # usual one) costs one etcd read, and each mark is judged on registrations read after it was listed.
        registered: set[str] | None = None
        now = time.monotonic()
        async for mark in self._spread(marks):
            if mark.ledger_id in self.worker.in_progress or self._retry_at.get(mark.ledger_id, 0) > now:
                continue
            if registered is None:
                registered = set(await client.bookies(refresh=True))
            if set(mark.missing) <= registered and not mark.names_live_bookies:
                if await marks.unmark(mark):
                    log.info("ledger %d: %s registered again; mark dropped", mark.ledger_id, ", ".join(mark.missing))
                continue
            # Wait for a free slot and go on down the list: a slot freed is taken at once, not at the next
            # tick (a lost bookie's thousands of small ledgers would otherwise go at two per tick).
            await self._slots.acquire()
            if not self._writable() or time.monotonic() - now > WORK_PASS_S_MAX:
                self._slots.release()
                return  # the next pass starts from fresh registrations and lease
            try:
                # The lock and the mark as it is now, in one etcd round trip (a small ledger costs a handful).
                taken = await marks.take(mark.ledger_id, lease, self.bookie_id)
            except BaseException:
                self._slots.release()
                raise
            if not taken.locked:
                self._slots.release()  # another worker has it (or had it, and will release it with its lease)
                continue
            self.worker.in_progress.add(mark.ledger_id)
            task = asyncio.create_task(self._replicate(replicator, marks, mark.ledger_id, taken, registered))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _spread(self, marks: UnderReplication) -> AsyncIterator[Mark]:
        """The marks a page at a time, each page in an order of this bookie's own (a hash of bookie and ledger):
        the workers of different bookies start on different ledgers instead of all queueing on the first."""
        page: list[Mark] = []
        async for mark in marks.marks():
            page.append(mark)
            if len(page) >= SPREAD_PAGE_MARKS:
                for m in sorted(page, key=self._rank):
                    yield m
                page = []
        for m in sorted(page, key=self._rank):
            yield m

    def _rank(self, mark: Mark) -> bytes:
        return hashlib.blake2b(f"{self.bookie_id}/{mark.ledger_id}".encode(), digest_size=8).digest()

    async def _replicate(self, replicator: Replicator, marks: UnderReplication, ledger_id: int, taken: Taken,
                         registered: set[str]) -> None:
        """Re-replicate a ledger whose lock this worker took (with its mark and metadata as read then)."""
        try:
            released = False
            try:
                current = taken.mark
                if current is None:
                    return
                age_s = time.time() - current.marked_unix_ms / 1000
                gone = set(current.missing) if current.names_live_bookies else set(current.missing) - registered
                first_read = None
                if taken.ledger is not None:
                    with contextlib.suppress(MetadataError):  # unreadable: the replicator reads it and says so
                        first_read = LedgerMetadata.decode(taken.ledger.value), taken.ledger.mod_revision
                report = await replicator.replicate(ledger_id, gone,
                                                    recover_open=age_s >= self.config.open_ledger_grace_s,
                                                    first_read=first_read)
                self._account(report)
                if report.outcome in (REPLICATED, NOTHING_TO_DO, DELETED):
                    await marks.finish(current)  # the mark (unless it changed meanwhile) and the lock
                    released = True
                    self._retry_at.pop(ledger_id, None)
                else:
                    self._retry_at[ledger_id] = time.monotonic() + (
                        min(RETRY_DELAY_S, max(1.0, self.config.open_ledger_grace_s - age_s))
                        if report.outcome == OPEN_SEGMENT_LEFT else RETRY_DELAY_S)
            finally:
                if not released:
                    await marks.unlock(ledger_id)
        except OctavoError as e:
            self.worker.last_error = f"ledger {ledger_id}: {e}"
            log.warning("re-replication of ledger %d failed (retrying in %.0fs): %s", ledger_id, RETRY_DELAY_S, e)
            self._retry_at[ledger_id] = time.monotonic() + RETRY_DELAY_S
        except Exception as e:
            self.worker.last_error = f"ledger {ledger_id}: {type(e).__name__}: {e}"
            log.exception("re-replication of ledger %d failed", ledger_id)
            self._retry_at[ledger_id] = time.monotonic() + RETRY_DELAY_S
        finally:
            self.worker.in_progress.discard(ledger_id)
            self._slots.release()

    def _account(self, report: LedgerReplication) -> None:
        self.worker.entries_copied += report.entries_copied
        self.worker.bytes_copied += report.bytes_copied
        if report.outcome == REPLICATED:
            self.worker.ledgers_replicated += 1
        if report.outcome == LOST:
            self.worker.lost = [str(x) for x in report.lost][:100]


async def audit_ledgers(client: Client, marks: UnderReplication, registered: set[str], cookies: set[str],
                        lost: set[str], by: str) -> int:
    """The full audit: mark every ledger naming a bookie that is not registered and has no cookie or is lost.
    Returns the ledgers marked."""
    count = 0
    async for meta in client.iter_ledger_metadata():
        gone = {b for _, bookies in meta.ensembles for b in bookies
                if b not in registered and (b not in cookies or b in lost)}
        if gone:
            await marks.mark(meta.ledger_id, gone, by=by)
            count += 1
    return count

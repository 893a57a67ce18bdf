"""Damage repair: what this bookie's scrub and compaction found (damage.py) published as damage marks in etcd
(octavo.meta.damage), and the repair in place of the marks that name this bookie.

A mark is a claim, not a proof: anyone who can write to etcd can make one. Before anything is rewritten this
bookie re-reads every entry the mark names and checks its record's checksum (Engine.verify_entry):
- good (never damaged, or repaired already): dropped from the mark; nothing is written;
- not held here, or not this bookie's copy any more (its share moved): dropped;
- damaged (checksum mismatch, a truncated or missing log): the entry is read from another replica and written
  back with a repair write (Engine.repair_entries), which the engine takes only over a copy that fails its
  checksum; then read back, and dropped from the mark once it reads good.
When the repair write cannot be taken (the disk is full, a write error), the ledger is marked under-replicated
naming this bookie (by DAMAGE_BY): the replication workers move its share to another bookie where one exists,
and do not drop that mark because this bookie is registered.

Each pass runs every damage_check_interval_s; a failed pass (etcd or peers unreachable) is retried with
backoff and jitter, at most DAMAGE_RETRY_DELAY_S_MAX apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from octavo.client.client import Client
from octavo.client.reader import ReadHandle
from octavo.meta.damage import Damage, DamageMark, entries_of
from octavo.meta.errors import NoSuchLedgerError, OctavoError
from octavo.meta.ledger_metadata import LedgerMetadata
from octavo.meta.underreplication import DAMAGE_BY, UnderReplication
from octavo.node.compaction import Compactor
from octavo.node.config import NodeConfig
from octavo.node.damage import DamageFindings
from octavo.node.engine import Engine
from octavo.node.errors import StorageError, WriteCacheFull
from octavo.node.repair import peer_client
from octavo.node.scrub import Scrubber, ScrubPass, scrub_due_unix_ms, set_scrub_due
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

DAMAGE_RETRY_DELAY_S_MAX = 60.0
# A confirmed damaged entry's neighbours (the ledger's other entries in the same logs): bytes read at most.
NEARBY_BYTES_MAX = 64 * 1024 * 1024
# Entries one repair write carries at most.
REPAIR_BATCH_ENTRIES_MAX = 1000
# A scrub pass stopping (the bookie stops) is waited for this long at most: it checks for a stop at least every
# 0.2 s and after every read of at most 1 MiB.
SCRUB_STOP_WAIT_S = 10.0
# A scheduled pass due while one asked for by hand runs is tried again this much later.
SCRUB_BUSY_RETRY_S = 60.0
# Write cache room waited for by one repair write, at most.
REPAIR_ROOM_WAIT_S = 30.0


@dataclass
class RepairStats:
    passes: int = 0
    marks_open: int = 0               # marks naming this bookie at the last pass
    entries_damaged: int = 0          # entries named by those marks that failed their check at the last pass
    entries_repaired: int = 0         # written back in place and read back good
    entries_refuted: int = 0          # named by a mark but good here: nothing written
    ledgers_moved: int = 0            # marked under-replicated because the repair write was refused here
    last_error: str = ""


class DamageRepair:
    def __init__(self, engine: Engine, bookie_id: str, findings: DamageFindings, interval_s: float,
                 make_client: Callable[[], Client]) -> None:
        self.engine = engine
        self.bookie_id = bookie_id
        self.findings = findings
        self.interval_s = interval_s
        self._make_client = make_client  # () -> Client, on this bookie's settings
        self.stats = RepairStats()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Run a pass now (after a scrub pass, or when asked)."""
        self._wake.set()

    async def run(self) -> None:
        delay = 1.0
        while True:
            try:
                async with self._make_client() as client:
                    while True:
                        await self.pass_once(client)
                        delay = 1.0
                        self._wake.clear()
                        with contextlib.suppress(TimeoutError):  # no task per wait, as wait_for makes
                            async with asyncio.timeout(self.interval_s):
                                await self._wake.wait()
            except (OctavoError, StorageError, OSError) as e:
                self.stats.last_error = str(e)
                log.warning("damage repair pass failed (%s); retrying in %.0fs", e, delay)
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, DAMAGE_RETRY_DELAY_S_MAX)

    async def pass_once(self, client: Client) -> None:
        damage = Damage(client.etcd, client.metadata_store.layout)
        await client.bookies(refresh=True)  # the peers as registered now (they may have moved or restarted)
        found = self.findings.take()
        try:
            for ledger_id, (reason, finder, entries) in found.items():
                await damage.report(ledger_id, self.bookie_id, entries, reason, finder)
        except OctavoError:
            self.findings.give_back(found)
            raise
        open_marks = damaged = 0
        async for mark in damage.marks():
            if mark.bookie_id != self.bookie_id:
                continue
            open_marks += 1
            damaged += await self._settle(client, damage, mark)
        self.stats.passes += 1
        self.stats.marks_open, self.stats.entries_damaged = open_marks, damaged

    async def _settle(self, client: Client, damage: Damage, mark: DamageMark) -> int:
        """Check, repair and settle one mark; returns the entries still damaged."""
        try:
            meta = await client.ledger_metadata(mark.ledger_id)
        except NoSuchLedgerError:
            await damage.settle(mark, [])  # the ledger is gone: nothing to repair
            return 0
        loop = asyncio.get_running_loop()
        mine = [e for e in entries_of(mark.ranges) if (not meta.closed or e <= meta.last_entry_id)
                and self.bookie_id in meta.write_set_bookies(e)]
        checks = await loop.run_in_executor(None, self._verify, mark.ledger_id, mine)
        damaged = {e: why for e, why in checks.items() if why}
        self.stats.entries_refuted += sum(1 for why in checks.values() if not why)
        if damaged:
            # Damage comes in patches (a bad sector, a cut file) and a read meets only the first damaged entry of
            # each range it asks for: the ledger's other records in the same logs are checked now too.
            nearby = await loop.run_in_executor(None, self._nearby, mark.ledger_id, sorted(damaged))
            near = {e: why for e, why in nearby.items() if why and e not in damaged
                    and (not meta.closed or e <= meta.last_entry_id) and self.bookie_id in meta.write_set_bookies(e)}
            log.warning("%s: %d entries fail their checksum here (and %d more of the ledger in the same logs); "
                        "repairing them from other replicas", mark.describe(), len(damaged), len(near))
            todo = sorted({*damaged, *near})
            await self._repair(client, meta.ledger_id, meta, todo)
            after = await loop.run_in_executor(None, self._verify, mark.ledger_id, todo)
            self.stats.entries_repaired += sum(1 for why in after.values() if not why)
            for e, why in after.items():
                if why and e in near:  # not repaired: marked, so it is tried again and listed
                    self.findings.note(mark.ledger_id, e, why, f"bookie {self.bookie_id} (near a reported entry)")
            damaged = {e: why for e, why in after.items() if why and e in damaged}
        await damage.settle(mark, damaged)
        return len(damaged)

    def _nearby(self, ledger_id: int, entries: list[int]) -> dict[int, str]:
        """The ledger's entries indexed in the logs that hold `entries`, checked (the first NEARBY_BYTES_MAX of
        them by entry id): "" if good, why if damaged."""
        logs = {loc[0] for loc in (self.engine.locate(ledger_id, e) for e in entries) if loc is not None}
        near: list[int] = []
        size = 0
        for eid, length in sorted({(eid, length) for log_id in logs
                                   for _, eid, _, length in self.engine.index.entries_in(log_id, [ledger_id])}):
            size += length
            if size > NEARBY_BYTES_MAX:
                break
            near.append(eid)
        return self._verify(ledger_id, near)

    def _verify(self, ledger_id: int, entries: list[int]) -> dict[int, str]:
        """Each entry held here: "" if good, why if damaged (entries not held are left out)."""
        out: dict[int, str] = {}
        for e in entries:
            why = self.engine.verify_entry(ledger_id, e)
            if why is not None:
                out[e] = why
        return out

    async def _repair(self, client: Client, ledger_id: int, meta: LedgerMetadata, entries: list[int]) -> None:
        state = self.engine.ledger_state(ledger_id)
        if state is None:
            return
        reader = ReadHandle(client, meta, max(entries))
        found, errors = await reader.read_available(entries, exclude={self.bookie_id})
        if errors:
            log.error("ledger %d: %d damaged entries could not be read from another replica (%s)", ledger_id,
                      len(errors), next(iter(errors.values())))
        ids = [e for e in entries if e in found]
        log.info("ledger %d: %d of %d damaged entries read from other replicas", ledger_id, len(ids), len(entries))
        for start in range(0, len(ids), REPAIR_BATCH_ENTRIES_MAX):
            part = ids[start:start + REPAIR_BATCH_ENTRIES_MAX]
            codes, message = await self._write(ledger_id, state.master_key, part, [found[e] for e in part])
            if any(c in (pb.READ_ONLY, pb.INTERNAL) for c in codes):
                await self._move_share(client, ledger_id, message)
                return

    async def _write(self, ledger_id: int, key: bytes, ids: list[int], payloads: list[bytes]) -> tuple[list[int], str]:
        loop = asyncio.get_running_loop()
        write = functools.partial(self.engine.repair_entries, ledger_id, key, ids, payloads)
        try:  # on a thread: under fsync_policy=batch the write waits for its fdatasync, never on the loop
            codes, message = await loop.run_in_executor(None, write)
        except WriteCacheFull:
            await loop.run_in_executor(None, self.engine.wait_for_room, len(ids), REPAIR_ROOM_WAIT_S)
            codes, message = await loop.run_in_executor(None, write)
        return list(codes), message

    async def _move_share(self, client: Client, ledger_id: int, why: str) -> None:
        """The fallback: this bookie cannot take the repair writes, so its share of the ledger moves."""
        log.error("ledger %d: this bookie cannot take repair writes (%s); marking it under-replicated so its "
                  "copies move to another bookie", ledger_id, why)
        marks = UnderReplication(client.etcd, client.metadata_store.layout)
        if await marks.mark(ledger_id, [self.bookie_id], by=f"{DAMAGE_BY} {self.bookie_id}"):
            self.stats.ledgers_moved += 1


class DamageControl:
    """The bookie's defences against bit rot, started and stopped with it: the scrub (every scrub_interval_s, or
    when asked), compaction's findings, and (in a cluster) the repair of the damage marks naming this bookie."""

    def __init__(self, engine: Engine, compactor: Compactor, bookie_id: str) -> None:
        cfg = engine.config
        self.config = cfg
        self.engine = engine
        self.findings = DamageFindings()
        finder = f"bookie {bookie_id}"
        self.scrubber = Scrubber(engine, self.findings, cfg.scrub_rate_bytes_per_s, f"scrub on {finder}",
                                 lambda: compactor.rewriting)
        compactor.on_damage = lambda lid, eid, why: self.findings.note(lid, eid, why, f"compaction on {finder}")
        engine.on_corrupt_read(lambda lid, eid, why: self.findings.note(lid, eid, why, f"a read on {finder}"))
        self.repair: DamageRepair | None = None
        if cfg.etcd:
            self.repair = DamageRepair(engine, bookie_id, self.findings, cfg.damage_check_interval_s,
                                       lambda: peer_client(cfg))
        self._tasks: list[asyncio.Task[None]] = []
        self._pass: asyncio.Future[ScrubPass] | None = None  # the pass running in its thread, if any

    def start(self) -> None:
        if self.repair is not None:
            self._tasks.append(asyncio.create_task(self.repair.run(), name="octavo-damage-repair"))
        if self.config.scrub_interval_s:
            self._tasks.append(asyncio.create_task(self._scrub_loop(), name="octavo-scrub"))

    async def _scrub_loop(self) -> None:
        """A pass every scrub_interval_s, the schedule kept across restarts (scrub.STATE_SCRUB_DUE_UNIX_MS)."""
        loop = asyncio.get_running_loop()
        interval_s = self.config.scrub_interval_s
        while True:
            due_ms = await loop.run_in_executor(None, scrub_due_unix_ms, self.engine, interval_s,
                                                int(time.time() * 1000))
            await asyncio.sleep(max(0.0, due_ms / 1000 - time.time()))
            try:
                report = await self.scrub_now()
            except ValueError:  # a pass asked for by hand is running: look again once it may have ended
                await asyncio.sleep(SCRUB_BUSY_RETRY_S)
                continue
            if not report.stopped:
                await loop.run_in_executor(None, set_scrub_due, self.engine,
                                           report.finished_unix_ms + interval_s * 1000)

    async def scrub_now(self) -> ScrubPass:
        """One scrub pass (in an executor thread); then the repair looks at once. ValueError if one runs."""
        self._pass = asyncio.get_running_loop().run_in_executor(None, self.scrubber.run_pass)
        report = await self._pass
        if self.repair is not None and report.damaged:
            self.repair.wake()
        return report

    async def stop(self) -> None:
        self.scrubber.stop_event.set()
        if self._pass is not None and not self._pass.done():
            # Its thread reads the index and the logs: let it reach its next stop check before storage closes.
            await asyncio.wait([self._pass], timeout=SCRUB_STOP_WAIT_S)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []


def scrub_state(control: DamageControl, cfg: NodeConfig, report: ScrubPass | None = None) -> pb.ScrubState:
    """The scrub and repair as the admin plane shows them; with `report`, that pass's findings."""
    scrubber = control.scrubber
    last = report or scrubber.last
    state = pb.ScrubState(enabled=bool(cfg.scrub_interval_s), interval_s=cfg.scrub_interval_s,
                          rate_bytes_per_s=cfg.scrub_rate_bytes_per_s, running=scrubber.running,
                          passes=scrubber.passes, bytes_verified=scrubber.bytes_verified,
                          records_verified=scrubber.records_verified, damaged_records=scrubber.damaged_records)
    if last is not None:
        state.last_pass_unix_ms = last.finished_unix_ms
        state.last_pass_duration_s = last.duration_s
        state.last_pass_bytes = last.bytes
        state.last_pass_damaged = last.damaged
    if report is not None:
        state.findings.extend(pb.ScrubFinding(ledger_id=f.ledger_id, entry_id=f.entry_id, log_id=f.log_id,
                                              offset=f.offset, reason=f.reason) for f in report.findings)
    if control.repair is not None:
        s = control.repair.stats
        state.damage_marks_open, state.damage_entries_damaged = s.marks_open, s.entries_damaged
        state.damage_entries_repaired, state.damage_entries_refuted = s.entries_repaired, s.entries_refuted
        state.damage_ledgers_moved, state.damage_last_error = s.ledgers_moved, s.last_error
    return state

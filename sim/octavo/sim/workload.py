"""What the simulated applications do, and what they saw (the checkers judge it after the run).

- Writers create ledgers and append (a few appends in flight at once), remember every payload they sent and
  the entry ids acknowledged; each ledger ends closed, left open, or with its writer's process crashed.
- Tailing readers follow open ledgers without recovery; catch-up readers read what is confirmed.
- Recovery openers, on other clients, open ledgers that may still have a writer (fencing it).
- A deleter deletes some closed ledgers.
- A takeover (in some runs): a holder writes a ledger and goes idle; a taker, on another client, recovery-opens
  it in that pause (fencing the holder, who does not know yet), then the ledger's bookies restart one after
  another (run.py); the holder resumes appending. A fence that does not survive its bookie's restart lets the
  holder's adds be acknowledged past the end the taker closed the ledger at.
Payloads name their ledger and entry and carry seeded bytes, so a reader that got bytes nobody wrote, or an
entry in the wrong place, is caught.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from octavo.client.writer import WriteHandle
from octavo.meta.errors import OctavoError
from octavo.sim.cluster import Cluster

PASSWORD = b"sim"
# Per-seed work (issue 31: a few ledgers a seed): entries a writer puts in one ledger (at most), and the largest
# payload. The bookies' logs (bookie.SIM_SETTINGS) are small enough that they still roll and flush.
ENTRIES_MAX = 60
PAYLOAD_BYTES_MAX = 600
# A writer pauses up to this long between bursts of appends (a ledger lives through faults, not past them).
APPEND_PAUSE_S_MAX = 0.3


def payload(rng: random.Random, ledger_id: int, entry_id: int) -> bytes:
    return b"%d/%d/" % (ledger_id, entry_id) + rng.randbytes(rng.randrange(1, PAYLOAD_BYTES_MAX))


@dataclass
class LedgerRecord:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    written: dict[int, bytes] = field(default_factory=dict)  # every payload sent, acknowledged or not
    acked: set[int] = field(default_factory=set)
    closed_by_writer: int | None = None  # the last entry its writer's close recorded
    deleted: bool = False  # a delete was tried (it may have applied even when its answer was lost)
    # (who, entry id, payload) of every entry a reader was handed; recovery opens: (who, last entry id)
    seen: list[tuple[str, int, bytes]] = field(default_factory=list)
    recovered: list[tuple[str, int]] = field(default_factory=list)


async def append_burst(rng: random.Random, handle: WriteHandle, rec: LedgerRecord, first_id: int, burst: int
                       ) -> list[BaseException]:
    """Append `burst` entries from first_id at once (payloads drawn from rng, each kept in rec.written); the
    acknowledged ones join rec.acked. Returns the appends' errors, in order."""
    datas = [payload(rng, rec.ledger_id, entry_id) for entry_id in range(first_id, first_id + burst)]
    rec.written.update(zip(range(first_id, first_id + burst), datas, strict=True))
    results = await asyncio.gather(*(handle.append(d) for d in datas), return_exceptions=True)
    errors = []
    for data, result in zip(datas, results, strict=True):
        if isinstance(result, BaseException):
            errors.append(result)
            continue
        if rec.written.get(result) != data:
            raise AssertionError(f"ledger {rec.ledger_id}: append acknowledged as entry {result}, which is not the "
                                 "entry id of what was sent")
        rec.acked.add(result)
    return errors


@dataclass
class Takeover:
    """A takeover's plan (drawn from the seed) and what links its two sides: the holder's ledger, set once the
    holder is idle; `after_open` is called with the ledger's last ensemble once the taker's recovery open
    returned (run.py restarts those bookies one after another): the holder's, which the taker fenced (the
    taker's recovery may have replaced one it could not reach)."""

    pause_s: float  # how long the holder stays idle after its first appends
    open_after_s: float  # how long into that pause the taker recovery-opens the ledger
    after_open: Callable[[list[str]], None]
    ledger_id: int | None = None
    ensemble: list[str] = field(default_factory=list)
    idle: asyncio.Event = field(default_factory=asyncio.Event)


# A takeover's holder: entries of its first appends (before the pause), and bursts after it.
TAKEOVER_FIRST_ENTRIES_MAX = 10
TAKEOVER_BURSTS_AFTER_MAX = 3


@dataclass
class Workload:
    cluster: Cluster
    rng: random.Random
    end_s: float  # writers stop starting new work after this virtual time
    ledgers: dict[int, LedgerRecord] = field(default_factory=dict)
    quorums: tuple[int, int, int] = (3, 3, 2)

    def record(self, line: str) -> None:
        self.cluster.world.record(line)

    def now(self) -> float:
        return self.cluster.world.clock.now_s

    # -- writers -------------------------------------------------------------------------------------
    async def writer(self, node: str, rng: random.Random) -> None:
        client = self.cluster.client(node)
        while self.now() < self.end_s:
            e, qw, qa = self.quorums
            try:
                handle = await client.create_ledger(e, qw, qa, password=PASSWORD)
            except OctavoError as err:
                self.record(f"{node} create failed: {type(err).__name__}")
                await asyncio.sleep(rng.uniform(0.1, 0.5))
                continue
            lid = handle.ledger_id
            rec = self.ledgers[lid] = LedgerRecord(lid, e, qw, qa)
            self.record(f"{node} created ledger {lid} on {','.join(handle.metadata.last_ensemble)}")
            entries = rng.randrange(5, ENTRIES_MAX)
            failed = False
            next_id = 0
            while next_id < entries and self.now() < self.end_s and not failed:
                burst = rng.randrange(1, 6)
                for error in await append_burst(rng, handle, rec, next_id, burst):
                    failed = True
                    self.record(f"{node} ledger {lid} append failed: {type(error).__name__}")
                next_id += burst
                self.record(f"{node} ledger {lid} acked through {max(rec.acked, default=-1)}")
                await asyncio.sleep(rng.uniform(0.02, APPEND_PAUSE_S_MAX))
            ending = rng.random()
            if ending < 0.7 and not failed:
                await self._close(node, handle, rec)
            elif ending < 0.85:
                self.record(f"{node} crashes with ledger {lid} open")
                self.cluster.crash_client(node)
                return
            else:
                self.record(f"{node} leaves ledger {lid} open")

    async def _close(self, node: str, handle: WriteHandle, rec: LedgerRecord) -> None:
        try:
            await handle.close()
            rec.closed_by_writer = handle.metadata.last_entry_id
            self.record(f"{node} closed ledger {rec.ledger_id} at {rec.closed_by_writer}")
        except OctavoError as err:
            self.record(f"{node} close of {rec.ledger_id} failed: {type(err).__name__}")

    # -- a takeover ------------------------------------------------------------------------------------
    async def holder(self, node: str, rng: random.Random, plan: Takeover) -> None:
        """Writes a ledger, goes idle for plan.pause_s (the taker takes the ledger over meanwhile), then appends
        again as if nothing happened: a live writer that was fenced and has not heard so yet."""
        client = self.cluster.client(node)
        await asyncio.sleep(rng.uniform(0.2, max(0.3, self.end_s * 0.4)))
        e, qw, qa = self.quorums
        try:
            handle = await client.create_ledger(e, qw, qa, password=PASSWORD)
        except OctavoError as err:
            self.record(f"{node} create failed: {type(err).__name__}")
            plan.idle.set()  # no ledger to take over: the taker gives up
            return
        lid = handle.ledger_id
        rec = self.ledgers[lid] = LedgerRecord(lid, e, qw, qa)
        self.record(f"{node} created ledger {lid} on {','.join(handle.metadata.last_ensemble)}")
        next_id = 0
        for burst in [rng.randrange(1, TAKEOVER_FIRST_ENTRIES_MAX + 1), 0,
                      *(rng.randrange(1, 6) for _ in range(rng.randrange(1, TAKEOVER_BURSTS_AFTER_MAX + 1)))]:
            if not burst:  # the pause
                plan.ledger_id, plan.ensemble = lid, list(handle.metadata.last_ensemble)
                plan.idle.set()
                self.record(f"{node} idle with ledger {lid} open for {plan.pause_s:.3f}s")
                await asyncio.sleep(plan.pause_s)
                continue
            failed = await append_burst(rng, handle, rec, next_id, burst)
            next_id += burst
            self.record(f"{node} ledger {lid} acked through {max(rec.acked, default=-1)}"
                        + (f"; append failed: {type(failed[0]).__name__}" if failed else ""))
            if failed:
                plan.idle.set()  # failed before its pause: the taker gives up
                return
            await asyncio.sleep(rng.uniform(0.02, APPEND_PAUSE_S_MAX))
        await self._close(node, handle, rec)

    async def taker(self, node: str, rng: random.Random, plan: Takeover) -> None:
        """Recovery-opens the holder's ledger while the holder is idle, calls plan.after_open with the holder's
        ensemble, and reads the ledger."""
        client = self.cluster.client(node)
        await plan.idle.wait()
        await asyncio.sleep(plan.open_after_s)
        lid = plan.ledger_id
        if lid is None:
            return
        rec = self.ledgers[lid]
        try:
            handle = await client.open_ledger(lid, PASSWORD)
        except OctavoError as err:
            self.record(f"{node} takeover of {lid} failed: {type(err).__name__}")
            return
        rec.recovered.append((node, handle.last_entry_id))
        self.record(f"{node} took ledger {lid} over: last entry {handle.last_entry_id}")
        plan.after_open(plan.ensemble)
        if handle.last_entry_id >= 0:
            try:
                async for entry in handle.read(0, handle.last_entry_id):
                    rec.seen.append((node, entry.entry_id, entry.data))
            except OctavoError as err:
                self.record(f"{node} read of {lid} failed: {type(err).__name__}")

    # -- readers -------------------------------------------------------------------------------------
    async def tailer(self, node: str, rng: random.Random) -> None:
        """Follows a ledger that is open, without recovery, up to its LAC (never past it)."""
        client = self.cluster.client(node)
        while self.now() < self.end_s:
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            open_ids = sorted(lid for lid, r in self.ledgers.items() if r.closed_by_writer is None and not r.deleted)
            if not open_ids:
                continue
            lid = rng.choice(open_ids)
            rec = self.ledgers[lid]
            try:
                handle = await client.open_ledger(lid, PASSWORD, recovery=False)
                async with asyncio.timeout(rng.uniform(0.5, 3.0)):
                    async for entry in handle.tail(0):
                        rec.seen.append((node, entry.entry_id, entry.data))
            except (OctavoError, TimeoutError) as err:
                self.record(f"{node} tail of {lid} ended: {type(err).__name__}")
            self.record(f"{node} tailed ledger {lid}: {len(rec.seen)} entries seen in all")

    async def recoverer(self, node: str, rng: random.Random) -> None:
        """Opens ledgers that may still have a writer, with recovery, and reads what it finds."""
        client = self.cluster.client(node)
        while self.now() < self.end_s:
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            candidates = sorted(lid for lid, r in self.ledgers.items() if not r.deleted)
            if not candidates:
                continue
            lid = rng.choice(candidates)
            rec = self.ledgers[lid]
            try:
                handle = await client.open_ledger(lid, PASSWORD)
                rec.recovered.append((node, handle.last_entry_id))
                self.record(f"{node} recovered ledger {lid}: last entry {handle.last_entry_id}")
                if handle.last_entry_id >= 0:
                    async for entry in handle.read(0, handle.last_entry_id):
                        rec.seen.append((node, entry.entry_id, entry.data))
            except OctavoError as err:
                self.record(f"{node} recovery open of {lid} failed: {type(err).__name__}")

    async def deleter(self, node: str, rng: random.Random) -> None:
        client = self.cluster.client(node)
        while self.now() < self.end_s:
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            closed = sorted(lid for lid, r in self.ledgers.items() if r.closed_by_writer is not None and not r.deleted)
            if not closed or rng.random() < 0.5:
                continue
            lid = rng.choice(closed)
            self.ledgers[lid].deleted = True
            try:
                await client.delete_ledger(lid)
                self.record(f"{node} deleted ledger {lid}")
            except OctavoError as err:
                self.record(f"{node} delete of {lid} failed: {type(err).__name__}")

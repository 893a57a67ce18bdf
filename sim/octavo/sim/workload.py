"""What the simulated applications do, and what they saw (the checkers judge it after the run).

- Writers create ledgers and append (a few appends in flight at once), remember every payload they sent and
  the entry ids acknowledged; each ledger ends closed, left open, or with its writer's process crashed.
- Tailing readers follow open ledgers without recovery; catch-up readers read what is confirmed.
- Recovery openers, on other clients, open ledgers that may still have a writer (fencing it).
- A deleter deletes some closed ledgers.
Payloads name their ledger and entry and carry seeded bytes, so a reader that got bytes nobody wrote, or an
entry in the wrong place, is caught.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

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
                datas = []
                for _ in range(burst):
                    data = payload(rng, lid, next_id)
                    rec.written[next_id] = data
                    datas.append(data)
                    next_id += 1
                results = await asyncio.gather(*(handle.append(d) for d in datas), return_exceptions=True)
                for data, result in zip(datas, results, strict=True):
                    if isinstance(result, BaseException):
                        failed = True
                        self.record(f"{node} ledger {lid} append failed: {type(result).__name__}")
                    else:
                        if rec.written.get(result) != data:
                            raise AssertionError(f"ledger {lid}: append acknowledged as entry {result}, which is "
                                                 "not the entry id of what was sent")
                        rec.acked.add(result)
                self.record(f"{node} ledger {lid} acked through {max(rec.acked, default=-1)}")
                await asyncio.sleep(rng.uniform(0.02, APPEND_PAUSE_S_MAX))
            ending = rng.random()
            if ending < 0.7 and not failed:
                try:
                    await handle.close()
                    rec.closed_by_writer = handle.metadata.last_entry_id
                    self.record(f"{node} closed ledger {lid} at {rec.closed_by_writer}")
                except OctavoError as err:
                    self.record(f"{node} close of {lid} failed: {type(err).__name__}")
            elif ending < 0.85:
                self.record(f"{node} crashes with ledger {lid} open")
                self.cluster.crash_client(node)
                return
            else:
                self.record(f"{node} leaves ledger {lid} open")

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

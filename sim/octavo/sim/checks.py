"""The checkers, run after every fault is healed and the cluster had time to settle.

1. Every acknowledged entry reads back identical from a recovery open (a fresh client), and its writer's
   close, if it recorded one, agrees with the ledger's final end.
2. No reader was ever handed an entry past where its ledger finally ends, or bytes that were never written
   for that entry; every recovery open found the same end.
3. Every replica of a closed ledger's entries agrees (what each bookie of the write set holds is the same).
4. No ledger stays under-replicated: every entry of a closed ledger is held by at least an ack quorum of the
   bookies its metadata names (a copy lost with a machine's unsynced tail, or with a bookie lost for good, is
   copied back by tail repair or re-replication).
5. Deleted ledgers are gone from etcd and, once GC ran, from every bookie (waited for with checks 3 and 4: a
   bookie cut from etcd at the delete drops the ledger at its first GC after the heal).
"""

from __future__ import annotations

import asyncio

from octavo.client.client import Client
from octavo.meta.errors import NoSuchLedgerError, OctavoError
from octavo.meta.ledger_metadata import LedgerMetadata
from octavo.node.errors import StorageError
from octavo.sim.cluster import Cluster
from octavo.sim.workload import PASSWORD, LedgerRecord, Workload

CHECKER = "checker"
# Attempts at a recovery open, and then at reading the ledger, before the checker reports it as not recoverable
# or not readable (the cluster is healed: one should succeed at once; a few allow for a bookie still starting or
# registering again).
OPEN_ATTEMPTS_MAX = 10
# After the checker's recovery opens, re-replication copies what the ledgers closed just now lack (the replicas
# check, every 2 s in bookie.py, looks at sealed segments only; a bookie lost for good is re-replicated after
# lost_bookie_delay_s): the replicas are compared every REPLICAS_POLL_S until they are whole, for at most
# REPLICATION_SETTLE_S_MAX virtual seconds (then what is still missing is a violation).
REPLICAS_POLL_S = 1.0
REPLICATION_SETTLE_S_MAX = 30.0


async def check(cluster: Cluster, workload: Workload) -> list[str]:
    """Recover and read every ledger (checks 1, 2), then compare the replicas and look for deleted ledgers still
    held (checks 3, 4, 5) until none is found or REPLICATION_SETTLE_S_MAX has passed."""
    violations: list[str] = []
    client = cluster.client(CHECKER)
    read: list[tuple[int, LedgerMetadata, dict[int, bytes]]] = []
    gone: list[LedgerRecord] = []
    for lid in sorted(workload.ledgers):
        rec = workload.ledgers[lid]
        found, opened = await _check_ledger(cluster, client, rec, gone)
        violations.extend(found)
        if opened is not None:
            read.append((lid, *opened))
    deadline = asyncio.get_running_loop().time() + REPLICATION_SETTLE_S_MAX
    while True:
        # A bookie that was cut from etcd when a ledger was deleted learns of it after the heal and drops it at
        # its next GC: waited for like the copies re-replication makes, not assumed done by a fixed settle.
        found = await _check_all_replicas(cluster, client, read) + [
            v for rec in gone for v in _check_dropped(cluster, rec)]
        if not found or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(REPLICAS_POLL_S)
    violations.extend(found)
    return violations


async def _check_all_replicas(cluster: Cluster, client: Client,
                              read: list[tuple[int, LedgerMetadata, dict[int, bytes]]]) -> list[str]:
    violations: list[str] = []
    for lid, meta, data in read:
        try:  # re-replication may have swapped bookies in its ensembles meanwhile
            meta = await client.ledger_metadata(lid)
        except NoSuchLedgerError:
            continue
        except OctavoError as e:
            violations.append(f"ledger {lid}: metadata unreadable after healing: {type(e).__name__}: {e}")
            continue
        violations.extend(_check_replicas(cluster, lid, meta, data))
    return violations


async def _check_ledger(cluster: Cluster, client: Client, rec: LedgerRecord, gone: list[LedgerRecord]
                        ) -> tuple[list[str], tuple[LedgerMetadata, dict[int, bytes]] | None]:
    """Checks 1 and 2 on one ledger, and the first half of 5 (a deleted ledger's metadata is gone: the ledger
    goes to `gone`, whose copies the caller checks); its metadata and entries when it could be recovered and
    read."""
    lid = rec.ledger_id
    out: list[str] = []
    handle = None
    error = ""
    for _ in range(OPEN_ATTEMPTS_MAX):
        try:
            handle = await client.open_ledger(lid, PASSWORD)
            break
        except NoSuchLedgerError:
            if rec.deleted:
                gone.append(rec)
                return [], None
            return [f"ledger {lid}: metadata gone, but it was never deleted"], None
        except OctavoError as e:
            error = f"{type(e).__name__}: {e}"
            await asyncio.sleep(1.0)
    if handle is None:
        return [f"ledger {lid}: no recovery open succeeded after healing ({error})"], None
    last = handle.last_entry_id
    meta = handle.metadata
    if rec.acked and max(rec.acked) > last:
        out.append(f"ledger {lid}: acknowledged entry {max(rec.acked)} lost: the ledger ends at {last}")
    if rec.closed_by_writer is not None and rec.closed_by_writer != last:
        out.append(f"ledger {lid}: its writer closed it at {rec.closed_by_writer}, it ends at {last}")
    for who, found in rec.recovered:
        if found != last:
            out.append(f"ledger {lid}: {who}'s recovery open found the end at {found}, it is {last}")
    data: dict[int, bytes] = {}
    for attempt in range(OPEN_ATTEMPTS_MAX if last >= 0 else 0):
        # As for the open: a bookie back from a fault may not have registered again yet (its address is in its
        # registration), so a failed read is tried again a few times before it counts.
        try:
            data = await handle.read_entries(list(range(last + 1)))
            break
        except OctavoError as e:
            if attempt == OPEN_ATTEMPTS_MAX - 1:
                return [*out, f"ledger {lid}: entries up to its end {last} cannot be read: {type(e).__name__}: "
                              f"{e} (ensembles {meta.ensembles}; held: {_holdings(cluster, lid)})"], None
            await asyncio.sleep(1.0)
    for entry_id, payload in data.items():
        if rec.written.get(entry_id) != payload:
            out.append(f"ledger {lid}: entry {entry_id} reads back as bytes its writer never wrote there")
    for entry_id in sorted(rec.acked):
        if entry_id <= last and data.get(entry_id) != rec.written[entry_id]:
            out.append(f"ledger {lid}: acknowledged entry {entry_id} does not read back identical")
    for who, entry_id, payload in rec.seen:
        if entry_id > last:
            out.append(f"ledger {lid}: {who} was handed entry {entry_id}, past the end {last}")
        elif rec.written.get(entry_id) != payload:
            out.append(f"ledger {lid}: {who} was handed bytes never written as entry {entry_id}")
    return out, (meta, data)


def _check_replicas(cluster: Cluster, lid: int, meta: LedgerMetadata, data: dict[int, bytes]) -> list[str]:
    out = []
    short = []
    for entry_id, payload in sorted(data.items()):
        copies = 0
        for bookie_id in meta.write_set_bookies(entry_id):
            bookie = cluster.bookies.get(bookie_id)
            storage = bookie.storage if bookie is not None and bookie.running else None
            if storage is None:
                continue
            try:
                held = storage.read_entry(lid, entry_id)
            except StorageError:
                continue
            copies += 1
            if held != payload:
                out.append(f"ledger {lid}: entry {entry_id} on {bookie_id} differs from the other replicas")
        if copies < meta.ack_quorum:
            short.append(entry_id)
    if short:
        repairing = sorted(name for name, b in cluster.bookies.items()
                           if b.running and b.storage is not None and b.storage.tail_maybe_lost)
        out.append(f"ledger {lid}: {len(short)} entries held by fewer than {meta.ack_quorum} bookies of their write "
                   f"set after healing (first {short[0]}; bookies still repairing a lost tail: "
                   f"{', '.join(repairing) or 'none'})")
    return out


def _holdings(cluster: Cluster, lid: int) -> str:
    """Which running bookie holds the ledger, and its state there: for a violation's message."""
    parts = []
    for name, bookie in sorted(cluster.bookies.items()):
        storage = bookie.storage if bookie.running else None
        state = storage.ledger_state(lid) if storage is not None else None
        parts.append(f"{name}: {'down' if storage is None else state}")
    return "; ".join(parts)


def _check_dropped(cluster: Cluster, rec: LedgerRecord) -> list[str]:
    return [f"ledger {rec.ledger_id}: deleted, but bookie {b.name} still holds it after GC"
            for b in cluster.bookies.values()
            if b.running and b.storage is not None and b.storage.ledger_state(rec.ledger_id) is not None
            and b.storage.last_gc is not None]

"""Ledger ids, handed out from blocks reserved in etcd (docs/architecture.md, "Ledger ids").

The key `idgen/ledger` holds the next id no one has reserved. A client reserves a block of ids [n, n + size)
with one compare-and-swap that moves the key from n to n + size, then creates ledgers with the ids of its block
without touching the counter again. Kafka's producer-id blocks and BookKeeper's id generators work this way.

- Unique: a block belongs to the one client whose CAS moved the counter past it; the creation transaction also
  requires that the ledger's key does not exist, so even a counter set back by hand cannot overwrite a ledger.
- Never reused: the counter only grows, and a block is reserved before any of its ids is used. A client that
  crashes leaves the rest of its block unused for good (at most `block_ids_max` ids; ids are 64-bit).
- Contention: creators race on the counter only once per block. Within a process one reservation runs at a
  time and every creator waiting on it takes ids from the block it brings.
- Blocks start small (`block_ids_initial`: a tool creating one ledger wastes little) and double with each
  block used, up to `block_ids_max`.
- Compatible with clients that take one id per CAS on the same key (the format of the key is unchanged: the
  next free id as a decimal integer), in both directions.

Ids are unique and increase within one client, but are not in creation order across clients.
"""

from __future__ import annotations

import asyncio

from octavo.meta.etcd import EtcdClient, Txn
from octavo.meta.layout import Layout
from octavo.meta.retry import CasRetry

LEDGER_ID_BLOCK_IDS_INITIAL = 16
LEDGER_ID_BLOCK_IDS_MAX = 1024
# A reservation races only with other clients' reservations (one per block each): with 100 clients reserving
# at the same moment, full-jitter backoff gets each through in a handful of attempts.
LEDGER_ID_RESERVE_ATTEMPTS_MAX = 100
LEDGER_ID_MAX = (1 << 63) - 1


class LedgerIdAllocator:
    """Ids from this client's current block; a new block is reserved when it runs out."""

    def __init__(self, etcd: EtcdClient, layout: Layout, block_ids_initial: int = LEDGER_ID_BLOCK_IDS_INITIAL,
                 block_ids_max: int = LEDGER_ID_BLOCK_IDS_MAX) -> None:
        if not 1 <= block_ids_initial <= block_ids_max:
            raise ValueError(f"need 1 <= block_ids_initial <= block_ids_max, got {block_ids_initial}, "
                             f"{block_ids_max}")
        self.etcd = etcd
        self.layout = layout
        self.block_ids_max = block_ids_max
        self._next_block_ids = block_ids_initial
        self._next = 0  # the next id of the current block to hand out
        self._end = 0  # the end of the current block, exclusive: empty until the first reservation
        self._lock = asyncio.Lock()
        self.blocks_reserved = 0

    async def next_id(self) -> int:
        """An id no one else has or will ever get from this cluster's counter."""
        while self._next >= self._end:
            async with self._lock:
                if self._next >= self._end:  # no one refilled it while we waited for the lock
                    self._next, self._end = await self._reserve(self._next_block_ids)
                    self._next_block_ids = min(self.block_ids_max, self._next_block_ids * 2)
        ledger_id = self._next
        self._next += 1
        return ledger_id

    async def _reserve(self, size: int) -> tuple[int, int]:
        """Move the counter from n to n + size with a CAS; returns [n, n + size)."""
        key = self.layout.ledger_id_counter
        retry = CasRetry("ledger id allocation: reserving a block of ids", LEDGER_ID_RESERVE_ATTEMPTS_MAX)
        while True:
            current = await self.etcd.get(key)
            start = int(current.value) if current else 0
            revision = current.mod_revision if current else 0
            if start < 0 or start > LEDGER_ID_MAX - size:
                raise ValueError(f"the ledger id counter {key.decode()} holds {start}: outside [0, "
                                 f"{LEDGER_ID_MAX - size}]")
            ok, _ = await self.etcd.txn(Txn().mod_revision_is(key, revision).put(key, str(start + size).encode()))
            if ok:
                self.blocks_reserved += 1
                return start, start + size
            await retry.lost(f"another client's reservation (the counter was at {start}, revision {revision})")

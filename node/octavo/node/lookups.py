"""Ledger metadata the data plane looks up in etcd before it acts on a ledger it holds nothing of, grouped: the
lookups asked while one transaction is in flight go to etcd together in the next one (range operations in one
transaction, at most TXN_OPS_MAX), and two asks for one ledger share one lookup.

Every first contact of a bookie with a ledger (its first add, a fence, a tailing read) is checked against etcd
(docs/architecture.md, "What a bookie takes on faith"); a busy writer opens ledgers by the hundred a second on
every bookie, so one etcd request per ledger and bookie would cost etcd more than the creations themselves.
A read is linearizable (etcd's default): a ledger whose creation etcd acknowledged before its writer sent the
add is always found.
"""

from __future__ import annotations

import asyncio

from octavo.meta.errors import MetadataUnavailableError
from octavo.meta.etcd import TXN_OPS_MAX, EtcdClient, Txn
from octavo.meta.layout import Layout
from octavo.meta.ledger_metadata import LedgerMetadata, MetadataError


class LedgerLookups:
    def __init__(self, etcd: EtcdClient, layout: Layout, ops_max: int = TXN_OPS_MAX) -> None:
        if ops_max < 1:
            raise ValueError(f"ops_max must be at least 1, got {ops_max}")
        self.etcd = etcd
        self.layout = layout
        self.ops_max = ops_max
        self._asked: dict[int, asyncio.Future[LedgerMetadata | None]] = {}  # not sent yet, by ledger id
        self._reader: asyncio.Task[None] | None = None
        self.transactions = 0
        self.lookups = 0

    async def get(self, ledger_id: int) -> LedgerMetadata | None:
        """The ledger's metadata in etcd, None if etcd has no such ledger. MetadataUnavailableError if etcd
        cannot be asked or the metadata cannot be read."""
        if ledger_id < 0:
            return None
        future = self._asked.get(ledger_id)
        if future is None:
            future = self._asked[ledger_id] = asyncio.get_running_loop().create_future()
            if self._reader is None or self._reader.done():
                self._reader = asyncio.get_running_loop().create_task(self._read_all(), name="octavo-lookups")
        return await asyncio.shield(future)

    async def _read_all(self) -> None:
        while self._asked:
            ids = list(self._asked)[:self.ops_max]
            futures = [self._asked.pop(i) for i in ids]
            try:
                found = await self._read(ids)
            except BaseException as e:
                for future in futures:
                    if not future.done():
                        if isinstance(e, Exception):
                            future.set_exception(e)
                            future.exception()  # retrieved: an ask nobody waits for any more must not warn
                        else:
                            future.cancel()
                if not isinstance(e, Exception):
                    raise
                continue
            for future, outcome in zip(futures, found, strict=True):
                if future.done():
                    continue
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                    future.exception()
                else:
                    future.set_result(outcome)

    async def _read(self, ids: list[int]) -> list[LedgerMetadata | Exception | None]:
        txn = Txn()
        for ledger_id in ids:
            txn.get(self.layout.ledger(ledger_id))
        self.transactions += 1
        self.lookups += len(ids)
        _, resp = await self.etcd.txn(txn)
        out: list[LedgerMetadata | Exception | None] = []
        for ledger_id, answer in zip(ids, resp.responses, strict=True):
            kvs = answer.response_range.kvs
            if not kvs:
                out.append(None)
                continue
            try:
                out.append(LedgerMetadata.decode(kvs[0].value))
            except MetadataError as e:
                out.append(MetadataUnavailableError(f"metadata of ledger {ledger_id} is unreadable: {e}"))
        return out

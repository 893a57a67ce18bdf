"""Cluster metadata in etcd: ledgers, ledger id allocation, bookie registrations, cookies.

Every update is a compare-and-swap on the key's mod revision: a lost race is reported to the caller (None or
False), which re-reads and decides; nothing is ever overwritten blindly. The only unconditional writes are
a bookie's own registration keys, which only that bookie writes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass

from octavo.meta.errors import MetadataUnavailableError, NoSuchLedgerError
from octavo.meta.etcd import TXN_OPS_MAX, EtcdClient, KeyValue, Txn
from octavo.meta.groupcas import GroupCas
from octavo.meta.idgen import LedgerIdAllocator
from octavo.meta.layout import Layout
from octavo.meta.ledger_metadata import LedgerMetadata, MetadataError

log = logging.getLogger(__name__)

# Ids of our block that turn out to exist already before creation gives up (see create_ledger).
ID_COLLISIONS_MAX = 64

# A listing of the ledgers reads windows of ledger ids, not open-ended pages: etcd (3.5) counts every key from a
# range's start to its end to answer it, whatever its limit, so an open-ended page costs O(ledgers) and a listing
# O(ledgers^2 / page). A window starts range_page_keys ids wide, doubles while it finds few ledgers (a gap in the
# ids) up to this many ids, and is cut at range_page_keys keys.
LEDGER_WINDOW_IDS_MAX = 1 << 20


# The instance key of a decommissioned bookie's data directory names this, then the bookie id: the directory
# cannot join the cluster again.
DECOMMISSIONED_PREFIX = "decommissioned:"


@dataclass(frozen=True)
class BookieInfo:
    """A bookie's registration: where to reach it and how full it is."""

    bookie_id: str
    address: str
    readonly: bool = False
    disk_usage_ratio: float = 0.0
    registered_unix_ms: int = 0
    # The bookie's own limit on one entry's payload (0: not said, by a bookie older than this field): a
    # writer checks entries against its ensemble's limits before it gives them ids.
    entry_size_bytes_max: int = 0
    # The bookie's own limits on one add request (0: not said, by an older bookie): a client's requests to it
    # carry at most these many entries and payload bytes (its own REQUEST_*_MAX when larger, or not said).
    batch_entries_max: int = 0
    batch_bytes_max: int = 0
    # When this bookie process started (0: not said): a client that sees it change knows the bookie restarted
    # and reconnects at once instead of waiting out its connection backoff.
    started_unix_ms: int = 0

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @staticmethod
    def decode(data: bytes) -> BookieInfo:
        fields = json.loads(data)
        known = BookieInfo.__dataclass_fields__
        return BookieInfo(**{k: v for k, v in fields.items() if k in known})  # a newer bookie's fields are skipped


@dataclass(frozen=True)
class Cookie:
    """A bookie's identity bound to its data directory: the same instance id must be in both places."""

    bookie_id: str
    instance_id: str
    data_dir: str
    created_unix_ms: int

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @staticmethod
    def decode(data: bytes) -> Cookie:
        return Cookie(**json.loads(data))


class MetadataStore:
    def __init__(self, etcd: EtcdClient, layout: Layout | None = None) -> None:
        self.etcd = etcd
        self.layout = layout or Layout()
        self.ids = LedgerIdAllocator(etcd, self.layout)
        # Creations and metadata updates made at the same time share etcd transactions (groupcas.py).
        self.group_cas = GroupCas(etcd)

    # -- ledgers ---------------------------------------------------------------------------------------
    async def create_ledger(self, **fields: object) -> tuple[LedgerMetadata, int]:
        """Create a ledger's metadata under an id from this store's block (idgen.py), with a CAS that requires
        the key not to exist (grouped with other creations and updates of this store: groupcas.py). `fields`
        are the LedgerMetadata fields other than ledger_id. Returns the metadata and its mod revision. Never
        fails because others create at the same time."""
        skipped: list[int] = []
        while True:
            ledger_id = await self.ids.next_id()
            meta = LedgerMetadata(ledger_id=ledger_id, created_unix_ms=int(time.time() * 1000), **fields)  # type: ignore[arg-type]
            key = self.layout.ledger(ledger_id)
            revision = await self.group_cas.put_if(key, meta.encode(), 0)
            if revision is not None:
                if skipped:
                    log.warning("ledger ids %s already had metadata (the id counter was set back?): skipped them",
                                skipped)
                return meta, revision
            # Only a counter moved back by hand (or a restored etcd backup) can hand out an id that exists.
            skipped.append(ledger_id)
            if len(skipped) >= ID_COLLISIONS_MAX:
                raise MetadataUnavailableError(
                    f"ledger ids {skipped[0]}..{skipped[-1]} all exist already: the id counter "
                    f"{self.layout.ledger_id_counter.decode()} is behind the ledgers (restored from an old backup?)")

    async def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        kv = await self.etcd.get(self.layout.ledger(ledger_id))
        if kv is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist in cluster {self.layout.cluster!r}")
        try:
            return LedgerMetadata.decode(kv.value), kv.mod_revision
        except MetadataError as e:
            raise MetadataUnavailableError(f"metadata of ledger {ledger_id} is unreadable: {e}") from e

    async def update_ledger(self, meta: LedgerMetadata, expected_revision: int) -> int | None:
        """CAS the ledger's metadata (grouped with others made meanwhile: groupcas.py). Returns the new revision,
        or None if it changed since (re-read)."""
        return await self.group_cas.put_if(self.layout.ledger(meta.ledger_id), meta.encode(), expected_revision)

    async def delete_ledger(self, ledger_id: int) -> None:
        kv = await self.etcd.get(self.layout.ledger(ledger_id))
        if kv is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist in cluster {self.layout.cluster!r}")
        await self.etcd.cas_delete(self.layout.ledger(ledger_id), kv.mod_revision)

    async def all_ledgers(self) -> list[LedgerMetadata]:
        return [LedgerMetadata.decode(kv.value) for kv in await self.etcd.get_prefix(self.layout.ledgers)]

    async def iter_ledgers(self) -> AsyncIterator[LedgerMetadata]:
        """Every ledger's metadata in id order, read a page at a time (the etcd client's range_page_keys): the
        caller holds one page, not the whole cluster's ledgers."""
        async for page in self.ledger_pages():
            for kv in page:
                yield LedgerMetadata.decode(kv.value)

    async def ledger_pages(self, keys_only: bool = False) -> AsyncIterator[list[KeyValue]]:
        """Every ledger's key (and metadata, unless keys_only) in id order, a page at a time (id_pages)."""
        async for page in id_pages(self.etcd, self.layout.ledgers, self.layout.ledger, self.layout.ledger_id_of,
                                   keys_only):
            yield page

    async def list_ledgers(self) -> list[int]:
        return [self.layout.ledger_id_of(kv.key) async for page in self.ledger_pages(keys_only=True)
                for kv in page]

    async def ledgers_existing(self, ledger_ids: list[int]) -> set[int]:
        """Which of these ledgers exist in etcd now: read TXN_OPS_MAX keys per transaction (one round trip per
        page, not per ledger: a GC pass after a mass delete confirms tens of thousands)."""
        found: set[int] = set()
        for start in range(0, len(ledger_ids), TXN_OPS_MAX):
            page = ledger_ids[start:start + TXN_OPS_MAX]
            txn = Txn()
            for ledger_id in page:
                txn.get(self.layout.ledger(ledger_id), keys_only=True)
            _, resp = await self.etcd.txn(txn)
            found.update(lid for lid, r in zip(page, resp.responses, strict=True) if r.response_range.kvs)
        return found

    # -- bookies ---------------------------------------------------------------------------------------
    async def bookies(self) -> dict[str, BookieInfo]:
        """Every registered bookie, writable and read-only (a bookie in both lists counts as read-only)."""
        out: dict[str, BookieInfo] = {}
        readonly_prefix = self.layout.bookies(True)
        # One range over both sets (one round trip: every ledger creation reads this).
        for kv in await self.etcd.get_prefix(self.layout.registrations):
            info = BookieInfo.decode(kv.value)
            if kv.key.startswith(readonly_prefix) or info.bookie_id not in out:
                out[info.bookie_id] = info
        return out

    async def register_bookie(self, info: BookieInfo, lease_id: int) -> None:
        """Put the bookie in the set its mode says, on its lease, and take it out of the other set."""
        # One transaction: a bookie changing mode is never in both sets, nor in neither.
        await self.etcd.txn(Txn().put(self.layout.bookie(info.bookie_id, info.readonly), info.encode(), lease_id)
                            .delete(self.layout.bookie(info.bookie_id, not info.readonly)))

    async def retire_bookie(self, bookie_id: str) -> str | None:
        """Decommission's last step: the bookie id loses its cookie, its data directory's instance is bound to
        a tombstone (DECOMMISSIONED_PREFIX + the id: that directory can never join again, under any id), and
        its registration goes with its lease. The id itself may be used again with a new, empty directory.
        Returns the retired instance id (None if the bookie had no cookie)."""
        cookie_kv = await self.etcd.get(self.layout.cookie(bookie_id))
        instance_id = Cookie.decode(cookie_kv.value).instance_id if cookie_kv is not None else None
        if cookie_kv is not None and instance_id is not None:
            ok, _ = await self.etcd.txn(Txn().mod_revision_is(self.layout.cookie(bookie_id), cookie_kv.mod_revision)
                                        .delete(self.layout.cookie(bookie_id))
                                        .put(self.layout.instance(instance_id),
                                             (DECOMMISSIONED_PREFIX + bookie_id).encode()))
            if not ok:
                raise MetadataUnavailableError(f"bookie {bookie_id}'s cookie changed while it was being retired")
        for readonly in (False, True):
            kv = await self.etcd.get(self.layout.bookie(bookie_id, readonly))
            if kv is not None and kv.lease:
                await self.etcd.revoke_lease(kv.lease)
            await self.etcd.delete(self.layout.bookie(bookie_id, readonly))
        return instance_id

    async def cookie_holders(self) -> set[str]:
        """The ids of every bookie with a cookie: every bookie that ever joined and was not decommissioned."""
        prefix = self.layout.cookies
        return {kv.key[len(prefix):].decode() for kv in await self.etcd.get_prefix(prefix, keys_only=True)}

    async def read_cookie(self, bookie_id: str) -> Cookie | None:
        kv = await self.etcd.get(self.layout.cookie(bookie_id))
        return Cookie.decode(kv.value) if kv else None

    async def create_cookie(self, cookie: Cookie) -> bool:
        """Create the cookie and its instance key in one transaction; False if either already exists."""
        ok, _ = await self.etcd.txn(
            Txn().mod_revision_is(self.layout.cookie(cookie.bookie_id), 0)
            .mod_revision_is(self.layout.instance(cookie.instance_id), 0)
            .put(self.layout.cookie(cookie.bookie_id), cookie.encode())
            .put(self.layout.instance(cookie.instance_id), cookie.bookie_id.encode()))
        return ok

    async def instance_owner(self, instance_id: str) -> str | None:
        """The bookie id a data directory instance is bound to, None if it is bound to none."""
        kv = await self.etcd.get(self.layout.instance(instance_id))
        return kv.value.decode() if kv else None

    async def bind_instance(self, instance_id: str, bookie_id: str) -> bool:
        """Bind an instance to a bookie id if it is bound to none (cookies written before instance keys
        existed); False if another binding was made first."""
        return await self.etcd.cas_put(self.layout.instance(instance_id), bookie_id.encode(), 0)


async def id_pages(etcd: EtcdClient, prefix: bytes, key_of: Callable[[int], bytes], id_of: Callable[[bytes], int],
                   keys_only: bool = False) -> AsyncIterator[list[KeyValue]]:
    """The keys under `prefix`, named by ids (key_of(id), zero-padded so key order is id order), in id order,
    at most range_page_keys per page, each read from a window of ids (see LEDGER_WINDOW_IDS_MAX), up to the
    largest id when the listing began: keys created after that may not be listed."""
    last = await etcd.last_key(prefix)
    if last is None:
        return
    top = id_of(last)
    page_keys = etcd.range_page_keys
    start, width = 0, page_keys
    while start <= top:
        end = min(start + width, top + 1)
        kvs = await etcd.range_page(key_of(start), key_of(end), page_keys, keys_only)
        if kvs:
            yield kvs
        if len(kvs) >= page_keys:  # cut at the limit: go on after the last key read, in a window as wide as
            last_read = id_of(kvs[-1].key)  # the ids this page spanned
            width = max(page_keys, last_read + 1 - start)
            start = last_read + 1
            continue
        start = end
        if len(kvs) < page_keys // 2:  # a gap in the ids: look further at once
            width = min(width * 2, LEDGER_WINDOW_IDS_MAX)

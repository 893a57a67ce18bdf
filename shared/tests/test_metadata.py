"""Ledger metadata rules (pure) and the metadata store on a real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octavo.cli.localcluster import EtcdProcess
from octavo.client import dataset as dataset_module
from octavo.client.dataset import META_DATASET, DatasetStore
from octavo.meta.errors import MetadataUnavailableError, NoSuchLedgerError
from octavo.meta.etcd import EtcdClient, parse_endpoints
from octavo.meta.keyrange import prefix_end
from octavo.meta.layout import Layout
from octavo.meta.ledger_metadata import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    LedgerMetadata,
    MetadataError,
    password_digest,
    write_set,
)
from octavo.meta.metadata import BookieInfo, Cookie, MetadataStore


def meta(**kw: object) -> LedgerMetadata:
    fields: dict[str, object] = {"ledger_id": 1, "ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2,
                                 "ensembles": ((0, ("a", "b", "c")),), "password_digest": password_digest(b"p")}
    fields.update(kw)
    return LedgerMetadata(**fields)  # type: ignore[arg-type]


@given(st.integers(0, 10**9), st.integers(1, 10), st.data())
def test_write_set_is_qw_distinct_positions_starting_at_e_mod_e(entry: int, ensemble: int, data: st.DataObject) -> None:
    qw = data.draw(st.integers(1, ensemble))
    positions = write_set(entry, ensemble, qw)
    assert len(set(positions)) == qw and positions[0] == entry % ensemble


def test_segments_and_transitions() -> None:
    m = meta()
    m2 = m.with_segment(57, ("a", "d", "c"))
    assert m2.ensemble_at(56) == ("a", "b", "c") and m2.ensemble_at(57) == ("a", "d", "c")
    assert m2.with_segment(57, ("e", "d", "c")).ensembles == ((0, ("a", "b", "c")), (57, ("e", "d", "c")))
    with pytest.raises(MetadataError, match="starts before"):
        m2.with_segment(10, ("a", "b", "d"))
    rec = m2.with_state(IN_RECOVERY)
    with pytest.raises(MetadataError, match="cannot change"):
        rec.with_segment(60, ("a", "b", "d"))
    closed = rec.with_state(CLOSED, last_entry_id=99, length=1000)
    assert closed.closed and closed.last_entry_id == 99
    with pytest.raises(MetadataError, match="not a legal change"):
        closed.with_state(OPEN)
    assert LedgerMetadata.decode(closed.encode()) == closed


@pytest.mark.parametrize(("kw", "text"), [
    ({"ack_quorum": 4}, "ack_quorum"),
    ({"ensembles": ((0, ("a", "a", "b")),)}, "distinct"),
    ({"ensembles": ((1, ("a", "b", "c")),)}, "start at entry 0"),
    ({"state": "WEIRD"}, "unknown ledger state"),
])
def test_invalid_metadata_is_refused(kw: dict[str, object], text: str) -> None:
    with pytest.raises(MetadataError, match=text):
        meta(**kw)


def test_endpoint_parsing() -> None:
    assert parse_endpoints("a:1, http://b:2") == ["a:1", "b:2"]
    for bad in ("", "nohost", "a:b"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)
    assert prefix_end(b"/a/") == b"/a0" and prefix_end(b"a\xff") == b"b"


async def test_ledger_create_read_cas_delete(etcd: EtcdProcess, cluster_name: str) -> None:
    async with EtcdClient(etcd.endpoint) as client:
        store = MetadataStore(client, Layout(cluster_name))
        fields = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2, "ensembles": ((0, ("a", "b", "c")),),
                  "password_digest": password_digest(b"x")}
        created = await asyncio.gather(*(store.create_ledger(**fields) for _ in range(10)))  # type: ignore[arg-type]
        ids = sorted(m.ledger_id for m, _ in created)
        assert ids == list(range(10)), "concurrent creators must get distinct ids"
        m, rev = await store.read_ledger(3)
        new_rev = await store.update_ledger(m.with_state(IN_RECOVERY), rev)
        assert new_rev is not None
        assert await store.update_ledger(m.with_state(CLOSED, last_entry_id=-1, length=0), rev) is None  # stale
        assert (await store.read_ledger(3))[0].state == IN_RECOVERY
        await store.delete_ledger(3)
        with pytest.raises(NoSuchLedgerError):
            await store.read_ledger(3)
        assert await store.list_ledgers() == [0, 1, 2, 4, 5, 6, 7, 8, 9]


async def test_bookie_registration_on_a_lease(etcd: EtcdProcess, cluster_name: str) -> None:
    async with EtcdClient(etcd.endpoint) as client:
        store = MetadataStore(client, Layout(cluster_name))
        lease = await client.grant_lease(2)
        await store.register_bookie(BookieInfo("b1", "127.0.0.1:1"), lease)
        assert (await store.bookies())["b1"].address == "127.0.0.1:1"
        await store.register_bookie(BookieInfo("b1", "127.0.0.1:1", readonly=True), lease)
        assert (await store.bookies())["b1"].readonly
        assert await client.keep_alive_once(lease) > 0
        await client.revoke_lease(lease)
        assert await store.bookies() == {}
        assert await client.keep_alive_once(lease) == 0


async def test_cookie_is_created_once(etcd: EtcdProcess, cluster_name: str) -> None:
    async with EtcdClient(etcd.endpoint) as client:
        store = MetadataStore(client, Layout(cluster_name))
        c = Cookie("b1", "inst-1", "/data", 1)
        assert await store.create_cookie(c)
        assert not await store.create_cookie(Cookie("b1", "inst-2", "/data", 2))
        assert await store.read_cookie("b1") == c


async def test_failover_to_the_next_endpoint_and_clear_error_when_all_are_down(etcd: EtcdProcess) -> None:
    from octavo.cli.localcluster import free_port

    dead = f"127.0.0.1:{free_port()}"
    async with EtcdClient(f"{dead},{etcd.endpoint}", timeout_s=1) as client:
        await client.put(b"/octavo/failover-test", b"1")
        assert client.endpoint == etcd.endpoint
    async with EtcdClient(f"{dead},127.0.0.1:{free_port()}", timeout_s=1) as client:
        with pytest.raises(MetadataUnavailableError, match="etcd unavailable"):
            await client.get(b"/x")


async def test_prefix_reads_come_in_bounded_pages(etcd: EtcdProcess, cluster_name: str) -> None:
    """get_prefix reads at most range_page_keys keys per etcd response and still returns every key, in order:
    a range over the client's message limit would otherwise fail the whole read."""
    async with EtcdClient(etcd.endpoint, range_page_keys=7) as client:
        prefix = f"/t/{cluster_name}/paged/".encode()
        keys = [prefix + b"%03d" % i for i in range(25)]
        for k in keys:
            await client.put(k, b"v" + k[-3:])
        await client.put(prefix_end(prefix), b"outside")  # the first key past the prefix is not read
        got = await client.get_prefix(prefix)
        assert [kv.key for kv in got] == keys and got[3].value == b"v003"
        assert [kv.key for kv in await client.get_prefix(prefix, keys_only=True)] == keys
        assert [kv.key for kv in await client.get_prefix(prefix, limit=10)] == keys[:10]
        assert [kv.key for kv in await client.get_prefix(prefix, limit=7)] == keys[:7]
        store = MetadataStore(client, Layout(cluster_name))
        ids = []
        for _ in range(16):
            created, _ = await store.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1,
                                                   ensembles=((0, ("b",)),), password_digest=password_digest(b""))
            ids.append(created.ledger_id)
        assert await store.list_ledgers() == ids
        assert [m.ledger_id for m in await store.all_ledgers()] == ids
        pages = [[kv.key for kv in page] async for page in client.iter_prefix(prefix)]
        assert [len(p) for p in pages] == [7, 7, 7, 4] and [k for p in pages for k in p] == keys
        assert [m.ledger_id async for m in store.iter_ledgers()] == ids
    with pytest.raises(ValueError, match="range_page_keys"):
        EtcdClient(etcd.endpoint, range_page_keys=0)


async def test_orphan_collection_reads_and_deletes_a_page_at_a_time(etcd: EtcdProcess, cluster_name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Orphan collection walks every ledger's metadata without holding it all: pages of range_page_keys,
    deletions every ORPHANS_DELETED_PER_STEP ids. Only the dataset's unreferenced ledgers go."""
    monkeypatch.setattr(dataset_module, "ORPHANS_DELETED_PER_STEP", 3)
    async with EtcdClient(etcd.endpoint, range_page_keys=4) as client:
        store = MetadataStore(client, Layout(cluster_name))
        pages_read = []

        async def iter_ledgers() -> AsyncIterator[LedgerMetadata]:
            async for page in client.iter_prefix(store.layout.ledgers):
                pages_read.append(len(page))
                for kv in page:
                    yield LedgerMetadata.decode(kv.value)

        pages_when_deleted: list[int] = []

        async def delete(lid: int) -> None:
            pages_when_deleted.append(len(pages_read))
            await store.delete_ledger(lid)

        datasets = DatasetStore(client, store.layout, delete, iter_ledgers)
        mine, other = [], []
        for i in range(14):
            owner = "events" if i % 2 == 0 else "other"
            created, _ = await store.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1,
                                                   ensembles=((0, ("b",)),), password_digest=password_digest(b""),
                                                   custom_metadata={META_DATASET: owner})
            (mine if owner == "events" else other).append(created.ledger_id)
        assert await datasets.has_ledgers("events") and not await datasets.has_ledgers("nothing")
        assert await datasets.collect_orphans("events", grace_s=3600) == []  # all too young
        pages_read.clear()
        deleted = await datasets.collect_orphans("events", grace_s=0)
        assert deleted == mine and await store.list_ledgers() == other
        assert max(pages_read) <= 4
        # Deleted three at a time as the walk goes (pages of ids 0-3, 4-7, 8-11, 12-13), not all at its end.
        assert pages_when_deleted == [2, 2, 2, 3, 3, 3, 4]

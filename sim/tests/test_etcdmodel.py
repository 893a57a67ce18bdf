"""The etcd model behind the real EtcdClient, on the simulated network in virtual time: revisions, CAS
transactions, paging, leases that expire on the virtual clock, watches that replay history, compaction, and an
etcd that is unavailable for a while."""

from __future__ import annotations

import asyncio

import pytest

from octavo.meta.errors import EtcdCompactedError, MetadataUnavailableError
from octavo.meta.etcd import EtcdClient, Txn, WatchPosition
from octavo.sim.world import ETCD_ADDRESS, ETCD_NODE, World


def run(main, seed: int = 1):  # type: ignore[no-untyped-def]
    world = World(seed)
    return world, world.run(lambda: main(world))


def test_revisions_and_cas() -> None:
    async def main(world: World) -> None:
        async with EtcdClient(ETCD_ADDRESS) as etcd:
            assert await etcd.cas_put(b"/a", b"1", 0)
            assert not await etcd.cas_put(b"/a", b"2", 0)  # create-only: it exists
            kv = await etcd.get(b"/a")
            assert kv is not None and kv.value == b"1" and kv.mod_revision == kv.create_revision == 2
            assert await etcd.cas_put(b"/a", b"2", kv.mod_revision)
            assert not await etcd.cas_put(b"/a", b"3", kv.mod_revision)  # stale revision
            kv2 = await etcd.get(b"/a")
            assert kv2 is not None and (kv2.value, kv2.mod_revision, kv2.create_revision) == (b"2", 3, 2)
            ok, resp = await etcd.txn(Txn().mod_revision_is(b"/a", 3).put(b"/b", b"x").delete(b"/a").get(b"/b"))
            assert ok and resp.responses[2].response_range.kvs[0].value == b"x"
            assert await etcd.get(b"/a") is None
            assert await etcd.revision() == 4  # one revision for the whole transaction
            ok, resp = await etcd.txn(Txn().mod_revision_is(b"/b", 1).put(b"/c", b"y").get_on_failure(b"/b"))
            assert not ok and resp.responses[0].response_range.kvs[0].value == b"x"
            assert await etcd.get(b"/c") is None

    run(main)


def test_prefix_pages_in_key_order() -> None:
    async def main(world: World) -> None:
        async with EtcdClient(ETCD_ADDRESS, range_page_keys=3) as etcd:
            for i in reversed(range(10)):
                await etcd.put(b"/p/%02d" % i, b"v")
            await etcd.put(b"/q", b"outside")
            keys = [kv.key for kv in await etcd.get_prefix(b"/p/")]
            assert keys == [b"/p/%02d" % i for i in range(10)]
            assert await etcd.last_key(b"/p/") == b"/p/09"
            assert len(await etcd.get_prefix(b"/p/", limit=4)) == 4

    run(main)


def test_lease_expires_on_the_virtual_clock_and_takes_its_keys() -> None:
    async def main(world: World) -> None:
        async with EtcdClient(ETCD_ADDRESS) as etcd:
            lease = await etcd.grant_lease(5)
            await etcd.put(b"/reg", b"me", lease)
            await asyncio.sleep(4)
            assert await etcd.keep_alive_once(lease) == 5
            await asyncio.sleep(4.5)
            assert await etcd.get(b"/reg") is not None  # kept alive 4.5 s ago
            await asyncio.sleep(1)
            assert await etcd.get(b"/reg") is None
            assert await etcd.keep_alive_once(lease) == 0
            assert world.clock.now_s >= 9.5

    run(main)


def test_watch_replays_deletes_from_a_position_and_refuses_compacted_history() -> None:
    async def main(world: World) -> None:
        async with EtcdClient(ETCD_ADDRESS) as etcd:
            for k in (b"/w/1", b"/w/2", b"/w/3"):
                await etcd.put(k, b"v")
            position = WatchPosition(await etcd.revision())
            await etcd.delete(b"/w/1")
            await etcd.delete(b"/w/2")
            seen: list[bytes] = []

            async def watch() -> None:
                async for keys in etcd.watch_deletes(b"/w/", position):
                    seen.extend(keys)
                    if len(seen) == 3:
                        return

            task = asyncio.ensure_future(watch())
            await asyncio.sleep(0.1)
            await etcd.delete(b"/w/3")
            await asyncio.wait_for(task, 5)
            assert seen == [b"/w/1", b"/w/2", b"/w/3"]
            assert await etcd.compact(await etcd.revision())
            with pytest.raises(EtcdCompactedError):
                async for _ in etcd.watch_deletes(b"/w/", WatchPosition(1)):
                    pass

    run(main)


def test_unavailable_etcd_times_out_then_serves_again() -> None:
    async def main(world: World) -> None:
        async with EtcdClient(ETCD_ADDRESS, timeout_s=2.0) as etcd:
            await etcd.put(b"/k", b"v")
            world.network.down(ETCD_NODE, "unavailable")
            t0 = world.clock.now_s
            with pytest.raises(MetadataUnavailableError):
                await etcd.get(b"/k")
            assert world.clock.now_s - t0 == pytest.approx(2.0, abs=0.1)
            world.loop.call_later(1.0, world.network.up, ETCD_NODE)
            kv = await etcd.get(b"/k")  # waits for etcd, as a gRPC call with wait_for_ready does
            assert kv is not None and kv.value == b"v"

    run(main)


def test_a_range_answered_as_bytes_is_the_range_message_serialized() -> None:
    """The Range method's answer is built from each key's cached KeyValue bytes (EtcdModel.range_encoded): it must
    parse to what range() answers, for every shape of request, and follow a put, a delete and a lease."""
    from aetcd import rpc

    from octavo.sim.etcdmodel import EtcdModel

    model = EtcdModel(lambda: 0.0)
    for i in range(7):
        model.put(rpc.PutRequest(key=b"/r/%d" % i, value=b"v%d" % i * (40 * i)))
    requests = [rpc.RangeRequest(key=b"/r/", range_end=b"/r0"), rpc.RangeRequest(key=b"/r/3"),
                rpc.RangeRequest(key=b"/r/", range_end=b"/r0", limit=3),
                rpc.RangeRequest(key=b"/r/", range_end=b"/r0", keys_only=True),
                rpc.RangeRequest(key=b"/r/", range_end=b"/r0", count_only=True),
                rpc.RangeRequest(key=b"/r/", range_end=b"/r0", sort_order=rpc.RangeRequest.DESCEND, limit=2),
                rpc.RangeRequest(key=b"/none"), rpc.RangeRequest(key=b"\0", range_end=b"\0")]
    for step in range(3):
        for request in requests:
            assert rpc.RangeResponse.FromString(model.range_encoded(request)) == model.range(request), request
        # What the cache holds must follow the keys: a new value, a deleted key.
        model.put(rpc.PutRequest(key=b"/r/%d" % step, value=b"changed %d" % step))
        model.delete_range(rpc.DeleteRangeRequest(key=b"/r/%d" % (6 - step)))
    assert rpc.RangeResponse.FromString(model.range_encoded(requests[1])).kvs[0].version == 1
    assert rpc.RangeResponse.FromString(model.range_encoded(requests[0])).kvs[0].value == b"changed 0"


def test_only_expired_leases_go_whatever_order_they_were_kept_alive_in() -> None:
    """expire_due looks at the leases only once one may be due (a lower bound on their expiry times): a lease
    kept alive past the bound stays, one granted later with a shorter TTL still expires on time."""
    async def main(world: World) -> None:
        async with EtcdClient(ETCD_ADDRESS) as etcd:
            long_lived = await etcd.grant_lease(4)
            await etcd.put(b"/long", b"1", long_lived)
            await asyncio.sleep(3)
            assert await etcd.keep_alive_once(long_lived) == 4  # now due at 7
            short = await etcd.grant_lease(1)  # due at 4
            await etcd.put(b"/short", b"1", short)
            await asyncio.sleep(1.5)
            assert await etcd.get(b"/short") is None and await etcd.get(b"/long") is not None
            await asyncio.sleep(3)
            assert await etcd.get(b"/long") is None
            again = await etcd.grant_lease(100)
            await etcd.put(b"/again", b"1", again)
            world.etcd.expire_all()
            assert await etcd.get(b"/again") is None

    run(main)


def test_a_watch_gets_each_revision_in_one_response_with_the_changes_themselves() -> None:
    """As etcd does: a transaction's events, and a lease's keys taken at its expiry, come in one response (the
    client's registrations view applies a response whole: a bookie changing mode is one change of it); a put
    carries its value and revision, a delete its key and the delete's revision; puts of a watch that filters
    them are not sent; and a prefix read says the revision it was read at."""
    from octavo.meta.etcdwatch import WatchEvent
    from octavo.meta.keyrange import WatchRange

    async def main(world: World) -> None:
        async with EtcdClient(ETCD_ADDRESS) as etcd:
            await etcd.put(b"/m/writable/b1", b"w")
            responses: list[list[WatchEvent]] = []
            deletes: list[list[bytes]] = []

            async def watch() -> None:
                async for events in etcd.watch_events([WatchRange.prefix(b"/m/")]):
                    responses.append(events)

            async def watch_deletes() -> None:
                async for keys in etcd.watch_changes([WatchRange.prefix(b"/m/", puts=False)]):
                    deletes.append(keys)

            tasks = [asyncio.ensure_future(watch()), asyncio.ensure_future(watch_deletes())]
            await asyncio.sleep(0.1)
            assert responses == [[]] and deletes == [[]]  # created
            await etcd.txn(Txn().put(b"/m/readonly/b1", b"r").delete(b"/m/writable/b1"))
            mode_change = await etcd.revision()
            lease = await etcd.grant_lease(1)
            await etcd.put(b"/m/writable/b2", b"2", lease)
            await etcd.put(b"/m/writable/b3", b"3", lease)
            await asyncio.sleep(2)  # the lease expires: both keys go at one revision
            expiry = await etcd.revision()
            assert responses[1:] == [
                [WatchEvent(b"/m/readonly/b1", b"r", mode_change, False),
                 WatchEvent(b"/m/writable/b1", b"", mode_change, True)],
                [WatchEvent(b"/m/writable/b2", b"2", mode_change + 1, False)],
                [WatchEvent(b"/m/writable/b3", b"3", mode_change + 2, False)],
                [WatchEvent(b"/m/writable/b2", b"", expiry, True), WatchEvent(b"/m/writable/b3", b"", expiry, True)]]
            assert deletes[1:] == [[b"/m/writable/b1"], [b"/m/writable/b2", b"/m/writable/b3"]]
            position = WatchPosition()
            assert [kv.key for kv in await etcd.get_prefix(b"/m/", position=position)] == [b"/m/readonly/b1"]
            assert position.revision == expiry
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    run(main)

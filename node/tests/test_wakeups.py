"""When the self-healing loops pass again (node/octavo/node/wakeups.py), on the loop's own clock: a change wakes a
loop even during its first pass, nothing changing keeps it asleep until its due time or the idle interval, and
a watch that is down or not trusted makes it tick."""

from __future__ import annotations

import asyncio
import time

import pytest

from octavo.cli.localcluster import EtcdProcess
from octavo.meta.etcd import EtcdClient
from octavo.meta.keyrange import WatchRange
from octavo.node.wakeups import Wakeups

TICK_S = 0.01
IDLE_S = 30.0  # far beyond every wait below: a loop that sleeps this long fails the test


def watching(trusted: bool = True) -> Wakeups:
    w = Wakeups(TICK_S, IDLE_S, lambda: trusted, trust_check_s=IDLE_S)
    w.watching = True
    return w


async def test_a_change_during_a_loops_first_pass_wakes_it() -> None:
    """Found in review: the loops' events were made in their first sleep, so a change (or the watch coming up)
    during the first pass set nothing, and the loop slept the whole idle interval."""
    w = watching()
    w.register("auditor")
    began = time.monotonic()
    w.wake_all()  # while the first pass runs
    await asyncio.wait_for(w.sleep("auditor", began), 5)


async def test_without_a_change_a_loop_sleeps_until_its_due_time() -> None:
    w = watching()
    w.register("worker")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(w.sleep("worker", time.monotonic()), 0.3)
    began = time.monotonic()
    await asyncio.wait_for(w.sleep("worker", began, due=began + 0.05), 5)
    assert time.monotonic() - began >= 0.05


async def test_a_change_wakes_a_sleeping_loop_once() -> None:
    w = watching()
    w.register("worker")
    sleeping = asyncio.ensure_future(w.sleep("worker", time.monotonic()))
    await asyncio.sleep(0.05)
    assert not sleeping.done()
    w.wake_all()
    await asyncio.wait_for(sleeping, 5)
    with pytest.raises(TimeoutError):  # the change was used up by that pass
        await asyncio.wait_for(w.sleep("worker", time.monotonic()), 0.3)


async def test_a_loop_with_a_filter_wakes_only_for_the_keys_it_wants() -> None:
    """The auditor's pass on a bookie that is not the auditor only tries the election: it wants the auditor key's
    delete, not every registration or lock that changes (autorecovery.py)."""
    w = watching()
    w.register("auditor", lambda key: key == b"/auditor")
    w.register("worker")
    auditor = asyncio.ensure_future(w.sleep("auditor", time.monotonic()))
    worker = asyncio.ensure_future(w.sleep("worker", time.monotonic()))
    w.wake_for([b"/bookies/writable/b1", b"/locks/7"])
    await asyncio.wait_for(worker, 5)
    await asyncio.sleep(0.1)
    assert not auditor.done()
    w.wake_for([b"/locks/8", b"/auditor"])
    await asyncio.wait_for(auditor, 5)
    began = time.monotonic()
    w.wake_all()  # the watch established again: every loop passes
    await asyncio.wait_for(w.sleep("auditor", began), 5)


@pytest.mark.parametrize("how", ["watch down", "not trusted"])
async def test_a_loop_ticks_while_its_watch_is_down_or_not_trusted(how: str) -> None:
    w = watching(trusted=how != "not trusted")
    if how == "watch down":
        w.watching = False
    w.register("restore")
    for _ in range(3):
        await asyncio.wait_for(w.sleep("restore", time.monotonic()), 5)


async def test_a_watch_established_again_counts_as_a_change(etcd: EtcdProcess) -> None:
    """What changed while the watch was down is not replayed: its establishment counts as a change, so what the
    loops keep only until the next change (the auditor's marks count) is read afresh, not an idle interval late."""
    w = Wakeups(TICK_S, IDLE_S)
    async with EtcdClient(etcd.endpoint) as client:
        task = asyncio.create_task(w.watch(client, [WatchRange.prefix(b"/wakeups-test/")]))
        try:
            deadline = time.monotonic() + 10
            while not w.watching:
                assert time.monotonic() < deadline, "the watch was never established"
                await asyncio.sleep(0.01)
            assert w.changes_seen == 1
            await client.put(b"/wakeups-test/a", b"1")
            while w.changes_seen < 2:
                assert time.monotonic() < deadline, "the change was never seen"
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

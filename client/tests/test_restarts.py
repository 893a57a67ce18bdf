"""Writers that ride out bookie restarts (issue 19), on a real local cluster whose bookies keep their ports
across restarts, as they do behind a Kubernetes Service or a fixed host port."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from octavo.cli.clustertesting import FAILOVER, PASSWORD, read_all, revive
from octavo.cli.localcluster import LocalCluster, free_port
from octavo.client import BookieUnavailableError, Client, NotEnoughBookiesError

FAST = FAILOVER
log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    ports = {f"bookie-{i}": free_port() for i in range(4)}
    with LocalCluster(str(tmp_path_factory.mktemp("restarts")), bookies=4, bookie_ports=ports) as c:
        yield c


@pytest.fixture(autouse=True)
def all_bookies_up(cluster: LocalCluster) -> Iterator[None]:
    yield
    revive(cluster)


def another_loops_completion(context: dict[str, Any]) -> bool:
    """gRPC's poller (one per process, its completions read by whichever event loop runs) failing to hand a
    completion to its call's loop because that loop is closed: a call of an earlier test that ended as that
    test's loop closed (CI saw one in this test). This loop is running, so it is none of this test's calls."""
    error = context.get("exception")
    return isinstance(error, RuntimeError) and str(error) == "Event loop is closed" and \
        "PollerCompletionQueue._handle_events" in str(context.get("message"))


@pytest.fixture
async def task_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What the test's event loop reports about tasks that ended with an exception nobody retrieved (it
    reports them when the task is collected): the test fails if anything is left here. An earlier loop's
    late gRPC completion is logged, not counted (another_loops_completion)."""
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handle(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if another_loops_completion(context):
            log.warning("an earlier event loop's gRPC completion arrived after that loop closed: %s", context)
        else:
            errors.append(context)

    loop.set_exception_handler(handle)
    yield errors
    gc.collect()
    loop.set_exception_handler(previous)


def data(ledger: int, entry: int) -> bytes:
    return f"ledger {ledger} entry {entry} ".encode() * 8


async def wait_registered_again(client: Client, bookie_id: str, started_before: int, timeout_s: float = 20) -> float:
    """Wait until etcd shows `bookie_id` registered by a process started after `started_before`; returns when
    (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = (await client.bookies(refresh=True)).get(bookie_id)
        if info is not None and info.started_unix_ms > started_before:
            return time.monotonic()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{bookie_id} did not register again within {timeout_s}s")


async def test_a_close_racing_an_ensemble_change_is_ordered_and_leaves_no_task_exception(
        cluster: LocalCluster, task_errors: list[dict[str, Any]]) -> None:
    """The issue's reproducer: a bookie stops answering, then dies while the ack quorum has everything; the
    close runs while the ensemble change is in flight. It closes on top of the change (or the change sees
    the close and stops), the ledger is right, and no background task ends with an exception."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        for _ in range(3):
            writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
            ledger = writer.ledger_id
            assert await writer.append_many([data(ledger, i) for i in range(10)]) == list(range(10))
            victim = writer.metadata.last_ensemble[0]
            proc = cluster.bookies[victim].proc
            assert proc is not None
            os.kill(proc.pid, signal.SIGSTOP)
            assert await writer.append_many([data(ledger, i) for i in range(10, 20)]) == list(range(10, 20))
            cluster.bookies[victim].kill()
            deadline = time.monotonic() + 10
            while not writer.changing_ensemble:
                assert time.monotonic() < deadline, "the killed bookie never started an ensemble change"
                await asyncio.sleep(0.001)
            await writer.close()
            meta = await client.ledger_metadata(ledger)
            assert meta.state == "CLOSED" and meta.last_entry_id == 19
            assert await read_all(client, ledger) == [data(ledger, i) for i in range(20)]
            await asyncio.sleep(0.3)  # let a change that saw the close finish
            assert not writer.changing_ensemble
            cluster.bookies[victim].start()
    gc.collect()
    await asyncio.sleep(0)
    assert not task_errors, task_errors


async def test_a_closed_client_has_closed_every_connection_and_opens_none(cluster: LocalCluster) -> None:
    """What close() opened is closed when it returns; an ensemble change racing the close that asks for a
    connection afterwards gets none (nothing would close it: its gRPC channel would outlive the event loop, and
    its completions would fail in the next loop gRPC serves with 'Event loop is closed')."""
    client = Client(cluster.etcd_endpoint, options=FAST)
    bookie_id = sorted(await client.bookies())[0]
    connection = client.bookie_client(bookie_id)
    assert connection.connectivity(try_to_connect=True) != grpc.ChannelConnectivity.SHUTDOWN
    await client.close()
    assert connection.connectivity() == grpc.ChannelConnectivity.SHUTDOWN
    with pytest.raises(BookieUnavailableError, match="the client is closed"):
        client.bookie_client(bookie_id)


async def test_a_call_on_a_connection_closed_under_it_fails_as_unavailable_not_as_cancelled(
        cluster: LocalCluster) -> None:
    """The client replaces the connection of a bookie that restarted (Client._replace_connection closes the old
    one): a read still in flight on it must fail as BookieUnavailableError, which callers fail over on, not with
    the CancelledError grpc raises for a call whose channel closed (a caller would take it for its own task
    cancelled; CI saw test_bitrot's read end so). A read whose own task is cancelled stays cancelled."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        assert await writer.append_many([data(writer.ledger_id, i) for i in range(3)]) == [0, 1, 2]
        bookie_id = writer.metadata.last_ensemble[0]
        connection = client.bookie_client(bookie_id)

        def long_poll() -> asyncio.Task[Any]:  # past the last entry, nothing written meanwhile: held for 5 s
            return asyncio.create_task(connection.read_tail(writer.ledger_id, 2, 5_000, 10, timeout_s=10))

        cancelled = long_poll()
        await asyncio.sleep(0.3)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        cut = long_poll()
        await asyncio.sleep(0.3)
        assert not cut.done()
        await connection.close()
        with pytest.raises(BookieUnavailableError, match="closed under the call"):
            await cut
        await writer.close()


async def test_a_bookie_restarted_on_its_port_is_used_again_at_once(cluster: LocalCluster) -> None:
    """A bookie of an idle writer's ensemble is killed and restarted on the same port. The writer's next
    appends, made the moment etcd shows the bookie back, are acknowledged by it within a second, and the
    restart causes no ensemble change."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 3, password=PASSWORD)  # Qa = Qw: every bookie must answer
        ledger = writer.ledger_id
        assert await writer.append_many([data(ledger, i) for i in range(10)]) == list(range(10))
        victim = writer.metadata.last_ensemble[1]
        started_before = int(time.time() * 1000)
        cluster.bookies[victim].kill()
        await asyncio.sleep(0.5)  # the client's connection to it fails and starts backing off
        cluster.bookies[victim].start()
        back = await wait_registered_again(client, victim, started_before)
        assert await asyncio.wait_for(writer.append_many([data(ledger, i) for i in range(10, 20)]),
                                      timeout=10) == list(range(10, 20))
        took = time.monotonic() - back
        assert writer.ensemble_changes == 0, "the restart alone changed the ensemble"
        assert victim in writer.metadata.last_ensemble
        assert took < 1.0, f"the restarted bookie acknowledged only {took:.2f}s after it registered"
        await writer.close()
        assert await read_all(client, ledger) == [data(ledger, i) for i in range(20)]


async def test_a_long_lived_handle_survives_more_failures_than_there_are_spare_bookies(cluster: LocalCluster) -> None:
    """4 bookies, E = 3: one spare. Three bookies of the ensemble fail in turn, each restarted after its
    failure. With a quarantine of 1 s the restarted ones become candidates again, so the handle goes on
    (before, it never reused a bookie that failed it and died at the second failure)."""
    options = replace(FAST, bookie_quarantine_s=1.0)
    async with Client(cluster.etcd_endpoint, options=options) as client:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        ledger = writer.ledger_id
        next_id = 0
        victims = []
        for _ in range(3):
            victim = next(b for b in writer.metadata.last_ensemble if b not in victims[-1:])
            victims.append(victim)
            batch = [data(ledger, i) for i in range(next_id, next_id + 200)]
            pending = asyncio.ensure_future(writer.append_many(batch))
            started_before = int(time.time() * 1000)
            cluster.bookies[victim].kill()
            assert await asyncio.wait_for(pending, timeout=30) == list(range(next_id, next_id + 200))
            next_id += 200
            assert victim not in writer.metadata.last_ensemble
            cluster.bookies[victim].start()
            await wait_registered_again(client, victim, started_before)
            await asyncio.sleep(1.2)  # past the quarantine
        assert writer.ensemble_changes == 3
        # Three failures with one spare: bookies that failed this handle are back in its ensemble.
        assert any(v in writer.metadata.last_ensemble for v in victims)
        await writer.close()
        assert await read_all(client, ledger) == [data(ledger, i) for i in range(next_id)]


async def test_a_whole_ensemble_gone_and_back_within_the_wait_loses_no_append(cluster: LocalCluster) -> None:
    """Every bookie of the ensemble dies (one spare left); they come back 2 s later. The ensemble changes
    wait for them (ensemble_change_wait_s) instead of failing the ledger, take them back even though they
    failed it (no other bookie is usable), and every append is acknowledged."""
    async with Client(cluster.etcd_endpoint, options=replace(FAST, ensemble_change_wait_s=15.0)) as client:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        ledger = writer.ledger_id
        assert await writer.append_many([data(ledger, i) for i in range(50)]) == list(range(50))
        victims = list(writer.metadata.last_ensemble)
        pending = asyncio.ensure_future(writer.append_many([data(ledger, i) for i in range(50, 300)]))
        for victim in victims:
            cluster.bookies[victim].kill()
        await asyncio.sleep(2.0)
        for victim in victims:
            cluster.bookies[victim].start()
        assert await asyncio.wait_for(pending, timeout=40) == list(range(50, 300))
        assert writer.ensemble_changes == 3
        await writer.close()
        assert await read_all(client, ledger) == [data(ledger, i) for i in range(300)]


async def test_without_the_wait_a_gone_ensemble_fails_at_once_and_says_why(cluster: LocalCluster) -> None:
    """ensemble_change_wait_s = 0 keeps the old behaviour for those who want it: no usable bookie, the handle
    fails at once, and the message names the failed bookie's error and every other bookie's reason."""
    async with Client(cluster.etcd_endpoint, options=replace(FAST, ensemble_change_wait_s=0.0)) as client:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        ledger = writer.ledger_id
        await writer.append(data(ledger, 0))
        victims = list(writer.metadata.last_ensemble)
        for victim in victims:
            cluster.bookies[victim].kill()
        with pytest.raises(NotEnoughBookiesError) as failed:
            for i in range(1, 100):
                await asyncio.wait_for(writer.append(data(ledger, i)), timeout=20)
        message = str(failed.value)
        assert "no bookie can replace" in message and "which failed (" in message
        assert "quarantined for bookie_quarantine_s=60" in message or "is already in the ensemble" in message

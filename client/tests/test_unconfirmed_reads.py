"""Reads of an open ledger stop at its LAC; past it only with unconfirmed=True, and this is why: on real bookie
and etcd processes, a writer that crashes in the middle of an ensemble change (the client fault point after the
segment's CAS, SIGKILL in a writer process) leaves entries on the bookie it replaced that the closed ledger
will not contain. The default read never returns one; the unconfirmed read does, and the recovery open then
closes the ledger before it.

The ledger has E = Qw = Qa = 1: with Qa >= 2 one lost bookie leaves another holder of each such entry in the
new segment, and recovery keeps it. The bookie is "lost" to the writer alone: a proxy in front of it (its
advertised address) stops passing its answers back on the writer's connection, so the adds reach it and are
stored, the writer never learns they were, its adds time out and it replaces the bookie.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.clustertesting import wait_until
from octavo.cli.localcluster import LocalCluster, free_port
from octavo.client import Client, ClientOptions, ReadError
from octavo.client.faults import CLIENT_FAULT_POINTS_ENV, ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS, parse
from octavo.node.testing import BookieConnection, BookieProcess

PW = b"pw"
READER = ClientOptions(read_timeout_s=3.0, metadata_timeout_s=2.0, bookie_list_ttl_s=0.2,
                       speculative_read_delay_s=0.1)
CONFIRMED = 5   # entries 0..4: acknowledged, their LAC on the bookie
IN_FLIGHT = 5   # entries 5..9: stored on the bookie, never acknowledged
WAIT_S = 30.0

WRITER = r"""
import asyncio, sys
from octavo.client import Client, ClientOptions

async def main(etcd: str, confirmed: int, in_flight: int) -> None:
    options = ClientOptions(add_timeout_s=2.0, ensemble_change_wait_s=120.0, bookie_list_ttl_s=0.2,
                            metadata_timeout_s=2.0)
    async with Client(etcd, options=options) as client:
        writer = await client.create_ledger(1, 1, 1, password=b"pw")
        await writer.append_many([b"entry %d" % i for i in range(confirmed)])
        print(writer.ledger_id, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        pending = [writer.append_nowait(b"entry %d" % i) for i in range(confirmed, confirmed + in_flight)]
        print("sent", flush=True)
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.sleep(3600)  # the fault point ends this process

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


class AnswerDroppingProxy:
    """A TCP proxy in front of one bookie, in a thread of its own. drop_answers() stops passing the bookie's
    bytes back on every connection open at that moment (what the clients send still reaches the bookie);
    connections opened later pass both ways."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)
        self._connections: list[dict[str, bool]] = []
        self._server: asyncio.AbstractServer | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    def drop_answers(self) -> int:
        """Drop the bookie's answers on the connections open now; returns how many there are."""
        async def drop() -> int:
            for connection in self._connections:
                connection["drop"] = True
            return len(self._connections)
        return asyncio.run_coroutine_threadsafe(drop(), self._loop).result(10)

    def stop(self) -> None:
        """Stop listening, end every connection's tasks (cancelled and awaited: none is left pending, nor a
        `_pipe` coroutine never started), then stop and close the proxy's loop."""
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the proxy's loop did not stop"
        self._loop.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            bookie_r, bookie_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        connection = {"drop": False}
        self._connections.append(connection)
        await asyncio.gather(self._pipe(client_r, bookie_w, None), self._pipe(bookie_r, client_w, connection),
                             return_exceptions=True)
        self._connections.remove(connection)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, connection: dict[str, bool] | None) -> None:
        try:
            while data := await src.read(1 << 16):
                if connection is not None and connection["drop"]:
                    continue
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path / "cluster"), bookies=0) as c:
        yield c


def bookie(cluster: LocalCluster, bookie_id: str, extra: list[str] | None = None,
           port: int = 0) -> BookieProcess:
    process = BookieProcess(os.path.join(cluster.root, bookie_id), args=[*cluster._args(bookie_id), *(extra or [])],
                            port=port)
    cluster.bookies[bookie_id] = process
    return process


async def test_fault_points_parse() -> None:
    assert parse("") == {}
    assert parse(f"{ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS}@3") == {ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS: 3}
    with pytest.raises(ValueError, match="unknown client fault point"):
        parse("flush.after_log_sync")
    with pytest.raises(ValueError, match=">= 1"):
        parse(f"{ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS}@0")


async def test_default_read_never_returns_an_entry_recovery_drops(cluster: LocalCluster) -> None:
    bookie_port = free_port()
    proxy = AnswerDroppingProxy(bookie_port)
    proxy.start()
    first = bookie(cluster, "bookie-0", ["--advertised-address", proxy.address], port=bookie_port)
    first.start()
    writer = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WRITER, cluster.etcd_endpoint, str(CONFIRMED), str(IN_FLIGHT),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, CLIENT_FAULT_POINTS_ENV: ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS})
    assert writer.stdin is not None and writer.stdout is not None
    try:
        ledger_id = int(await asyncio.wait_for(writer.stdout.readline(), WAIT_S))
        with BookieConnection(f"127.0.0.1:{bookie_port}") as direct:  # past the proxy
            # The writer is idle: its LAC-only add tells the bookie every entry so far is acknowledged.
            wait_until("the bookie's LAC", lambda: direct.read_lac(ledger_id).last_add_confirmed == CONFIRMED - 1)
            assert proxy.drop_answers() >= 1  # the writer's connection: the bookie is lost to it alone
            writer.stdin.write(b"go\n")
            await writer.stdin.drain()
            assert await asyncio.wait_for(writer.stdout.readline(), WAIT_S) == b"sent\n"
            last_sent = CONFIRMED + IN_FLIGHT - 1
            wait_until("the unacknowledged adds on the bookie",
                       lambda: direct.read_lac(ledger_id).last_entry_id == last_sent)
            assert direct.read_lac(ledger_id).last_add_confirmed == CONFIRMED - 1

        # A reader without recovery, while the writer's adds time out and its ensemble change waits for a
        # bookie to replace the one it lost.
        async with Client(cluster.etcd_endpoint, options=READER) as client:
            reader = await client.open_ledger(ledger_id, password=PW, recovery=False)
            assert reader.last_entry_id == CONFIRMED - 1
            assert await reader.read_last_add_confirmed() == CONFIRMED - 1
            assert await client.read_last_add_confirmed(ledger_id) == CONFIRMED - 1
            default_read = [e.entry_id async for e in reader.read(0, reader.last_entry_id)]
            with pytest.raises(ReadError, match="unconfirmed=True"):
                _ = [e async for e in reader.read(0, last_sent)]
            past_lac = re.escape("past the last readable entry 4 (the open ledger's last-add-confirmed")
            with pytest.raises(ReadError, match=past_lac):
                await reader.read_entries([last_sent])
            # The opt-in sees what the bookie holds past the LAC: what a default read returned before.
            unconfirmed_last = await reader.read_unconfirmed_last_entry()
            assert unconfirmed_last == last_sent
            assert await client.read_unconfirmed_last_entry(ledger_id) == last_sent
            unconfirmed_read = [(e.entry_id, e.data) async for e in reader.read(0, last_sent, unconfirmed=True)]
            assert unconfirmed_read == [(i, b"entry %d" % i) for i in range(last_sent + 1)]
            assert reader.last_entry_id == CONFIRMED - 1  # the opt-in changes nothing the handle remembers

            # A bookie to replace the lost one: the writer's change puts the new segment in etcd, and the
            # writer dies at the fault point before the resend reaches the replacement.
            bookie(cluster, "bookie-1").start()
            assert await asyncio.wait_for(writer.wait(), WAIT_S) == -signal.SIGKILL
            meta = await client.ledger_metadata(ledger_id)
            assert [(start, list(b)) for start, b in meta.ensembles] == [(0, ["bookie-0"]), (CONFIRMED, ["bookie-1"])]

            # The same reader, asked again, still stops at the LAC.
            assert await reader.read_last_add_confirmed() == CONFIRMED - 1

            recovered = await client.open_ledger(ledger_id, password=PW)
            assert recovered.metadata.closed
            recovered_last = recovered.last_entry_id
        assert recovered_last == CONFIRMED - 1  # the replacement denies entry 5: the ledger ends before it
        assert max(default_read) <= recovered_last
        assert unconfirmed_last > recovered_last  # the opt-in did hand out entries the closed ledger lacks
    finally:
        if writer.returncode is None:
            writer.kill()
            await writer.wait()
        proxy.stop()

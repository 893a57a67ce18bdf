"""`octavo bookie decommission`: a live bookie's copies move elsewhere under write load, then its identity is
retired (issue 10, part 3). Real etcd and bookie processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from octavo.cli.clustertesting import FAILOVER, PASSWORD, entry_data, naming, octavo, read_all
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client
from octavo.client.replication import Replicator, decommission_bookie

# `octavo` with SIGINT handled as a terminal delivers it, even when the suite runs in a background job of a
# non-interactive shell, which ignores SIGINT for its children (Python then installs no KeyboardInterrupt handler).
OCTAVO_WITH_CTRL_C = [sys.executable, "-c", "import runpy, signal, sys; "
                      "signal.signal(signal.SIGINT, signal.default_int_handler); sys.argv[0] = 'octavo'; "
                      "runpy.run_module('octavo.cli.main', run_name='__main__')"]
FAST = replace(FAILOVER, ensemble_change_wait_s=5.0)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path / "c"), bookies=4) as c:
        yield c


def decommission(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return octavo(cluster, "bookie", "decommission", *args)


async def fill_closed(client: Client, victim: str, times: int, *, naming_victim: int) -> dict[int, list[bytes]]:
    """Closed E2 ledgers on four bookies until at least `naming_victim` of them name the victim (placement is
    random: a fixed count of ledgers may all miss it)."""
    closed: dict[int, list[bytes]] = {}
    while len(set(closed) & set(await naming(client, victim))) < naming_victim:
        assert len(closed) < 40, "placement never chose the victim"
        w = await client.create_ledger(2, 2, 2, password=PASSWORD)
        entries = [entry_data(w.ledger_id, i) * times for i in range(300 if times == 1 else 1000)]
        await w.append_many(entries)
        await w.close()
        closed[w.ledger_id] = entries
    return closed


async def test_decommission_under_write_load_loses_nothing_and_fails_no_write(cluster: LocalCluster) -> None:
    victim = "bookie-1"
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        closed = await fill_closed(client, victim, 1, naming_victim=3)
        writers = [await client.create_ledger(2, 2, 2, password=PASSWORD) for _ in range(3)]
        while not any(victim in w.metadata.last_ensemble for w in writers):
            assert len(writers) < 20, "placement never chose the victim"
            writers.append(await client.create_ledger(2, 2, 2, password=PASSWORD))
        written: dict[int, int] = {w.ledger_id: 0 for w in writers}
        stop = False

        async def write(w: object) -> None:
            while not stop:
                n = written[w.ledger_id]  # type: ignore[attr-defined]
                await w.append_many([entry_data(w.ledger_id, i) for i in range(n, n + 50)])  # type: ignore[attr-defined]
                written[w.ledger_id] = n + 50  # type: ignore[attr-defined]
                await asyncio.sleep(0.01)

        load = [asyncio.ensure_future(write(w)) for w in writers]
        await asyncio.sleep(0.5)
        dry = await asyncio.get_running_loop().run_in_executor(None, decommission, cluster, victim, "--dry-run",
                                                               "--json")
        assert dry.returncode == 0, dry.stderr
        assert sorted(json.loads(dry.stdout)["ledgers"]) == sorted(await naming(client, victim))
        assert victim in await client.writable_bookies(), "a dry run changed the bookie's mode"

        run = await asyncio.get_running_loop().run_in_executor(None, decommission, cluster, victim, "--json",
                                                               "--wait-s", "60")
        stop = True
        await asyncio.gather(*load)  # no write failed: an exception here fails the test
        assert run.returncode == 0, run.stderr
        out = json.loads(run.stdout)
        assert out["retired"] and out["lost"] == []
        assert await naming(client, victim) == []
        assert await client.metadata_store.read_cookie(victim) is None
        for lid, entries in closed.items():
            assert await read_all(client, lid) == entries
        for w in writers:
            await w.close()
            expected = [entry_data(w.ledger_id, i) for i in range(written[w.ledger_id])]
            assert await read_all(client, w.ledger_id) == expected

        # Its process drops out of the cluster for good, and its data directory cannot rejoin.
        deadline = time.monotonic() + 15
        while victim in await client.bookies(refresh=True):
            assert time.monotonic() < deadline, "the decommissioned bookie is still registered"
            await asyncio.sleep(0.2)
        cluster.bookies[victim].kill()
        with pytest.raises(RuntimeError, match="exited"):
            cluster.bookies[victim].start()
        assert "was decommissioned" in cluster.bookies[victim].log_tail()


async def test_an_interrupted_decommission_resumes(cluster: LocalCluster) -> None:
    victim = "bookie-2"
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        closed = await fill_closed(client, victim, 10, naming_victim=3)
        # Forced read-only and stopped part way (a slow copy, cancelled as a killed CLI would be).
        slow = asyncio.ensure_future(decommission_bookie(client, victim, Replicator(client, 200_000), wait_s=60))
        await asyncio.sleep(1.5)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert await naming(client, victim), "finished before the interruption: the test would prove nothing"
        run = decommission(cluster, victim, "--json")
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["retired"]
        assert await naming(client, victim) == []
        for lid, entries in closed.items():
            assert await read_all(client, lid) == entries


async def test_decommission_refusals_say_why(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        w = await client.create_ledger(3, 3, 2, password=PASSWORD)
        await w.append_many([entry_data(w.ledger_id, i) for i in range(10)])
        await w.close()
        unknown = decommission(cluster, "no-such-bookie")
        assert unknown.returncode == 1 and "unknown bookie 'no-such-bookie'" in unknown.stderr
        dead = w.metadata.last_ensemble[0]
        cluster.bookies[dead].kill()
        deadline = time.monotonic() + 15
        while dead in await client.bookies(refresh=True):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        gone = decommission(cluster, dead)
        assert gone.returncode == 1 and f"octavo cluster recover --bookie {dead}" in gone.stderr
        # Three bookies left and an E3 ledger: none of them may go.
        other = w.metadata.last_ensemble[1]
        short = decommission(cluster, other)
        assert short.returncode == 1 and "needs an ensemble of 3 bookies (E3/Qw3/Qa2)" in short.stderr
        assert other in await client.writable_bookies(), "a refused decommission changed the bookie's mode"


async def test_an_interrupted_decommission_says_how_to_go_on_and_cancel_undoes_it(cluster: LocalCluster) -> None:
    """Issue 29, item 8. While it waits on open ledgers it says which ones and how long their writers have;
    Ctrl-C says how to resume or cancel; --cancel removes its marks and releases the forced read-only mode
    (before, the bookie stayed forced read-only, and after `bookie writable` its ledgers stayed marked)."""
    import signal

    victim = "bookie-3"
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writers = []
        while not any(victim in w.metadata.last_ensemble for w in writers):
            assert len(writers) < 20, "placement never chose the victim"
            w = await client.create_ledger(3, 3, 2, password=PASSWORD)
            await w.append_many([entry_data(w.ledger_id, i) for i in range(10)])
            writers.append(w)
        waiting_on = sorted(w.ledger_id for w in writers if victim in w.metadata.last_ensemble)
        # The --bookie form, as every other bookie command (the positional form stays: the other tests use it).
        proc = subprocess.Popen([*OCTAVO_WITH_CTRL_C, "bookie", "decommission", "--bookie",
                                 victim, "--wait-s", "120", "--etcd", cluster.etcd_endpoint],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        lines = []
        deadline = time.monotonic() + 60
        while True:  # idle writers never move off: it waits on their ledgers, and says so
            line = await asyncio.get_running_loop().run_in_executor(None, proc.stderr.readline)
            assert line and time.monotonic() < deadline, "".join(lines)
            lines.append(line)
            if "waiting on" in line:
                break
        assert f"waiting on {len(waiting_on)} open ledgers" in line and ", ".join(map(str, waiting_on)) in line, line
        assert "grace ends in" in line and "--wait-s 120" in line and "--recover-open" in line, line
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.get_running_loop().run_in_executor(None, proc.communicate)
        assert proc.returncode == 130, err
        assert f"`octavo bookie decommission --bookie {victim} --etcd {cluster.etcd_endpoint}` goes on" in err, err
        assert f"`octavo bookie decommission --bookie {victim} --etcd {cluster.etcd_endpoint} --cancel`" in err, err
        assert "Traceback" not in err

        marked = json.loads(octavo(cluster, "cluster", "underreplicated", "--json").stdout)["underreplicated"]
        assert {m["ledger_id"] for m in marked if victim in m["missing"]} >= set(waiting_on)
        assert victim not in await client.writable_bookies()

        cancel = octavo(cluster, "bookie", "decommission", "--bookie", victim, "--cancel")
        assert cancel.returncode == 0, cancel.stderr
        assert "decommission cancelled" in cancel.stdout and f"{victim}: writable" in cancel.stdout, cancel.stdout
        marked = json.loads(octavo(cluster, "cluster", "underreplicated", "--json").stdout)["underreplicated"]
        assert not [m for m in marked if victim in m["missing"]], marked
        status = json.loads(octavo(cluster, "bookie", "status", "--bookie", victim, "--json").stdout)
        assert status["forced_read_only"] is False and status["mode"] == "MODE_WRITABLE", status
        deadline = time.monotonic() + 10
        while victim not in await client.writable_bookies():
            assert time.monotonic() < deadline, "the bookie never turned writable again"
            await asyncio.sleep(0.2)
        for w in writers:  # the writers went on all along
            await w.append(b"after the cancel")
            await w.close()


def test_decommission_and_recover_take_the_bookie_either_way(cluster: LocalCluster) -> None:
    both = octavo(cluster, "bookie", "decommission", "bookie-1", "--bookie", "bookie-2", "--dry-run")
    assert both.returncode == 2 and "two bookies given" in both.stderr, both.stderr
    neither = octavo(cluster, "cluster", "recover", "--dry-run")
    assert neither.returncode == 2 and "--bookie ID" in neither.stderr, neither.stderr
    flag = octavo(cluster, "bookie", "decommission", "--bookie", "bookie-1", "--dry-run", "--json")
    positional = octavo(cluster, "bookie", "decommission", "bookie-1", "--dry-run", "--json")
    assert flag.returncode == positional.returncode == 0, flag.stderr + positional.stderr
    assert json.loads(flag.stdout)["bookie_id"] == json.loads(positional.stdout)["bookie_id"] == "bookie-1"
    recover = octavo(cluster, "cluster", "recover", "--bookie", "bookie-1", "--dry-run")
    assert recover.returncode == 1 and "is registered (alive" in recover.stderr, recover.stderr

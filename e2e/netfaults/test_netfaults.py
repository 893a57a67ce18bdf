"""Network faults between real processes in network namespaces (netlab.py): explicit partition scenarios and a
short seeded nemesis run with the history checker. Skipped, with the reason, where namespaces cannot be made
(not root, no iproute2/nftables, or refused); under CI=true that skip fails the run (conftest.py), and `make test`
installs iproute2 and nftables first (tools/get-system-packages.sh)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checker import check, load, report
from labcluster import BOOKIE_PORT, LabCluster
from nemesis import WORKER, describe, run
from netlab import NetLab, unavailable
from worker import PASSWORD, payload

from octavo.client import Client, ClientOptions
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

REASON = unavailable()
pytestmark = pytest.mark.skipif(bool(REASON), reason=f"network-fault tests need namespaces: {REASON}")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[NetLab]:
    with NetLab(tmp_path / "lab") as net:
        yield net


def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        time.sleep(0.2)


def bookie_status(cluster: LabCluster, bookie: str) -> pb.BookieStatus:
    with BookieConnection(f"{cluster.address(bookie)}:{BOOKIE_PORT}") as conn:
        return conn.status()


def test_the_lab_cuts_and_heals_links(lab: NetLab, tmp_path: Path) -> None:
    """What a cut does, measured: a TCP connect across it times out (no refusal), one across a healed link is
    answered; a bridge leaves a and c apart and both with b."""
    for name in ("a", "b", "c"):
        lab.add_host(name)
    probe = ("import socket,sys; s=socket.socket(); s.settimeout(1.5)\n"
             "try:\n s.connect((sys.argv[1], 9)); print('connected')\n"
             "except socket.timeout: print('timeout')\nexcept OSError as e: print('refused' if e.errno == 111 "
             "else f'error {e.errno}')")

    def reach(src: str, dst: str) -> str:
        return lab.run(src, [sys.executable, "-c", probe, lab.hosts[dst].address]).stdout.strip()

    assert reach("a", "b") == "refused"  # reachable: nothing listens on port 9, the host answers RST
    lab.bridge("a", "b", "c")
    assert (reach("a", "c"), reach("c", "a"), reach("a", "b"), reach("c", "b")) == (
        "timeout", "timeout", "refused", "refused")
    lab.link_down("b")
    assert reach("b", "a") == "error 101"  # ENETUNREACH: its own sends fail at once
    lab.heal_all()
    assert (reach("a", "c"), reach("b", "a")) == ("refused", "refused")


RECEIVE = ("import hashlib,socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); c,_=s.accept(); h=hashlib.sha256(); n=0\n"
           "while True:\n b=c.recv(65536)\n if not b: break\n h.update(b); n+=len(b)\n"
           "print(n, h.hexdigest(), flush=True)")
SEND = ("import hashlib,random,socket,sys,time; data=random.Random(7).randbytes(int(sys.argv[3]))\n"
        "for _ in range(100):\n"
        " try:\n  s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60); break\n"
        " except OSError: time.sleep(0.1)\n"
        "s.sendall(data); s.shutdown(socket.SHUT_WR); s.recv(1); print(len(data), hashlib.sha256(data).hexdigest())")


def transfer(lab: NetLab, tmp_path: Path, src: str, dst: str, size: int, port: int) -> tuple[str, str]:
    """Send `size` bytes from src to dst over TCP; what was sent and what arrived (length and sha256)."""
    out = tmp_path / f"recv-{port}.out"
    receiver = lab.start(dst, [sys.executable, "-c", RECEIVE, str(port)], out)
    sent = lab.run(src, [sys.executable, "-c", SEND, lab.hosts[dst].address, str(port), str(size)], timeout_s=180)
    receiver.wait(timeout=60)
    assert sent.returncode == 0, sent.stderr
    return sent.stdout.strip(), out.read_text().strip()


def test_a_lossy_link_and_a_throttled_link_still_deliver_every_byte(lab: NetLab, tmp_path: Path) -> None:
    """What loss and the bandwidth cap do, measured: TCP over them delivers every byte intact while the rules
    drop packets (their counters say how many); healed, nothing more is dropped."""
    for name in ("a", "b", "c"):
        lab.add_host(name)
    lab.lossy("a", "b")
    for port in range(7010, 7015):  # the drop is random: until it dropped something (about 4 per MB here)
        sent, received = transfer(lab, tmp_path, "a", "b", 1_000_000, port)
        assert sent == received and sent.startswith("1000000 ")
        if lab.dropped("a")["loss"] + lab.dropped("b")["loss"]:
            break
    assert lab.dropped("a")["loss"] + lab.dropped("b")["loss"] > 0, "the loss rule dropped nothing in 5 MB"
    lab.throttle("b", "c")
    sent, received = transfer(lab, tmp_path, "c", "b", 2_000_000, 7002)
    assert sent == received and sent.startswith("2000000 ")
    assert lab.dropped("b")["throttle"] > 0, "the throttle dropped nothing above its rate"
    lab.heal_all()
    before = {h: lab.dropped(h) for h in ("a", "b")}
    sent, received = transfer(lab, tmp_path, "a", "b", 2_000_000, 7003)
    assert sent == received
    assert {h: lab.dropped(h) for h in ("a", "b")} == before, "healed links still drop packets"


async def test_a_bookie_cut_from_etcd_longer_than_its_lease_takes_no_new_ledgers(lab: NetLab,
                                                                                  tmp_path: Path) -> None:
    """A bookie cut from etcd but not from its writer, for longer than its registration lease: the ledgers it
    holds go on through it; a writer with a stale bookie list that puts a new ledger on it is refused and
    moves to another bookie, so the bookie takes nothing of new ledgers; healed, it registers again."""
    cluster = LabCluster(lab, tmp_path, etcd_members=1, bookies=5, registration_ttl_s=2).start()
    options = ClientOptions(add_timeout_s=3.0)
    async with Client(cluster.etcd_endpoints, cluster.cluster, options) as client:
        assert len(await client.bookies(refresh=True)) == 5
        held = await client.create_ledger(5, 3, 2, password=PASSWORD)
        await held.append_many([payload(held.ledger_id, i) for i in range(50)])
        lab.cut("b0", "e0")
        # Writers keep placing new ledgers on b0 for as long as etcd lists it. Here etcd goes on listing it after
        # b0 took its registration for lapsed (as when an etcd leader change renews every lease): the test keeps
        # b0's lease alive. Without it the window is etcd's expiry lag, too short to hit reliably.
        registration = await client.etcd.get(client.metadata_store.layout.bookie("b0", False))
        assert registration is not None and registration.lease

        async def keep_b0_listed() -> None:
            while True:
                await client.etcd.keep_alive_once(registration.lease)
                await asyncio.sleep(0.5)

        listed = asyncio.create_task(keep_b0_listed())
        deadline = time.monotonic() + 20
        while (await asyncio.to_thread(bookie_status, cluster, "b0")).registered:  # the loop keeps b0 listed
            assert time.monotonic() < deadline, "b0 still takes itself for registered after 20 s"
            await asyncio.sleep(0.2)
        assert await client.etcd.get(client.metadata_store.layout.bookie("b0", False)), "etcd no longer lists b0"
        await held.append_many([payload(held.ledger_id, i) for i in range(50, 100)])
        assert "b0" in held.metadata.last_ensemble  # it holds the ledger: its adds go on
        placed = None
        for _ in range(20):  # placement is random: until a new ledger's first ensemble names b0
            ledger = await client.create_ledger(4, 3, 2, password=PASSWORD)
            if "b0" in ledger.metadata.last_ensemble:
                placed = ledger
                break
            await ledger.close()
        assert placed is not None, "no new ledger was placed on b0 in 20 tries"
        await placed.append_many([payload(placed.ledger_id, i) for i in range(30)])
        # b0 refuses with READ_ONLY; the entries may be acknowledged by the others before its refusal lands, and
        # the ensemble change that replaces it follows in the background.
        deadline = time.monotonic() + 30
        while "b0" in placed.metadata.last_ensemble:
            assert time.monotonic() < deadline, f"b0 still in {placed.metadata.last_ensemble} after 30 s"
            await asyncio.sleep(0.2)
        with BookieConnection(f"{cluster.address('b0')}:{BOOKIE_PORT}") as conn:
            answer = conn.read(placed.ledger_id, 0, 0)
            assert answer.error == pb.NO_SUCH_LEDGER, answer
        listed.cancel()
        lab.heal_all()
        wait_for(lambda: bookie_status(cluster, "b0").registered, 20, "b0 registered again")
        await held.close()
        await placed.close()
    async with Client(cluster.etcd_endpoints, cluster.cluster) as reader:
        for handle, count in ((held, 100), (placed, 30)):
            got = await reader.open_ledger(handle.ledger_id, PASSWORD)
            assert got.last_entry_id == count - 1
            assert [e.data async for e in got.read(0, count - 1)] == [payload(handle.ledger_id, i)
                                                                       for i in range(count)]


async def test_recovery_on_the_majority_while_the_old_writer_writes_on_the_minority(lab: NetLab,
                                                                                     tmp_path: Path) -> None:
    """A writer process and one bookie on one side, etcd and the other bookies on the other: the majority
    recovers (fences and closes) the writer's open ledgers while the writer keeps trying on its side. After
    healing nothing acknowledged to the writer is lost or lies past a ledger's end."""
    cluster = LabCluster(lab, tmp_path, etcd_members=1, bookies=3, registration_ttl_s=2).start()
    lab.add_host("w")
    history = tmp_path / "w.history"
    writer = lab.start("w", [sys.executable, WORKER, "write", "--etcd", cluster.etcd_endpoints, "--cluster",
                             cluster.cluster, "--name", "w", "--history", str(history), "--seconds", "14",
                             "--seed", "16", "--op-timeout-s", "20", "--entries-per-ledger", "100000"],
                       tmp_path / "w.log")
    wait_for(lambda: history.exists() and '"append", "type": "ok"' in history.read_text(), 30, "first acks")
    lab.partition(["w", "b0"], ["e0", "b1", "b2"])
    time.sleep(1.0)
    async with Client(cluster.etcd_endpoints, cluster.cluster, ClientOptions(read_timeout_s=3.0)) as client:
        recovered = []
        for ledger in await client.list_ledgers():
            meta = await client.ledger_metadata(ledger)
            if meta.state != "CLOSED":
                handle = await client.open_ledger(ledger, PASSWORD)  # fences b1 and b2: enough for Qa=2
                recovered.append((ledger, handle.last_entry_id))
    assert recovered, "the writer had no open ledger to recover"
    time.sleep(3.0)  # the writer keeps trying on its side
    lab.heal_all()
    writer.wait(timeout=60)
    events = load([history])
    summary = await check(cluster.etcd_endpoints, cluster.cluster, events)
    assert not summary.violations, report(summary, events)
    # The writer saw its recovered ledgers fail, and never an ack past their recovered end.
    failed = {e["ledger"] for e in events if e["f"] == "append" and e["type"] == "fail"}
    assert {ledger for ledger, _ in recovered} <= failed | {e["ledger"] for e in events if e["f"] == "close"}


async def test_a_writer_cut_from_etcd_during_an_ensemble_change(lab: NetLab, tmp_path: Path) -> None:
    """The writer loses etcd, then a bookie of its ensemble dies: it cannot record the ensemble change, so no
    entry it sends after the failure can be acknowledged; healed, it finishes (or gives up) and everything it
    was told is acknowledged reads back."""
    cluster = LabCluster(lab, tmp_path, etcd_members=1, bookies=4, registration_ttl_s=2).start()
    lab.add_host("w")
    history = tmp_path / "w.history"
    writer = lab.start("w", [sys.executable, WORKER, "write", "--etcd", cluster.etcd_endpoints, "--cluster",
                             cluster.cluster, "--name", "w", "--history", str(history), "--seconds", "14",
                             "--seed", "17", "--op-timeout-s", "30"], tmp_path / "w.log")
    wait_for(lambda: history.exists() and '"append", "type": "ok"' in history.read_text(), 30, "first acks")
    lab.cut("w", "e0")
    creates = [json.loads(line) for line in history.read_text().splitlines() if '"create", "type": "ok"' in line]
    victim = creates[-1]["ensemble"][0]
    cluster.kill(victim)
    time.sleep(5.0)
    lab.heal_all()
    cluster.start_bookie(victim)
    writer.wait(timeout=90)
    events = load([history])
    summary = await check(cluster.etcd_endpoints, cluster.cluster, events)
    assert not summary.violations, report(summary, events)
    assert summary.acknowledged_entries > 0


async def test_the_auditor_isolated_hands_over_and_a_lost_bookie_is_still_healed(lab: NetLab,
                                                                                  tmp_path: Path) -> None:
    """The auditor cut off from everyone: once its lease lapses it stops calling itself the auditor and another
    bookie is elected; a bookie lost meanwhile has its ledgers re-replicated by the majority side; healed, there
    is one auditor, and every entry reads back."""
    cluster = LabCluster(lab, tmp_path, etcd_members=1, bookies=5, registration_ttl_s=2,
                         bookie_args=("--lost-bookie-delay-s", "2", "--audit-interval-s", "2")).start()

    def auditors() -> list[str]:
        return [b for b in cluster.bookie_names if cluster.procs[b].poll() is None
                and bookie_status(cluster, b).autorecovery.is_auditor]

    wait_for(lambda: len(auditors()) == 1, 30, "one auditor elected")
    (first,) = auditors()
    async with Client(cluster.etcd_endpoints, cluster.cluster) as client:
        ledgers = []
        for _ in range(4):
            handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
            await handle.append_many([payload(handle.ledger_id, i) for i in range(40)])
            await handle.close()
            ledgers.append(handle.ledger_id)
    lab.isolate(first)
    wait_for(lambda: [b for b in auditors() if b != first] and first not in auditors(), 30,
             "the isolated auditor steps down and another is elected")
    victim = next(b for b in cluster.bookie_names if b != first and b not in auditors())
    cluster.kill(victim)

    async def healed() -> bool:
        async with Client(cluster.etcd_endpoints, cluster.cluster) as c:
            for ledger in ledgers:
                meta = await c.ledger_metadata(ledger)
                if any(victim in bookies for _, bookies in meta.ensembles):
                    return False
        return True

    deadline = time.monotonic() + 90
    while not await healed():
        assert time.monotonic() < deadline, f"{victim}'s ledgers not re-replicated while {first} was isolated"
        time.sleep(0.5)
    lab.heal_all()
    time.sleep(3)
    assert len(auditors()) == 1
    async with Client(cluster.etcd_endpoints, cluster.cluster) as client:
        for ledger in ledgers:
            reader = await client.open_ledger(ledger, PASSWORD)
            assert [e.data async for e in reader.read(0, 39)] == [payload(ledger, i) for i in range(40)]


def worker(lab: NetLab, cluster: LabCluster, tmp_path: Path, mode: str, name: str, seconds: float,
           *extra: str) -> tuple[object, Path]:
    lab.add_host(name)
    history = tmp_path / f"{name}.history"
    proc = lab.start(name, [sys.executable, WORKER, mode, "--etcd", cluster.etcd_endpoints, "--cluster",
                            cluster.cluster, "--name", name, "--history", str(history), "--seconds", str(seconds),
                            *extra], tmp_path / f"{name}.log")
    return proc, history


def etcd_leader(cluster: LabCluster) -> str:
    """The member etcd says leads (its maintenance status over the JSON gateway)."""
    ids = {}
    leader = 0
    for name in cluster.etcd_names:
        request = urllib.request.Request(f"http://{cluster.address(name)}:2379/v3/maintenance/status",
                                         data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=5) as r:
            status = json.loads(r.read())
        ids[int(status["header"]["member_id"])] = name
        leader = int(status["leader"])
    return ids[leader]


async def test_the_etcd_leader_isolated_while_writers_write(lab: NetLab, tmp_path: Path) -> None:
    """Three etcd members; the leader is cut off from everyone. The other two elect a leader and the writer goes
    on (creating ledgers, changing ensembles through the new leader); healed, nothing acknowledged is lost."""
    cluster = LabCluster(lab, tmp_path, etcd_members=3, bookies=4, registration_ttl_s=3).start()
    proc, history = worker(lab, cluster, tmp_path, "write", "w", 16, "--seed", "18", "--entries-per-ledger", "120")
    wait_for(lambda: history.exists() and '"append", "type": "ok"' in history.read_text(), 30, "first acks")
    leader = etcd_leader(cluster)
    lab.isolate(leader)
    isolated_at = time.time()
    time.sleep(7.0)
    lab.heal_all()
    proc.wait(timeout=90)  # type: ignore[attr-defined]
    events = load([history])
    summary = await check(cluster.etcd_endpoints, cluster.cluster, events)
    assert not summary.violations, report(summary, events)
    during = [e for e in events if isolated_at + 3 < e["t"] < isolated_at + 7 and e["type"] == "ok"
              and e["f"] in ("create", "append")]
    assert during, f"nothing was written while {leader} was isolated"


async def test_a_reader_on_the_minority_side_reads_an_open_ledger(lab: NetLab, tmp_path: Path) -> None:
    """A reader following an open ledger ends up on the minority side with one bookie; the writer goes on on the
    majority side (replacing that bookie). The reader only ever reads what was written, never past what the
    ledger finally holds; healed, every acknowledged entry reads back."""
    cluster = LabCluster(lab, tmp_path, etcd_members=1, bookies=4, registration_ttl_s=2).start()
    wproc, whistory = worker(lab, cluster, tmp_path, "write", "w", 14, "--seed", "19",
                             "--entries-per-ledger", "100000")
    wait_for(lambda: whistory.exists() and '"append", "type": "ok"' in whistory.read_text(), 30, "first acks")
    rproc, rhistory = worker(lab, cluster, tmp_path, "tail", "r", 12)
    wait_for(lambda: rhistory.exists() and '"read", "type": "ok"' in rhistory.read_text(), 30, "first reads")
    ensemble = next(json.loads(line) for line in whistory.read_text().splitlines()
                    if '"create", "type": "ok"' in line)["ensemble"]
    lonely = ensemble[0]
    lab.partition(["r", lonely], ["e0", "w", *[b for b in cluster.bookie_names if b != lonely]])
    time.sleep(5.0)
    lab.heal_all()
    for proc in (wproc, rproc):
        proc.wait(timeout=90)  # type: ignore[attr-defined]
    events = load([whistory, rhistory])
    summary = await check(cluster.etcd_endpoints, cluster.cluster, events)
    assert not summary.violations, report(summary, events)
    reads = [e for e in events if e["p"] == "r" and e["f"] == "read" and e["type"] == "ok"]
    assert reads and all(e["good"] for e in reads)


def test_a_short_seeded_nemesis_run_keeps_every_acknowledged_entry(tmp_path: Path) -> None:
    """Writers and a reader in their own namespaces over 3 etcd members and 4 bookies, while the nemesis cuts,
    isolates, partitions, bridges, SIGKILLs and SIGSTOPs (seeded; `make chaos` runs long ones)."""
    seed = int(os.environ.get("OCTAVO_CHAOS_SEED", "20261123"))
    result = run(tmp_path, seconds=float(os.environ.get("OCTAVO_CHAOS_SECONDS", "30")), seed=seed)
    assert result.summary is not None
    assert result.ok, describe(result)
    assert result.summary.acknowledged_entries > 0 and sum(result.faults.values()) >= 5, describe(result)

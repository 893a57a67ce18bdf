"""ReadTail, the tailing reader's long poll, on a real bookie process: held until the LAC passes the reader's,
answered with the entries it now may read; woken by a fence and by a write-close; answered at the end of its
wait (capped by long_poll_wait_ms_max) with nothing new; BUSY past long_poll_waiters_max; INVALID for bad ids;
a held poll does not stop adds or other reads."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from octavo.node.testing import BookieConnection, BookieProcess, payload_for
from octavo.v1 import bookie_pb2 as pb

KEY = b"tail-key"


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    proc = BookieProcess(str(tmp_path_factory.mktemp("tail") / "bookie"),
                         args=["--long-poll-waiters-max", "3", "--long-poll-wait-ms-max", "1500"])
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def conn(bookie: BookieProcess) -> Iterator[BookieConnection]:
    with BookieConnection(bookie.address) as c:
        yield c


_ledger = iter(range(5000, 10**6))


def add(conn: BookieConnection, ledger: int, ids: list[int], lac: int) -> None:
    resp = conn.add(ledger, KEY, ids, [payload_for(ledger, e) for e in ids], last_add_confirmed=lac)
    assert not resp.error, resp.error_message


def poll(conn: BookieConnection, ledger: int, previous: int, wait_ms: int = 5000, max_entries: int = 100) -> object:
    return conn.bookie.ReadTail.future(pb.ReadTailRequest(ledger_id=ledger, previous_lac=previous, wait_ms=wait_ms,
                                                          max_entries=max_entries), timeout=30)


def test_held_until_the_lac_passes_then_answered_with_the_entries(conn: BookieConnection) -> None:
    ledger = next(_ledger)
    add(conn, ledger, [0, 1, 2], lac=-1)
    held = poll(conn, ledger, previous=-1)
    time.sleep(0.3)
    assert not held.done(), "answered before any LAC reached the bookie"  # type: ignore[attr-defined]
    add(conn, ledger, [3], lac=2)  # entry 3's add carries the LAC 2
    answer = held.result()  # type: ignore[attr-defined]
    assert not answer.error and answer.last_add_confirmed == 2
    assert [(e.entry_id, e.payload) for e in answer.entries] == [(e, payload_for(ledger, e)) for e in range(3)]
    # Already past: answered at once, entries after previous_lac only; max_entries 0 is the LAC alone.
    again = poll(conn, ledger, previous=0).result()  # type: ignore[attr-defined]
    assert [e.entry_id for e in again.entries] == [1, 2]
    bare = poll(conn, ledger, previous=0, max_entries=0).result()  # type: ignore[attr-defined]
    assert bare.last_add_confirmed == 2 and not bare.entries


def test_wait_ends_without_progress_at_the_bookie_cap(conn: BookieConnection) -> None:
    ledger = next(_ledger)
    add(conn, ledger, [0], lac=-1)
    started = time.monotonic()
    answer = poll(conn, ledger, previous=-1, wait_ms=60_000).result()  # type: ignore[attr-defined]
    waited = time.monotonic() - started
    assert not answer.error and answer.last_add_confirmed == -1 and not answer.entries
    assert 1.0 <= waited < 10, f"held {waited:.1f} s; long_poll_wait_ms_max is 1.5 s"


def test_a_fence_and_a_write_close_wake_the_poll(conn: BookieConnection) -> None:
    fenced, closed = next(_ledger), next(_ledger)
    for ledger in (fenced, closed):
        add(conn, ledger, [0, 1], lac=0)
    held_f = poll(conn, fenced, previous=0)
    held_c = poll(conn, closed, previous=0)
    time.sleep(0.2)
    assert conn.read_lac(fenced, fence=True, master_key=KEY).code == pb.OK
    a = held_f.result()  # type: ignore[attr-defined]
    assert a.fenced and a.last_add_confirmed == 0 and not a.write_closed
    assert conn.bookie.WriteClose(pb.WriteCloseRequest(ledger_id=closed, master_key=KEY, last_entry_id=1)).code == pb.OK
    b = held_c.result()  # type: ignore[attr-defined]
    assert b.write_closed and b.fenced  # a write-close also seals the ledger: its writer's adds are refused


def test_an_unknown_ledger_waits_then_says_so(conn: BookieConnection) -> None:
    ledger = next(_ledger)
    held = poll(conn, ledger, previous=-1, wait_ms=3000)
    time.sleep(0.2)
    add(conn, ledger, [0, 1], lac=0)  # the ledger appears with a LAC: the poll is answered
    answer = held.result()  # type: ignore[attr-defined]
    assert answer.last_add_confirmed == 0 and [e.entry_id for e in answer.entries] == [0]
    unknown = poll(conn, next(_ledger), previous=-1, wait_ms=100).result()  # type: ignore[attr-defined]
    assert unknown.error == pb.NO_SUCH_LEDGER and "not known" in unknown.error_message


def test_busy_past_the_waiter_limit_and_bad_ids_invalid(conn: BookieConnection) -> None:
    ledger = next(_ledger)
    add(conn, ledger, [0], lac=-1)
    held = [poll(conn, ledger, previous=-1) for _ in range(3)]
    time.sleep(0.3)
    busy = poll(conn, ledger, previous=-1).result()  # type: ignore[attr-defined]
    assert busy.error == pb.BUSY and "long_poll_waiters_max=3" in busy.error_message
    # Adds and reads go on while polls are held.
    add(conn, ledger, [1], lac=0)
    assert all(h.result().last_add_confirmed == 0 for h in held)  # type: ignore[attr-defined]
    for ledger_id, previous in ((-1, 0), (ledger, -2)):
        bad = poll(conn, ledger_id, previous=previous).result()  # type: ignore[attr-defined]
        assert bad.error == pb.INVALID and "previous_lac" in bad.error_message


def test_a_cancelled_poll_frees_its_place(conn: BookieConnection) -> None:
    ledger = next(_ledger)
    add(conn, ledger, [0], lac=-1)
    for _ in range(3):  # more cancelled polls than places: each cancel must give its place back
        for h in [poll(conn, ledger, previous=-1) for _ in range(3)]:
            time.sleep(0.05)
            h.cancel()  # type: ignore[attr-defined]
    time.sleep(0.3)
    held = poll(conn, ledger, previous=-1)
    add(conn, ledger, [1], lac=0)
    assert held.result().last_add_confirmed == 0  # type: ignore[attr-defined]

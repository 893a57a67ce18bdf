"""The admission of entries to a write handle (octavo.client.admission), pure: the handle's state as values in,
a refusal or (size, room) out. The three ways in (append, append_nowait, SyncWriteHandle's queue) all go through
it; client/tests/test_producer.py and test_client.py drive them on real bookies."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octavo.client.admission import admit, ensemble_entry_limit, has_room, refusal
from octavo.meta.errors import EntryTooLargeError, LedgerClosedError, LedgerFencedError, OctavoError
from octavo.meta.metadata import BookieInfo

LIMIT = 100  # entry_size_bytes_max
BUDGET = 1000  # inflight_bytes_max


def run(entries: list[Any], *, single: bool = False, error: OctavoError | None = None, closing: bool = False,
        used: int = 0) -> tuple[int, bool]:
    return admit(entries, single, error, closing, 7, LIMIT, "bookie b2", used, BUDGET)


# (name, entries, used bytes, expected (size, room))
CASES = [
    ("one-entry-fits", [b"x" * 10], 0, (10, True)),
    ("one-entry-beside-others", [b"x" * 10], 990, (10, True)),
    ("one-entry-over-the-budget-waits", [b"x" * 11], 990, (11, False)),
    ("several-within-the-budget", [b"x" * 100] * 10, 0, (1000, True)),
    ("several-over-the-budget-even-when-empty", [b"x" * 100] * 11, 0, (1100, False)),
    ("several-beside-others", [b"x" * 50] * 2, 900, (100, True)),
    ("several-one-byte-too-many", [b"x" * 50] * 2, 901, (100, False)),
    ("empty-entries-take-no-room", [b""] * 3, 1000, (0, True)),
]


@pytest.mark.parametrize(("name", "entries", "used", "expected"), CASES, ids=[c[0] for c in CASES])
def test_size_and_room(name: str, entries: list[Any], used: int, expected: tuple[int, bool]) -> None:
    assert run(list(entries), used=used) == expected


def test_an_entry_larger_than_the_whole_budget_goes_alone_into_an_empty_window() -> None:
    big = [b"x" * 60]
    assert admit(big, True, None, False, 7, 100, "the client", 0, 50) == (60, True)
    assert admit(big, True, None, False, 7, 100, "the client", 1, 50) == (60, False)
    assert admit(big * 2, False, None, False, 7, 100, "the client", 0, 50) == (120, False)


def test_refusals_in_order_failed_then_closing_then_type_then_size() -> None:
    fenced = LedgerFencedError("ledger 7 was fenced")
    with pytest.raises(LedgerFencedError):  # the handle's error first, even for a bad entry
        run(["not bytes"], error=fenced, closing=True)
    with pytest.raises(LedgerClosedError, match="ledger 7 is closed to appends"):
        run(["not bytes"], closing=True)
    with pytest.raises(TypeError, match="data must be"):
        run(["not bytes"], single=True)
    with pytest.raises(TypeError, match=r"entries\[1\] must be"):
        run([b"ok", "not bytes"])
    with pytest.raises(EntryTooLargeError, match="entry of 101 bytes is over bookie b2's entry_size_bytes_max=100"):
        run([b"x", b"x" * 101])
    assert run([b"x" * LIMIT], single=True) == (LIMIT, True)  # the limit itself is allowed


def test_bytes_like_entries_are_converted_in_place() -> None:
    entries: list[Any] = [bytearray(b"ab"), memoryview(b"cde"), b"f"]
    assert run(entries) == (6, True)
    assert entries == [b"ab", b"cde", b"f"] and all(type(e) is bytes for e in entries)


def test_refusal_is_the_state_rule_alone() -> None:
    fenced = LedgerFencedError("fenced")
    assert refusal(fenced, True, 7) is fenced
    closed = refusal(None, True, 7)
    assert isinstance(closed, LedgerClosedError) and "ledger 7" in str(closed)
    assert refusal(None, False, 7) is None


@given(st.integers(0, 3000), st.integers(0, 3000), st.integers(1, 20))
def test_has_room_is_the_budget(used: int, size: int, count: int) -> None:
    room = has_room(used, size, BUDGET, count)
    if used + size <= BUDGET:
        assert room
    elif used == 0 and count == 1:
        assert room  # one entry alone may exceed the budget
    else:
        assert not room


def test_ensemble_entry_limit_names_who_sets_it() -> None:
    regs = {"b1": BookieInfo("b1", "x:1", entry_size_bytes_max=5000),
            "b2": BookieInfo("b2", "x:2", entry_size_bytes_max=3000),
            "b3": BookieInfo("b3", "x:3", entry_size_bytes_max=0),
            "b4": BookieInfo("b4", "x:4", entry_size_bytes_max=100)}
    assert ensemble_entry_limit(4000, ["b1", "b2", "b3"], regs) == (3000, "bookie b2")
    assert ensemble_entry_limit(2000, ["b1", "b2", "b3"], regs) == (2000, "the client")
    assert ensemble_entry_limit(4000, ["b3", "gone"], regs) == (4000, "the client")


@given(st.integers(0, 3000), st.lists(st.integers(0, 120), min_size=1, max_size=12), st.booleans(), st.booleans())
def test_admit_applies_refusal_and_has_room(used: int, sizes: list[int], failed: bool, closing: bool) -> None:
    """admit writes the two rules out (it runs once per record): it must agree with refusal and has_room."""
    error = LedgerFencedError("fenced") if failed else None
    expected = refusal(error, closing, 7)
    entries: list[Any] = [b"x" * n for n in sizes]
    if expected is not None:
        with pytest.raises(type(expected), match=str(expected)):
            run(entries, error=error, closing=closing, used=used)
        return
    if max(sizes) > LIMIT:
        with pytest.raises(EntryTooLargeError):
            run(entries, used=used)
        return
    assert run(entries, used=used) == (sum(sizes), has_room(used, sum(sizes), BUDGET, len(sizes)))

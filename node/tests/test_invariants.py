"""The invariants the engine checks in code (invariants.check, kept on under python -O): each one made to fire."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from octavo.node.entrylog import ACTIVE, FLUSHED, LEGAL_MOVES, ROLLED, EntryLog, LogState
from octavo.node.invariants import InvariantError, check
from octavo.node.recoverypoint import RecoveryPoint, moved_forward
from octavo.node.writecache import WriteCache


def test_check_raises_on_a_false_condition_and_passes_a_true_one() -> None:
    check(True, "never raised")
    with pytest.raises(InvariantError, match="the message"):
        check(False, "the message")


def test_check_stays_on_under_python_dash_o() -> None:
    """An assert would vanish under -O; the check does not."""
    code = "from octavo.node.invariants import check\ncheck(False, 'still checked')"
    run = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "InvariantError: still checked" in run.stderr


def test_the_recovery_point_only_moves_forward() -> None:
    assert moved_forward(RecoveryPoint(3), RecoveryPoint(5)) == RecoveryPoint(5)
    assert moved_forward(RecoveryPoint(5), RecoveryPoint(5)) == RecoveryPoint(5)
    with pytest.raises(InvariantError, match="from log 5 back to 4"):
        moved_forward(RecoveryPoint(5), RecoveryPoint(4))


def test_the_write_cache_refuses_to_move_its_recovery_point_back() -> None:
    cache = WriteCache(entries_max=10)
    cache.start_recovery_point(RecoveryPoint(7))  # what startup found
    cache.advance_recovery_point(RecoveryPoint(9))
    with pytest.raises(InvariantError):
        cache.advance_recovery_point(RecoveryPoint(8))
    assert cache.recovery_point == RecoveryPoint(9)  # unchanged by the refused move


def test_a_flush_that_would_move_the_recovery_point_back_is_refused() -> None:
    """WriteCache.flushed is where the flush step sets the point: a point behind the current one raises."""
    cache = WriteCache(entries_max=10)
    cache.start_recovery_point(RecoveryPoint(4))
    old = EntryLog(4, "4.log", -1, 0, ACTIVE)
    cache.roll_to(old)
    cache.roll_to(EntryLog(5, "5.log", -1, 0, ACTIVE))
    with pytest.raises(InvariantError):
        cache.flushed(old, RecoveryPoint(3))
    cache.flushed(old, cache.point_after_oldest())
    assert cache.recovery_point == RecoveryPoint(5) and old.state is FLUSHED


@pytest.mark.parametrize(("start", "to"), list(itertools.product(LogState, LogState)))
def test_entry_log_state_changes_are_checked_against_the_table(start: LogState, to: LogState) -> None:
    entry_log = EntryLog(1, "1.log", -1, 0, start)
    if to in LEGAL_MOVES[start]:
        entry_log.move_to(to)
        assert entry_log.state is to
    else:
        with pytest.raises(InvariantError, match=f"from {start} to {to}"):
            entry_log.move_to(to)
        assert entry_log.state is start


def test_the_legal_moves_are_roll_then_flush() -> None:
    moves = {(a, b) for a, targets in LEGAL_MOVES.items() for b in targets}
    assert moves == {(ACTIVE, ROLLED), (ROLLED, FLUSHED)}


def test_rolling_a_flushed_log_again_fires() -> None:
    """The write cache rolls through move_to: a log flushed and then handed back as active cannot roll."""
    cache = WriteCache(entries_max=10)
    entry_log = EntryLog(1, "1.log", -1, 0, FLUSHED)
    cache.active = entry_log
    with pytest.raises(InvariantError):
        cache.roll_to(None)

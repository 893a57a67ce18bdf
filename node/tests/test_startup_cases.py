"""The startup decision table (octavo.node.startup_cases), row by row and over every combination of facts,
with no files: the IO that carries the actions out is tested in test_storage.py and test_compaction.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octavo.node.startup_cases import (
    CASES,
    Action,
    Case,
    Kind,
    LogFacts,
    decide,
    needs_scan,
    recovery_point_to_use,
)

DURABILITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "durability.md"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_row(case: Case) -> None:
    assert decide(case.example, case.recovery_point) is case.action


def test_every_action_has_a_row_and_every_row_is_in_the_durability_doc() -> None:
    assert {c.action for c in CASES} == set(Action)
    assert len({c.name for c in CASES}) == len(CASES)
    doc = DURABILITY_DOC.read_text()
    missing = [c.name for c in CASES if f"`{c.name}`" not in doc]
    assert not missing, f"docs/durability.md does not name the rows {missing}"


@given(log_id=st.integers(0, 50), point=st.integers(0, 50), size=st.integers(0, 200),
       header_ok=st.booleans(), valid=st.integers(0, 200))
def test_entry_logs_exhaustively(log_id: int, point: int, size: int, header_ok: bool, valid: int) -> None:
    valid_end = min(valid, size)
    facts = LogFacts(Kind.LOG, log_id, size_bytes=size, header_bytes=32, header_ok=header_ok, valid_end=valid_end)
    action = decide(facts, point)
    # Exactly one row's situation holds, and its action is the one taken.
    situations = {
        Action.SKIP: log_id < point,
        Action.DELETE: log_id >= point and size < 32,
        Action.QUARANTINE: log_id >= point and size >= 32 and not header_ok,
        Action.CUT: log_id >= point and size >= 32 and header_ok and valid_end < size,
        Action.REPLAY: log_id >= point and size >= 32 and header_ok and valid_end == size,
    }
    assert [a for a, holds in situations.items() if holds] == [action]
    assert needs_scan(Kind.LOG, log_id, point) == (action is not Action.SKIP)
    # Nothing past the last valid record is ever replayed, and a log below the point is never touched.
    if action is Action.REPLAY:
        assert valid_end == size


def test_compaction_logs_whatever_the_recovery_point() -> None:
    for point, readable in itertools.product((0, 5, 100), (True, False)):
        assert decide(LogFacts(Kind.COMPACTING, 7, readable=readable), point) is Action.ROLL_BACK
        assert decide(LogFacts(Kind.COMPACTED, 7, readable=readable), point) is (
            Action.FINISH if readable else Action.QUARANTINE)
        assert not needs_scan(Kind.COMPACTED, 7, point) and not needs_scan(Kind.COMPACTING, 7, point)


@pytest.mark.parametrize(("stored", "checksum_ok", "index_exists", "expected"), [
    (None, True, True, 0),      # no recovery point file: scan every log
    (12, False, True, 0),       # the file fails its checksum: scan every log
    (12, True, False, 0),       # the index it vouches for is gone: rebuild from every log
    (0, True, False, 0),
    (12, True, True, 12),       # the normal start
])
def test_which_recovery_point_a_start_goes_by(stored: int | None, checksum_ok: bool, index_exists: bool,
                                             expected: int) -> None:
    assert recovery_point_to_use(stored, checksum_ok, index_exists) == expected

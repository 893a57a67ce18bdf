"""Compaction's decisions as tables (octavo.node.compaction_plan): no files, no clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octavo.node.compaction_plan import (
    MAJOR,
    MINOR,
    LogUsage,
    PassState,
    blocked_reason,
    due,
    plan,
    why_stop,
)

MIB = 1 << 20


def test_plan_picks_logs_below_the_threshold_lowest_share_first_and_packs_them() -> None:
    logs = [
        LogUsage(1, live_bytes=60 * MIB, total_bytes=64 * MIB, any_live=True),   # 94% live: kept
        LogUsage(2, live_bytes=10 * MIB, total_bytes=64 * MIB, any_live=True),   # 16%
        LogUsage(3, live_bytes=30 * MIB, total_bytes=64 * MIB, any_live=True),   # 47%
        LogUsage(4, live_bytes=0, total_bytes=64 * MIB, any_live=False),         # nothing alive: GC's
        LogUsage(5, live_bytes=2 * MIB, total_bytes=64 * MIB, any_live=True),    # 3%
        LogUsage(6, live_bytes=40 * MIB, total_bytes=64 * MIB, any_live=True),   # 62%
        LogUsage(7, live_bytes=0, total_bytes=0, any_live=True),                 # empty accounting: skipped
    ]
    # Major (0.8): 5, 2, 3, 6 by share; live bytes 2 + 10 + 30 fit 64 MiB, 6 (40) starts a new group.
    assert plan(logs, 0.8, 64 * MIB, 1024) == [[(5, 2 * MIB, 64 * MIB), (2, 10 * MIB, 64 * MIB),
                                                (3, 30 * MIB, 64 * MIB)], [(6, 40 * MIB, 64 * MIB)]]
    # Minor (0.2): only 5 and 2.
    assert [[src for src, _, _ in g] for g in plan(logs, 0.2, 64 * MIB, 1024)] == [[5, 2]]
    # The source limit splits groups too.
    assert [[src for src, _, _ in g] for g in plan(logs, 0.8, 64 * MIB, 2)] == [[5, 2], [3], [6]]
    assert plan([], 0.8, 64 * MIB, 1024) == []


@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 100), st.booleans()), max_size=40),
       st.floats(0.05, 1.0), st.integers(1, 300), st.integers(1, 5))
def test_plan_invariants(raw: list[tuple[int, int, bool]], threshold: float, cap: int, sources_max: int) -> None:
    logs = [LogUsage(i, min(live, total), total, any_live) for i, (live, total, any_live) in enumerate(raw)]
    groups = plan(logs, threshold, cap, sources_max)
    chosen = [src for g in groups for src, _, _ in g]
    assert len(chosen) == len(set(chosen))  # no log twice
    expected = {u.log_id for u in logs if u.any_live and u.live_bytes / u.total_bytes < threshold}
    assert set(chosen) == expected
    for g in groups:
        assert 1 <= len(g) <= sources_max
        assert len(g) == 1 or sum(live for _, live, _ in g) <= cap  # one log of free space is enough
    shares = [live / total for g in groups for _, live, total in g]
    assert shares == sorted(shares)  # the emptiest logs go first


@pytest.mark.parametrize(("now", "last_major", "last_minor", "expected"), [
    (100.0, 0.0, 0.0, MAJOR),        # both due: major first
    (100.0, 50.0, 0.0, MINOR),
    (100.0, 50.0, 95.0, None),
    (100.0, 0.0, 99.0, MAJOR),
])
def test_which_pass_is_due(now: float, last_major: float, last_minor: float, expected: str | None) -> None:
    assert due(now, last_major, last_minor, major_interval_ms=90_000, minor_interval_ms=10_000) == expected


def test_blocked_reasons() -> None:
    assert blocked_reason(True, False, 0, 1_000) == ""
    assert blocked_reason(True, False, 2_000, 1_000) == ""                      # inside the window
    assert "window closed" in blocked_reason(True, False, 1_000, 1_000)        # at its end
    assert "suspended" in blocked_reason(True, True, 0, 1_000)
    assert "disabled" in blocked_reason(False, True, 1, 1_000)                  # the first reason wins


def state(**kw: object) -> PassState:
    base: dict[str, object] = {"stopping": False, "cancelled": False, "suspended": False, "manual": False,
                               "now_s": 10.0, "deadline_s": 20.0, "now_unix_ms": 5_000, "window_until_ms": 0,
                               "run_time_ms_max": 10_000}
    base.update(kw)
    return PassState(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "reason"), [
    ({}, ""),
    ({"stopping": True, "cancelled": True}, "the bookie is stopping"),
    ({"cancelled": True, "suspended": True}, "cancelled"),
    ({"now_s": 20.0}, "run time limit reached (compaction_run_time_ms_max=10000)"),
    ({"suspended": True}, "suspended by an administrator"),
    ({"window_until_ms": 5_000}, "the compaction window closed"),
    ({"window_until_ms": 5_000, "manual": True}, ""),          # a pass started by hand ignores the window
    ({"window_until_ms": 6_000}, ""),
])
def test_why_a_running_pass_stops(kw: dict[str, object], reason: str) -> None:
    assert why_stop(state(**kw)) == reason

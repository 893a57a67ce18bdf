"""The operator's decision function, without any server: tables for each rule, and properties (hypothesis) over
clocks, windows, usage sequences and cluster sizes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octavo.operator.policy import (
    CLOSE_WINDOW,
    CLOSED_UNIX_MS,
    EMERGENCY_WINDOW_S,
    FORCE_READ_ONLY,
    OPEN_WINDOW,
    OUTSIDE_COMPACT,
    RELEASE_READ_ONLY,
    SLOT_IDLE_S,
    Action,
    Decision,
    Memory,
    Observed,
    Policy,
    PolicyError,
    Shape,
    Watermarks,
    decide,
    unix_ms,
)
from octavo.operator.windows import Window

NIGHT = Window("0 2 * * *", 3600, "UTC")  # 02:00-03:00 UTC
IN_WINDOW = datetime(2026, 5, 4, 2, 10, tzinfo=UTC)
OUTSIDE = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
SHAPE = Shape(replicas=5, min_writable=3)


def bookies(*usages: float, **overrides: object) -> list[Observed]:
    return [Observed(f"bookie-{i}", disk_usage_ratio=u, **overrides) for i, u in enumerate(usages)]  # type: ignore[arg-type]


def kinds(decision: Decision, kind: str) -> list[str]:
    return [a.bookie_id for a in decision.actions if a.kind == kind]


def apply(observed: list[Observed], actions: tuple[Action, ...], now: datetime) -> list[Observed]:
    """What the bookies report after the actions (a bookie forced read-only is no longer writable...)."""
    by_id = {b.bookie_id: b for b in observed}
    for a in actions:
        b = by_id[a.bookie_id]
        if a.kind == FORCE_READ_ONLY:
            b = replace(b, writable=False, forced_read_only=True)
        elif a.kind == RELEASE_READ_ONLY:
            b = replace(b, writable=True, forced_read_only=False)
        elif a.kind in (OPEN_WINDOW, CLOSE_WINDOW):
            b = replace(b, window_until_unix_ms=a.until_unix_ms)
        by_id[a.bookie_id] = b
    return [by_id[b.bookie_id] for b in observed]


# -- watermarks ---------------------------------------------------------------------------------------------

def test_a_full_bookie_is_forced_read_only_and_released_only_below_the_writable_ratio() -> None:
    policy = Policy()  # readOnly 0.90, writable 0.80
    state = bookies(0.5, 0.5, 0.5, 0.5, 0.91)
    d = decide(OUTSIDE, policy, SHAPE, state, Memory())
    assert kinds(d, FORCE_READ_ONLY) == ["bookie-4"]
    state, memory = apply(state, d.actions, OUTSIDE), d.memory
    assert memory.forced_by_operator == {"bookie-4"}
    for usage in (0.93, 0.89, 0.85, 0.81, 0.80001):  # between the marks: nothing moves
        state[4] = replace(state[4], disk_usage_ratio=usage)
        d = decide(OUTSIDE, policy, SHAPE, state, memory)
        assert not kinds(d, FORCE_READ_ONLY) and not kinds(d, RELEASE_READ_ONLY), usage
        memory = d.memory
    state[4] = replace(state[4], disk_usage_ratio=0.80)
    d = decide(OUTSIDE, policy, SHAPE, state, memory)
    assert kinds(d, RELEASE_READ_ONLY) == ["bookie-4"] and d.memory.forced_by_operator == frozenset()


def test_the_cluster_keeps_the_writable_bookies_a_new_ledger_needs() -> None:
    state = bookies(0.95, 0.97, 0.96, 0.2)
    d = decide(OUTSIDE, Policy(), Shape(replicas=4, min_writable=3), state, Memory())
    assert kinds(d, FORCE_READ_ONLY) == ["bookie-1"]  # the fullest first, and only one
    held = [m for m in d.disk_pressure if "stays writable" in m]
    assert len(held) == 2 and "a new ledger needs 3" in held[0] and "would leave 2 writable bookies" in held[0]


def test_a_bookie_forced_by_someone_else_is_not_released_by_the_operator() -> None:
    state = bookies(0.1, 0.1, 0.1, 0.1, writable=True)
    state[0] = replace(state[0], writable=False, forced_read_only=True)  # `octavo bookie readonly` by hand
    d = decide(OUTSIDE, Policy(), SHAPE, state, Memory())
    assert not d.actions or not kinds(d, RELEASE_READ_ONLY)


def test_a_bookie_released_by_hand_is_forgotten_and_decided_afresh() -> None:
    state = bookies(0.5, 0.5, 0.5, 0.5, 0.85)  # between the marks, and no longer forced
    d = decide(OUTSIDE, Policy(), SHAPE, state, Memory(forced_by_operator=frozenset({"bookie-4"})))
    assert d.memory.forced_by_operator == frozenset() and not kinds(d, FORCE_READ_ONLY)


def test_warnings_name_each_bookie_past_the_warn_ratio() -> None:
    d = decide(OUTSIDE, Policy(), SHAPE, bookies(0.2, 0.76, 0.5, 0.5, 0.5), Memory())
    assert d.disk_pressure == ("bookie bookie-1 is 76.0% full (warnRatio 75%)",)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"writable_ratio": 0.9, "read_only_ratio": 0.9}, "writableRatio < readOnlyRatio"),
    ({"read_only_ratio": 1.1}, "readOnlyRatio <= 1"),
    ({"warn_ratio": 0.95}, "warnRatio 0.95 must be in"),
])
def test_bad_watermarks_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Watermarks(**kwargs)


def test_bad_policies_are_refused() -> None:
    with pytest.raises(PolicyError, match="maxConcurrentBookies must be >= 1"):
        Policy(max_concurrent_bookies=0)
    with pytest.raises(PolicyError, match="outsideWindow must be one of wait, compact"):
        Policy(outside_window="panic")


# -- windows ------------------------------------------------------------------------------------------------

def test_a_window_gives_slots_fullest_first_and_passes_them_on() -> None:
    policy = Policy(windows=(NIGHT,), max_concurrent_bookies=2)
    state = bookies(0.3, 0.6, 0.5, 0.1)
    now = IN_WINDOW
    d = decide(now, policy, SHAPE, state, Memory())
    end = unix_ms(datetime(2026, 5, 4, 3, 0, tzinfo=UTC))
    assert sorted(kinds(d, OPEN_WINDOW)) == ["bookie-1", "bookie-2"]
    assert all(a.until_unix_ms == end for a in d.actions if a.kind == OPEN_WINDOW)
    assert sorted(kinds(d, CLOSE_WINDOW)) == ["bookie-0", "bookie-3"]  # they wait with a closed window
    state, memory = apply(state, d.actions, now), d.memory
    # bookie-1 runs a pass and finishes it; bookie-2 never starts one.
    now += timedelta(seconds=30)
    state[1] = replace(state[1], compacting=True)
    d = decide(now, policy, SHAPE, state, memory)
    assert d.actions == ()  # a fixed point: nothing to change
    now += timedelta(seconds=60)
    state[1] = replace(state[1], compacting=False, last_compaction_unix_ms=unix_ms(now) - 1000)
    d = decide(now, policy, SHAPE, state, d.memory)
    assert kinds(d, CLOSE_WINDOW) == ["bookie-1"] and kinds(d, OPEN_WINDOW) == ["bookie-0"]
    state, memory = apply(state, d.actions, now), d.memory
    now += timedelta(seconds=SLOT_IDLE_S)
    state[0] = replace(state[0], compacting=True)
    d = decide(now, policy, SHAPE, state, memory)  # bookie-2 idle for SLOT_IDLE_S: bookie-3's turn
    assert kinds(d, CLOSE_WINDOW) == ["bookie-2"] and kinds(d, OPEN_WINDOW) == ["bookie-3"]
    # Each bookie compacts once per window: bookie-1 is not offered a slot again.
    assert "bookie-1" in d.memory.compacted_in_stretch and "bookie-1" not in d.compacting_slots


def test_a_pass_counts_by_the_bookies_clock_not_the_operators() -> None:
    """A bookie whose clock runs 100 s behind the operator's finishes its pass at a time (its own) before the
    operator opened its slot (the operator's): the pass still frees the slot (the scenario test caught this)."""
    policy = Policy(windows=(NIGHT,), max_concurrent_bookies=1)
    state = bookies(0.5, 0.4, last_compaction_unix_ms=unix_ms(IN_WINDOW) - 86_400_000)
    d = decide(IN_WINDOW, policy, SHAPE, state, Memory())
    assert kinds(d, OPEN_WINDOW) == ["bookie-0"]
    state, memory = apply(state, d.actions, IN_WINDOW), d.memory
    now = IN_WINDOW + timedelta(seconds=10)
    state[0] = replace(state[0], last_compaction_unix_ms=unix_ms(now) - 100_000)
    d = decide(now, policy, SHAPE, state, memory)
    assert kinds(d, CLOSE_WINDOW) == ["bookie-0"] and kinds(d, OPEN_WINDOW) == ["bookie-1"]
    assert [a.until_unix_ms for a in d.actions if a.kind == CLOSE_WINDOW] == [CLOSED_UNIX_MS]


def test_outside_the_windows_every_window_is_closed() -> None:
    state = bookies(0.3, 0.3, 0.3, 0.3)
    state[2] = replace(state[2], window_until_unix_ms=0)  # 0: the bookie's own schedule
    state[3] = replace(state[3], window_until_unix_ms=unix_ms(OUTSIDE) + 1000)
    for b in (0, 1):
        state[b] = replace(state[b], window_until_unix_ms=unix_ms(OUTSIDE) - 1000)
    d = decide(OUTSIDE, Policy(windows=(NIGHT,)), SHAPE, state, Memory())
    assert sorted(kinds(d, CLOSE_WINDOW)) == ["bookie-2", "bookie-3"] and not kinds(d, OPEN_WINDOW)
    assert d.next_window == (datetime(2026, 5, 5, 2, 0, tzinfo=UTC), datetime(2026, 5, 5, 3, 0, tzinfo=UTC))


def test_an_emergency_window_outside_the_windows_only_when_asked() -> None:
    state = bookies(0.3, 0.8, 0.3, 0.3)
    waiting = decide(OUTSIDE, Policy(windows=(NIGHT,)), SHAPE, state, Memory())
    assert not kinds(waiting, OPEN_WINDOW)
    policy = Policy(windows=(NIGHT,), outside_window=OUTSIDE_COMPACT)
    d = decide(OUTSIDE, policy, SHAPE, state, Memory())
    assert kinds(d, OPEN_WINDOW) == ["bookie-1"]
    until = [a.until_unix_ms for a in d.actions if a.kind == OPEN_WINDOW]
    assert until == [unix_ms(OUTSIDE) + EMERGENCY_WINDOW_S * 1000]
    state = apply(state, d.actions, OUTSIDE)
    later = OUTSIDE + timedelta(seconds=EMERGENCY_WINDOW_S + 60)  # it ended; still full, but not again so soon
    d2 = decide(later, policy, SHAPE, state, d.memory)
    assert not kinds(d2, OPEN_WINDOW)
    d3 = decide(OUTSIDE + timedelta(seconds=2 * EMERGENCY_WINDOW_S), policy, SHAPE, state, d2.memory)
    assert kinds(d3, OPEN_WINDOW) == ["bookie-1"]


def test_a_policy_without_windows_leaves_compaction_to_the_bookies() -> None:
    d = decide(OUTSIDE, Policy(), SHAPE, bookies(0.3, 0.3, 0.3), Memory())
    assert d.actions == () and d.window is None and d.next_window is None


def test_an_unreachable_bookie_gives_up_its_slot() -> None:
    policy = Policy(windows=(NIGHT,))
    state = bookies(0.9, 0.3, 0.3)
    d = decide(IN_WINDOW, policy, SHAPE, state, Memory())
    assert kinds(d, OPEN_WINDOW) == ["bookie-0"]
    state = apply(state, d.actions, IN_WINDOW)
    state[0] = replace(state[0], reachable=False)
    d = decide(IN_WINDOW + timedelta(seconds=30), policy, SHAPE, state, d.memory)
    assert kinds(d, OPEN_WINDOW) == ["bookie-1"]


# -- properties ---------------------------------------------------------------------------------------------

usage = st.floats(0.0, 1.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 9), min_writable=st.integers(1, 5), concurrency=st.integers(1, 4),
       sequence=st.lists(st.lists(usage, min_size=9, max_size=9), min_size=1, max_size=12),
       start_min=st.integers(0, 7 * 24 * 60), step_s=st.integers(10, 900),
       outside=st.sampled_from(["wait", OUTSIDE_COMPACT]), zone=st.sampled_from(["UTC", "Europe/Berlin"]))
def test_properties_over_usage_sequences_and_clocks(n: int, min_writable: int, concurrency: int,
                                                    sequence: list[list[float]], start_min: int, step_s: int,
                                                    outside: str, zone: str) -> None:
    """Driving a simulated cluster through a sequence of disk usages and clock ticks:
    - never fewer writable bookies than a new ledger needs, because of the operator (unless there were already);
    - at most maxConcurrentBookies bookies hold a compaction window at once;
    - no flapping: a bookie is released only at or below writableRatio, forced only at or above readOnlyRatio;
    - outside the windows, a window is opened only as an emergency (and only with outsideWindow: compact);
    - deciding again on the state the actions produced changes nothing (a fixed point)."""
    policy = Policy(windows=(Window("0 2 * * *", 2 * 3600, zone), Window("30 14 * * 6", 3600, zone)),
                    max_concurrent_bookies=concurrency, outside_window=outside)
    wm = policy.watermarks
    shape = Shape(replicas=n, min_writable=min_writable)
    state = [Observed(f"bookie-{i}") for i in range(n)]
    memory = Memory()
    now = datetime(2026, 3, 23, tzinfo=UTC) + timedelta(minutes=start_min)
    for usages in sequence:
        state = [replace(b, disk_usage_ratio=usages[i]) for i, b in enumerate(state)]
        writable_before = sum(1 for b in state if b.writable)
        d = decide(now, policy, shape, state, memory)
        for a in d.actions:
            u = usages[int(a.bookie_id.split("-")[1])]
            if a.kind == FORCE_READ_ONLY:
                assert u >= wm.read_only_ratio
            if a.kind == RELEASE_READ_ONLY:
                assert u <= wm.writable_ratio
            if a.kind == OPEN_WINDOW and d.window is None:
                assert outside == OUTSIDE_COMPACT and u >= wm.warn_ratio
        state, memory = apply(state, d.actions, now), d.memory
        writable_after = sum(1 for b in state if b.writable)
        assert writable_after >= min(min_writable, writable_before)
        holding = [b for b in state if b.window_until_unix_ms > unix_ms(now)]
        assert len(holding) <= concurrency
        again = decide(now, policy, shape, state, memory)
        assert again.actions == (), again.actions
        now += timedelta(seconds=step_s)

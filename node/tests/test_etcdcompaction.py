"""The auditor's compaction of etcd, its decision part: scripts of ticks (time passed in) with what is noted and
what is compacted, and properties of the rule (history of at least one interval always stays)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octavo.node.config import ConfigError, NodeConfig
from octavo.node.etcdcompaction import EtcdCompaction, Noted, compaction_target, note, note_due


def run(script: list[tuple[float, int]], interval_s: float) -> list[tuple[float, int]]:
    """Ticks at (time, etcd's revision then) -> [(time, revision compacted to)], as EtcdCompaction does it."""
    noted: tuple[Noted, ...] = ()
    compacted, out = 0, []
    for now_s, revision in script:
        if not note_due(now_s, noted, interval_s):
            continue
        noted = note(noted, Noted(revision, now_s))
        target, noted = compaction_target(now_s, noted, interval_s)
        if target > compacted:
            compacted = target
            out.append((now_s, target))
    return out


def test_kubernetes_rule_compacts_to_the_revision_noted_one_interval_before() -> None:
    # a tick every second, 10 revisions a second, interval 300 s
    script = [(float(t), 10 * t) for t in range(0, 1000)]
    assert run(script, 300) == [(600.0, 3000), (900.0, 6000)]  # at 300 s the target is the first note, 0: none


def test_first_compaction_comes_one_interval_after_the_first_note() -> None:
    script = [(100.0, 5), (150.0, 9), (399.0, 20), (400.0, 21), (700.0, 40)]
    assert run(script, 300) == [(400.0, 5), (700.0, 21)]


def test_a_revision_lower_than_noted_starts_over() -> None:
    # etcd replaced (restored from a backup): what was noted of the old one is forgotten
    noted = note((Noted(500, 0.0), Noted(900, 10.0)), Noted(40, 20.0))
    assert noted == (Noted(40, 20.0),)
    assert compaction_target(25.0, noted, 10) == (0, noted)


def test_notes_out_of_time_order_are_refused() -> None:
    with pytest.raises(ValueError, match="time order"):
        note((Noted(5, 10.0),), Noted(6, 9.0))


def test_off_never_notes() -> None:
    assert not note_due(1e9, (), 0)
    with pytest.raises(ValueError):
        compaction_target(1.0, (), 0)


@given(st.lists(st.tuples(st.floats(0.0, 50.0), st.integers(0, 100)), max_size=60),
       st.integers(1, 120))
def test_history_of_at_least_one_interval_always_stays(steps: list[tuple[float, int]], interval_s: int) -> None:
    now_s, revision, noted = 0.0, 1, ()
    history: list[tuple[float, int]] = []  # (time, etcd's revision then)
    for dt, writes in steps:
        now_s += dt
        revision += writes
        history.append((now_s, revision))
        if not note_due(now_s, noted, interval_s):
            continue
        noted = note(noted, Noted(revision, now_s))
        target, noted = compaction_target(now_s, noted, interval_s)
        if target:
            # every revision etcd had within the last interval is still there after compacting to target
            assert all(target <= r for t, r in history if now_s - t < interval_s)
            assert target <= revision
        assert len(noted) <= 2  # memory stays bounded: the notes of the last interval only


@pytest.mark.parametrize("value, ok", [(0, True), (1, True), (300, True), (604800, True), (-1, False),
                                       (604801, False)])
def test_the_setting_is_checked(value: int, ok: bool) -> None:
    config = NodeConfig(data_dir="/d", etcd_compaction_interval_s=value)
    if ok:
        config.validate()
    else:
        with pytest.raises(ConfigError, match=r"etcd_compaction_interval_s must be in \[0, 604800\]"):
            config.validate()


@given(st.lists(st.integers(0, 10_000), max_size=4), st.integers(0, 600), st.integers(0, 20_000))
def test_next_due_is_when_a_tick_would_note_the_revision(times: list[int], interval_s: int, now_s: int) -> None:
    """The auditor's loop sleeps until next_due (autorecovery.py): a tick before it would have done nothing, and
    one at or after it notes etcd's revision."""
    compaction = EtcdCompaction(interval_s)
    compaction.noted = tuple(Noted(revision, float(at)) for revision, at in enumerate(sorted(times), start=1))
    assert compaction.next_due(False) is None
    due = compaction.next_due(True)
    if interval_s == 0:
        assert due is None
    else:
        assert due is not None and note_due(float(now_s), compaction.noted, interval_s) == (now_s >= due)

"""What a write handle does with a bookie's refusal (refusals.judge), and the bound on resending adds a bookie
refused for the moment (resends.py). Pure: no servers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from octavo.client.refusals import Action, judge
from octavo.client.resends import RESEND_ATTEMPTS_MAX, RESEND_PAUSE_S, RESEND_PAUSE_S_MAX, Resends, resend_pause_s
from octavo.meta.errors import LedgerFencedError, NoSuchLedgerError
from octavo.v1 import bookie_pb2 as pb


@pytest.mark.parametrize(("codes", "lac", "action"), [
    ([pb.OK, pb.OK], -1, Action.STORED),
    ([pb.UNAVAILABLE, pb.UNAVAILABLE], -1, Action.RESEND),
    ([pb.OK, pb.UNAVAILABLE], -1, Action.RESEND),
    ([pb.UNAVAILABLE, pb.INTERNAL], -1, Action.REPLACE),
    ([pb.INTERNAL, pb.UNAVAILABLE], -1, Action.REPLACE),
    ([pb.READ_ONLY, pb.READ_ONLY], -1, Action.REPLACE),
    ([pb.FENCED, pb.FENCED], 5, Action.STORED),  # late copies of acknowledged entries
    ([pb.FENCED, pb.FENCED], 4, Action.FAIL),
    ([pb.UNAVAILABLE, pb.NO_SUCH_LEDGER], -1, Action.FAIL),
])
def test_judge(codes: list[int], lac: int, action: Action) -> None:
    judged = judge(7, "b1", [4, 5], codes, "why", lac)
    assert judged.action is action
    assert (judged.error is not None) == (action is Action.FAIL)
    if action in (Action.RESEND, Action.REPLACE):
        assert judged.reason.startswith("refused adds: ") and "why" in judged.reason


def test_judge_errors_say_what() -> None:
    assert isinstance(judge(7, "b1", [5], [pb.FENCED], "", 4).error, LedgerFencedError)
    assert isinstance(judge(7, "b1", [5], [pb.NO_SUCH_LEDGER], "", 4).error, NoSuchLedgerError)


@pytest.mark.parametrize("attempt", [0, 1, 2, 5, 10, 100, 10_000])
def test_resend_pauses_double_to_a_cap_half_jittered(attempt: int) -> None:
    cap = min(RESEND_PAUSE_S_MAX, RESEND_PAUSE_S * 2 ** min(attempt, 30))
    assert resend_pause_s(attempt, lambda lo, hi: lo) == pytest.approx(cap / 2)
    assert resend_pause_s(attempt, lambda lo, hi: hi) == pytest.approx(cap)
    assert cap / 2 <= resend_pause_s(attempt) <= cap
    with pytest.raises(ValueError):
        resend_pause_s(-1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[..., object], tuple[Any, ...]]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> object:
        self.timers.append((self.now + delay, callback, args))
        return None

    def run_next(self) -> None:
        self.timers.sort(key=lambda t: t[0])
        when, callback, args = self.timers.pop(0)
        self.now = max(self.now, when)
        callback(*args)


def make(timeout_s: float) -> tuple[Clock, Resends, list[str], list[tuple[str, str]]]:
    clock, resent, replaced = Clock(), [], []
    resends = Resends(timeout_s, clock, resent.append, lambda b, why: replaced.append((b, why)))
    return clock, resends, resent, replaced


def test_a_streak_resends_until_add_timeout_then_replaces() -> None:
    clock, resends, resent, replaced = make(timeout_s=5.0)
    while not replaced:
        resends.refused("b1", "refused adds: UNAVAILABLE: etcd")
        if replaced:
            break
        assert "b1" in resends.paused and len(clock.timers) == 1
        clock.run_next()
        assert "b1" not in resends.paused
    assert clock.now <= 5.0 and resends.sent == len(resent) >= 5 and set(resent) == {"b1"}
    assert replaced[0][0] == "b1" and "add_timeout_s=5.0" in replaced[0][1] and "UNAVAILABLE" in replaced[0][1]
    assert not resends.streaks and not resends.paused  # the next refusal starts a new streak


def test_a_streak_is_bounded_in_attempts_too() -> None:
    clock, resends, resent, replaced = make(timeout_s=1e9)
    while not replaced:
        resends.refused("b1", "x")
        if clock.timers:
            clock.run_next()
    assert len(resent) == RESEND_ATTEMPTS_MAX


def test_stored_entries_end_the_streak_and_an_ended_pause_sends_nothing() -> None:
    clock, resends, resent, replaced = make(timeout_s=5.0)
    resends.refused("b1", "x")
    clock.run_next()
    resends.end("b1")  # it stored entries
    assert not resends.streaks
    clock.now = 100.0  # long after: a new streak, not the end of the old one
    resends.refused("b1", "x")
    resends.end("b1")  # replaced meanwhile
    clock.run_next()
    assert resent == ["b1"] and not replaced
    with pytest.raises(ValueError):
        Resends(0, clock, resent.append, lambda b, why: None)

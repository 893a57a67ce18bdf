"""The client's quorum decisions as scripts of events with expected outcomes (no servers): acknowledgement
marks, fence coverage and recovery's per-entry verdict."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octavo.client.quorums import (
    AckMarks,
    Answer,
    EntryAnswers,
    Verdict,
    fence_coverage_ok,
    recovery_verdict,
)
from octavo.meta.ledger_metadata import write_set

ENSEMBLE = ("a", "b", "c")

# Each script: (E, Qw, Qa, events, expected LAC after each event). Events: ("send", n) hands entries up to
# n - 1 to the bookies; ("ok", bookie, last) is an answer; ("fail", bookie); ("replace", old, new).
SCRIPTS = [
    ("qa2-of-3", ("a", "b", "c"), 3, 2, [
        (("send", 10), -1), (("ok", "a", 9), -1), (("ok", "b", 4), 4), (("ok", "c", 9), 9)]),
    ("answers-past-what-was-sent-never-count", ("a", "b", "c"), 3, 2, [
        (("send", 5), -1), (("ok", "a", 9), -1), (("ok", "b", 9), 4)]),
    ("a-failed-bookie-no-longer-vouches", ("a", "b", "c"), 3, 2, [
        (("send", 10), -1), (("ok", "a", 3), -1), (("fail", "a"), -1), (("ok", "a", 9), -1), (("ok", "b", 9), 3),
        (("ok", "c", 9), 9)]),
    ("a-replacement-starts-at-the-lac", ("a", "b", "c"), 3, 3, [
        (("send", 10), -1), (("ok", "a", 9), -1), (("ok", "b", 9), -1), (("fail", "c"), -1),
        (("replace", "c", "d"), -1), (("ok", "d", 9), 9)]),
    ("a-bookie-taken-back-after-quarantine-counts-again", ("a", "b", "c"), 3, 3, [
        # c fails, d replaces it; later a fails and c (reachable again) replaces a: c's answers count anew.
        (("send", 5), -1), (("ok", "a", 4), -1), (("ok", "b", 4), -1), (("fail", "c"), -1),
        (("replace", "c", "d"), -1), (("ok", "d", 4), 4), (("send", 10), 4), (("fail", "a"), 4),
        (("replace", "a", "c"), 4), (("ok", "b", 9), 4), (("ok", "d", 9), 4), (("ok", "c", 9), 9)]),
    ("striped-e3-qw2-qa2", ("a", "b", "c"), 2, 2, [
        # entry e lives on positions e%3 and e%3+1: 0 on a,b; 1 on b,c; 2 on c,a; 3 on a,b ...
        (("send", 6), -1), (("ok", "a", 5), -1), (("ok", "b", 4), 0), (("ok", "c", 5), 5)]),
    ("striped-a-gap-holds-everything-after-it", ("a", "b", "c"), 2, 1, [
        (("send", 6), -1), (("ok", "c", 5), -1), (("ok", "a", 5), 5)]),
]


@pytest.mark.parametrize(("name", "ensemble", "qw", "qa", "events"), SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_ack_scripts(name: str, ensemble: tuple[str, ...], qw: int, qa: int,
                     events: list[tuple[tuple[object, ...], int]]) -> None:
    acks = AckMarks(ensemble)
    current = list(ensemble)
    lac, sent = -1, 0
    for step, (event, expected) in enumerate(events):
        kind = event[0]
        if kind == "send":
            sent = int(event[1])  # type: ignore[call-overload]
        elif kind == "ok":
            acks.stored(str(event[1]), int(event[2]))  # type: ignore[call-overload]
        elif kind == "fail":
            acks.failed(str(event[1]))
        elif kind == "replace":
            old, new = str(event[1]), str(event[2])
            current[current.index(old)] = new
            acks.replaced(old, new, lac)
        lac = acks.acknowledged_up_to(lac, sent, current, qw, qa)
        assert lac == expected, f"{name}: after event {step} {event}: LAC {lac}, expected {expected}"


@given(st.data())
def test_acknowledged_means_qa_copies_of_every_entry(data: st.DataObject) -> None:
    """Whatever the answers, every entry up to the LAC has Qa bookies of its write set at or past it, and the
    LAC never passes what was sent."""
    size = data.draw(st.integers(1, 5))
    qw = data.draw(st.integers(1, size))
    qa = data.draw(st.integers(1, qw))
    ensemble = [f"b{i}" for i in range(size)]
    sent = data.draw(st.integers(0, 30))
    acks = AckMarks(ensemble)
    for bookie in ensemble:
        acks.stored(bookie, data.draw(st.integers(-1, 35)))
    lac = acks.acknowledged_up_to(-1, sent, ensemble, qw, qa)
    assert -1 <= lac < max(sent, 0) or lac == -1
    for e in range(lac + 1):
        held = sum(1 for p in write_set(e, size, qw) if acks.marks[ensemble[p]] >= e)
        assert held >= qa


def test_fence_coverage() -> None:
    # E3 Qw3 Qa2: every write quorum is the whole ensemble; (3 - 2) + 1 = 2 fenced bookies are needed.
    assert not fence_coverage_ok(ENSEMBLE, 3, 2, {"a"})
    assert fence_coverage_ok(ENSEMBLE, 3, 2, {"a", "c"})
    # E3 Qw2 Qa2: each write quorum needs 1; {a} leaves the quorum (b, c) unfenced.
    assert not fence_coverage_ok(ENSEMBLE, 2, 2, {"a"})
    assert fence_coverage_ok(ENSEMBLE, 2, 2, {"a", "b"})
    for fenced in itertools.chain.from_iterable(itertools.combinations(ENSEMBLE, k) for k in range(4)):
        assert fence_coverage_ok(ENSEMBLE, 3, 3, set(fenced)) == (len(fenced) >= 1)


H, N, C, U = Answer.HAS, Answer.HAS_NOT, Answer.CUT_SHORT, Answer.UNKNOWN
# (answers of the write set, suspects, Qw, Qa) -> verdict
VERDICTS = [
    ((H, N, N), (False, False, False), 3, 2, Verdict.FOUND),        # one copy is enough to keep it
    ((N, N, U), (False, False, False), 3, 2, Verdict.END),          # (3 - 2) + 1 = 2 denials
    ((N, U, U), (False, False, False), 3, 2, Verdict.UNDECIDED),    # one denial cannot decide
    ((N, N, U), (True, False, False), 3, 2, Verdict.UNDECIDED),     # a suspect's denial does not count
    ((C, N, N), (False, False, False), 3, 2, Verdict.RETRY),        # cut short: ask again
    ((H, C, U), (False, False, False), 3, 2, Verdict.FOUND),
    ((N, N, N), (False, False, False), 3, 3, Verdict.END),          # Qa = Qw: one denial is enough
    ((N, U, U), (False, False, False), 3, 3, Verdict.END),
    ((U, U, U), (False, False, False), 3, 3, Verdict.UNDECIDED),
    ((N, N), (False, False), 2, 1, Verdict.END),
    ((N, U), (False, False), 2, 1, Verdict.UNDECIDED),
]


@pytest.mark.parametrize(("answers", "suspect", "qw", "qa", "verdict"), VERDICTS)
def test_recovery_verdicts(answers: tuple[Answer, ...], suspect: tuple[bool, ...], qw: int, qa: int,
                           verdict: Verdict) -> None:
    assert recovery_verdict(EntryAnswers(answers, suspect), qw, qa) is verdict


@given(st.data())
def test_recovery_never_ends_before_an_entry_an_ack_quorum_holds(data: st.DataObject) -> None:
    """If Qa bookies of the write set hold the entry (the writer may have been told it is acknowledged), no
    mix of the other answers can end the ledger before it; and a suspect's denial never counts."""
    qw = data.draw(st.integers(1, 5))
    qa = data.draw(st.integers(1, qw))
    answers = data.draw(st.lists(st.sampled_from(list(Answer)), min_size=qw, max_size=qw))
    suspect = data.draw(st.lists(st.booleans(), min_size=qw, max_size=qw))
    verdict = recovery_verdict(EntryAnswers(tuple(answers), tuple(suspect)), qw, qa)
    holders = [i for i in range(qw) if answers[i] is Answer.HAS]
    if holders:
        assert verdict is Verdict.FOUND
    # Bookies that answered "has not" truthfully cannot hold it; an ack quorum needs Qa of the rest.
    trusted_denials = sum(1 for a, s in zip(answers, suspect, strict=True) if a is Answer.HAS_NOT and not s)
    if verdict is Verdict.END:
        assert qw - trusted_denials < qa

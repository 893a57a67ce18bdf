"""The choice of a replacement bookie (placement.choose_replacement), pure: a table of cases and a property test
over random clusters. No servers: the registrations, quarantine, clock and connection states are values."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octavo.client.placement import CONNECTING, IDLE, READY, UNREGISTERED, Replacement, choose_replacement
from octavo.meta.metadata import BookieInfo

ENSEMBLE = ("a", "b", "c")
NOW = 100.0
QUARANTINE_S = 10.0


def first(candidates: Sequence[str]) -> str:
    return sorted(candidates)[0]


def registered(*ids: str, readonly: tuple[str, ...] = (), small: tuple[str, ...] = ()) -> dict[str, BookieInfo]:
    return {b: BookieInfo(b, f"127.0.0.1:{i}", readonly=b in readonly,
                          entry_size_bytes_max=1000 if b in small else 0) for i, b in enumerate(ids)}


def choose(regs: dict[str, BookieInfo], quarantine: dict[str, float], states: dict[str, str]) -> Replacement:
    return choose_replacement("a", ENSEMBLE, regs, quarantine, NOW, QUARANTINE_S, 2000,
                              lambda b: states.get(b, READY), first)


# (name, registered, quarantine {bookie: failed at}, connection states, expected bookie, fallback)
CASES = [
    ("a-spare", registered("a", "b", "c", "d"), {}, {}, "d", False),
    ("the-first-of-several-by-pick", registered("a", "b", "c", "e", "d"), {}, {}, "d", False),
    ("not-tried-yet-is-taken", registered("a", "b", "c", "d"), {}, {"d": IDLE}, "d", False),
    ("none-outside-the-ensemble", registered("a", "b", "c"), {}, {}, None, False),
    ("read-only-never", registered("a", "b", "c", "d", readonly=("d",)), {}, {}, None, False),
    ("too-small-never", registered("a", "b", "c", "d", small=("d",)), {}, {}, None, False),
    ("reconnecting-is-not-taken-now", registered("a", "b", "c", "d"), {}, {"d": CONNECTING}, None, False),
    ("unregistered-is-not-taken", registered("a", "b", "c", "d"), {}, {"d": UNREGISTERED}, None, False),
    ("quarantined-and-reachable-as-a-fallback", registered("a", "b", "c", "d"), {"d": 95.0}, {}, "d", True),
    ("quarantined-and-unreachable-not-taken", registered("a", "b", "c", "d"), {"d": 95.0}, {"d": CONNECTING},
     None, False),
    ("quarantined-and-idle-not-taken", registered("a", "b", "c", "d"), {"d": 95.0}, {"d": IDLE}, None, False),
    ("a-ready-one-beats-a-fallback", registered("a", "b", "c", "d", "e"), {"d": 95.0}, {}, "e", False),
    ("quarantine-over", registered("a", "b", "c", "d"), {"d": 85.0}, {}, "d", False),
    ("nobody-registered", {}, {}, {}, None, False),
]


@pytest.mark.parametrize(("name", "regs", "quarantine", "states", "bookie", "fallback"), CASES,
                         ids=[c[0] for c in CASES])
def test_choose_replacement(name: str, regs: dict[str, BookieInfo], quarantine: dict[str, float],
                            states: dict[str, str], bookie: str | None, fallback: bool) -> None:
    got = choose(regs, quarantine, states)
    assert (got.bookie, got.fallback) == (bookie, fallback)
    if bookie is None or fallback:  # the reason names every registered bookie and why it could not be used
        assert got.reason == ("; ".join(f"{b} {why}" for b, why in sorted(got.choice.unusable.items()))
                              or "no bookie is registered")
        assert all(b in got.reason for b in regs)
    else:
        assert got.reason == ""


def test_the_reason_says_why() -> None:
    got = choose(registered("a", "b", "c", "d", "e", readonly=("d",)), {"e": 95.0}, {"e": CONNECTING})
    assert got.bookie is None
    assert "a is the one that failed" in got.reason
    assert "b is already in the ensemble" in got.reason
    assert "d is read-only" in got.reason
    assert "e failed on this ledger 5.0s ago (quarantined for bookie_quarantine_s=10) and is not reachable" \
        in got.reason
    assert choose({}, {}, {}).reason == "no bookie is registered"


def test_pick_chooses_among_the_candidates_only() -> None:
    seen: list[list[str]] = []

    def pick(candidates: Sequence[str]) -> str:
        seen.append(list(candidates))
        return candidates[-1]

    got = choose_replacement("a", ENSEMBLE, registered("a", "b", "c", "d", "e", "f", readonly=("f",)), {}, NOW,
                             QUARANTINE_S, 0, lambda b: READY, pick)
    assert seen == [["d", "e"]] and got.bookie == "e"


BOOKIES = ["a", "b", "c", "d", "e", "f", "g"]
STATES = [READY, IDLE, CONNECTING, UNREGISTERED]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, BookieInfo], dict[str, float], dict[str, str], int]:
    ids = draw(st.lists(st.sampled_from(BOOKIES), unique=True))
    regs = {b: BookieInfo(b, f"127.0.0.1:{i}", readonly=draw(st.booleans()),
                          entry_size_bytes_max=draw(st.sampled_from([0, 500, 5000]))) for i, b in enumerate(ids)}
    quarantine = {b: draw(st.floats(min_value=80.0, max_value=NOW)) for b in draw(st.lists(st.sampled_from(BOOKIES)))}
    states = {b: draw(st.sampled_from(STATES)) for b in BOOKIES}
    return regs, quarantine, states, draw(st.sampled_from([0, 1000, 10000]))


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_a_choice_is_always_usable_and_none_means_none_was(
        cluster: tuple[dict[str, BookieInfo], dict[str, float], dict[str, str], int]) -> None:
    regs, quarantine, states, largest = cluster

    def usable(b: str) -> bool:
        info = regs[b]
        return (b != "a" and b not in ENSEMBLE and not info.readonly
                and not 0 < info.entry_size_bytes_max < largest)

    def quarantined(b: str) -> bool:
        return b in quarantine and NOW - quarantine[b] < QUARANTINE_S

    got = choose_replacement("a", ENSEMBLE, regs, quarantine, NOW, QUARANTINE_S, largest, states.__getitem__, first)
    ready = [b for b in regs if usable(b) and not quarantined(b) and states[b] in (READY, IDLE)]
    fallback = [b for b in regs if usable(b) and quarantined(b) and states[b] == READY]
    if ready:
        assert got.bookie == first(ready) and not got.fallback
    elif fallback:
        assert got.bookie == first(fallback) and got.fallback
    else:
        assert got.bookie is None and not got.fallback
    if got.bookie is not None:
        assert got.bookie in regs and usable(got.bookie)
    if got.bookie is None or got.fallback:
        assert all(f"{b} " in got.reason for b in regs)

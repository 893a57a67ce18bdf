"""Choosing a replacement bookie (octavo.client.placement), as a table, and the client options' checks."""

from __future__ import annotations

import pytest

from octavo.client import ClientOptions
from octavo.client.placement import CONNECTING, IDLE, READY, UNREGISTERED, replacement_choice
from octavo.meta.metadata import BookieInfo

ENSEMBLE = ("a", "b", "c")


def registered(*ids: str, readonly: tuple[str, ...] = (), small: tuple[str, ...] = ()) -> dict[str, BookieInfo]:
    return {b: BookieInfo(b, f"127.0.0.1:{i}", readonly=b in readonly,
                          entry_size_bytes_max=1000 if b in small else 0) for i, b in enumerate(ids)}


# (name, registered, quarantine {bookie: failed at}, connection states, expected ready, fallback, waiting)
CASES = [
    ("a-spare-is-ready", registered("a", "b", "c", "d"), {}, {}, ["d"], [], []),
    ("the-failed-one-and-the-ensemble-never", registered("a", "b", "c"), {}, {}, [], [], []),
    ("read-only-never", registered("a", "b", "c", "d", readonly=("d",)), {}, {}, [], [], []),
    ("too-small-for-a-pending-entry", registered("a", "b", "c", "d", small=("d",)), {}, {}, [], [], []),
    ("not-tried-yet-counts-as-ready", registered("a", "b", "c", "d"), {}, {"d": IDLE}, ["d"], [], []),
    ("reconnecting-is-waited-for", registered("a", "b", "c", "d"), {}, {"d": CONNECTING}, [], [], ["d"]),
    ("quarantined-is-a-fallback", registered("a", "b", "c", "d"), {"d": 95.0}, {"d": READY}, [], ["d"], []),
    ("quarantine-expires", registered("a", "b", "c", "d"), {"d": 80.0}, {"d": READY}, ["d"], [], []),
    ("quarantined-and-unreachable-still-a-fallback", registered("a", "b", "c", "d"), {"d": 95.0},
     {"d": CONNECTING}, [], ["d"], []),
    ("gone-from-etcd-between-reads", registered("a", "b", "c", "d"), {}, {"d": UNREGISTERED}, [], [], []),
    ("several", registered("a", "b", "c", "d", "e", "f", "g", readonly=("g",)), {"e": 99.0},
     {"d": READY, "e": READY, "f": CONNECTING}, ["d"], ["e"], ["f"]),
]


@pytest.mark.parametrize(("name", "regs", "quarantine", "states", "ready", "fallback", "waiting"), CASES,
                         ids=[c[0] for c in CASES])
def test_replacement_choice(name: str, regs: dict[str, BookieInfo], quarantine: dict[str, float],
                            states: dict[str, str], ready: list[str], fallback: list[str], waiting: list[str]) -> None:
    choice = replacement_choice("a", ENSEMBLE, regs, quarantine, now=100.0, quarantine_s=10.0, largest_entry=2000,
                                connection_state=lambda b: states.get(b, READY))
    assert (choice.ready, choice.fallback, choice.waiting) == (ready, fallback, waiting)
    # Every registered bookie not ready has a reason, and the failed one is named as such.
    assert set(choice.unusable) == set(regs) - set(ready)
    if "a" in regs:
        assert choice.unusable["a"].startswith("is the one that failed")


def test_reasons_say_why() -> None:
    regs = registered("a", "b", "c", "d", "e", "f", readonly=("d",), small=("e",))
    choice = replacement_choice("a", ENSEMBLE, regs, {"f": 97.5}, now=100.0, quarantine_s=60.0, largest_entry=2000,
                                connection_state=lambda b: CONNECTING)
    assert choice.unusable["b"] == "is already in the ensemble"
    assert choice.unusable["d"] == "is read-only"
    assert "entry_size_bytes_max=1000, below a pending entry of 2000 bytes" in choice.unusable["e"]
    assert choice.unusable["f"] == ("failed on this ledger 2.5s ago (quarantined for bookie_quarantine_s=60) "
                                    "and is not reachable")


@pytest.mark.parametrize(("field", "value"), [("add_timeout_s", 0), ("inflight_bytes_max", -1),
                                              ("ensemble_change_wait_s", -1.0), ("bookie_quarantine_s", -5)])
def test_client_options_are_checked(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"ClientOptions.{field} must be"):
        ClientOptions(**{field: value})

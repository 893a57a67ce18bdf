"""The window of recovery's reads forward (RecoveryWindow, pure): it starts small, doubles while every id of a
window is found, stops growing at its maximum, and keeps its size when a read limit cut a reply short."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octavo.client.recovery import (
    DEFAULT_WINDOW,
    RECOVERY_WINDOW_ENTRIES_MAX,
    RECOVERY_WINDOW_FIRST_ENTRIES,
    RecoveryWindow,
)


def windows_for_tail(window: RecoveryWindow, tail: int) -> list[tuple[int, int]]:
    """The windows ([first id, size], ids counted from LAC + 1) recovery reads for a tail of `tail` entries that
    every bookie answers in full: every window before the one holding id `tail` (the first missing) is found
    whole."""
    out: list[tuple[int, int]] = []
    start, size = 0, window.first_entries
    while True:
        out.append((start, size))
        if tail < start + size:
            return out
        start += size
        size = window.next_entries(size, all_found=True)


def test_the_default_window_starts_at_16_and_stops_at_1000() -> None:
    assert (RECOVERY_WINDOW_FIRST_ENTRIES, RECOVERY_WINDOW_ENTRIES_MAX) == (16, 1000)
    assert RecoveryWindow(16, 1000) == DEFAULT_WINDOW


@pytest.mark.parametrize(("tail", "sizes"), [
    (0, [16]),
    (15, [16]),
    (16, [16, 32]),
    (17, [16, 32]),
    (1000, [16, 32, 64, 128, 256, 512]),
    (1008, [16, 32, 64, 128, 256, 512, 1000]),
    (5000, [16, 32, 64, 128, 256, 512, 1000, 1000, 1000, 1000]),
])
def test_window_sizes_for_a_tail(tail: int, sizes: list[int]) -> None:
    assert [size for _, size in windows_for_tail(DEFAULT_WINDOW, tail)] == sizes


def test_the_old_fixed_window_is_first_equal_to_max() -> None:
    assert [size for _, size in windows_for_tail(RecoveryWindow(1000, 1000), 5000)] == [1000] * 6


def test_a_window_cut_short_keeps_its_size() -> None:
    assert DEFAULT_WINDOW.next_entries(64, all_found=False) == 64
    assert DEFAULT_WINDOW.next_entries(16, all_found=False) == 16
    assert DEFAULT_WINDOW.next_entries(1000, all_found=True) == 1000
    assert DEFAULT_WINDOW.next_entries(512, all_found=True) == 1000


@pytest.mark.parametrize(("first", "entries_max"), [(0, 10), (11, 10), (-1, -1)])
def test_a_window_outside_its_limits_is_refused(first: int, entries_max: int) -> None:
    with pytest.raises(ValueError, match="first_entries <= entries_max"):
        RecoveryWindow(first, entries_max)


def test_a_size_the_window_never_has_is_refused() -> None:
    with pytest.raises(ValueError, match=r"window of 2000 ids outside \[16, 1000\]"):
        DEFAULT_WINDOW.next_entries(2000, all_found=True)


@given(first=st.integers(1, 64), growth=st.integers(0, 8), tail=st.integers(0, 50_000))
def test_windows_cover_the_tail_in_logarithmically_many_round_trips(first: int, growth: int, tail: int) -> None:
    entries_max = first * 2**growth + growth  # not always a power of two times first
    window = RecoveryWindow(first, entries_max)
    windows = windows_for_tail(window, tail)
    # Back to back from LAC + 1, through the first missing id, each within the limits and never smaller.
    assert windows[0] == (0, first)
    for (start, size), (nxt, nxt_size) in itertools.pairwise(windows):
        assert nxt == start + size and size <= nxt_size <= entries_max
    last_start, last_size = windows[-1]
    assert last_start <= tail < last_start + last_size
    # Doubling reaches the maximum after ceil(log2(max / first)) windows; then whole maximum windows.
    doublings = math.ceil(math.log2(entries_max / first))
    assert len(windows) <= doublings + 1 + tail // entries_max
    # A tail shorter than the first window costs one window of `first` ids, not one of the maximum.
    if tail < first:
        assert windows == [(0, first)]

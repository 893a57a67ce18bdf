"""Compaction windows: cron schedules in IANA time zones, to the minute, across daylight-saving changes. Pure:
every clock is fixed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octavo.operator.windows import Window, WindowError, next_window, open_until, parse_duration


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def fmt(span: tuple[datetime, datetime] | None) -> tuple[str, str] | None:
    return None if span is None else (span[0].strftime("%Y-%m-%d %H:%M"), span[1].strftime("%Y-%m-%d %H:%M"))


NIGHTLY_BERLIN = Window("30 2 * * *", 3600, "Europe/Berlin")


@pytest.mark.parametrize(("now", "open_now", "upcoming"), [
    # An ordinary winter night: 02:30 CET is 01:30 UTC; open to the minute, closed at its end.
    ("2026-01-10 01:29:59", None, ("2026-01-10 01:30", "2026-01-10 02:30")),
    ("2026-01-10 01:30:00", ("2026-01-10 01:30", "2026-01-10 02:30"), ("2026-01-11 01:30", "2026-01-11 02:30")),
    ("2026-01-10 02:29:59", ("2026-01-10 01:30", "2026-01-10 02:30"), ("2026-01-11 01:30", "2026-01-11 02:30")),
    ("2026-01-10 02:30:00", None, ("2026-01-11 01:30", "2026-01-11 02:30")),
    # Spring forward (29 March 2026): 02:30 does not exist in Berlin; cron runs it once, at 03:00 CEST (01:00
    # UTC), and the window still lasts one real hour.
    ("2026-03-29 00:59:00", None, ("2026-03-29 01:00", "2026-03-29 02:00")),
    ("2026-03-29 01:00:00", ("2026-03-29 01:00", "2026-03-29 02:00"), ("2026-03-30 00:30", "2026-03-30 01:30")),
    ("2026-03-29 02:00:00", None, ("2026-03-30 00:30", "2026-03-30 01:30")),
    # Fall back (25 October 2026): 02:30 happens twice; the window opens once, at the first (00:30 UTC), and
    # is not opened again an hour later.
    ("2026-10-25 00:30:00", ("2026-10-25 00:30", "2026-10-25 01:30"), ("2026-10-26 01:30", "2026-10-26 02:30")),
    ("2026-10-25 01:29:00", ("2026-10-25 00:30", "2026-10-25 01:30"), ("2026-10-26 01:30", "2026-10-26 02:30")),
    ("2026-10-25 01:30:00", None, ("2026-10-26 01:30", "2026-10-26 02:30")),
    ("2026-10-25 02:00:00", None, ("2026-10-26 01:30", "2026-10-26 02:30")),
])
def test_a_nightly_window_in_berlin(now: str, open_now: tuple[str, str] | None,
                                    upcoming: tuple[str, str] | None) -> None:
    assert fmt(open_until([NIGHTLY_BERLIN], utc(now))) == open_now
    assert fmt(next_window([NIGHTLY_BERLIN], utc(now))) == upcoming


def test_overlapping_and_chained_windows_make_one_stretch() -> None:
    weekdays = Window("0 22 * * 1-5", 2 * 3600, "UTC")       # 22:00-24:00 on weekdays
    after_midnight = Window("0 0 * * *", 3600, "UTC")        # 00:00-01:00 every day
    # Monday 2026-01-05 23:00: the weekday window runs into the midnight one.
    assert fmt(open_until([weekdays, after_midnight], utc("2026-01-05 23:00:00"))) == (
        "2026-01-05 22:00", "2026-01-06 01:00")
    # Saturday 23:00: only the midnight window is ahead.
    assert open_until([weekdays, after_midnight], utc("2026-01-10 23:00:00")) is None
    assert fmt(next_window([weekdays, after_midnight], utc("2026-01-10 23:00:00"))) == (
        "2026-01-11 00:00", "2026-01-11 01:00")


def test_a_window_in_a_zone_east_of_utc_opens_on_the_previous_utc_day() -> None:
    tokyo = Window("0 1 * * *", 1800, "Asia/Tokyo")  # 01:00 JST = 16:00 UTC the day before
    assert fmt(open_until([tokyo], utc("2026-06-30 16:10:00"))) == ("2026-06-30 16:00", "2026-06-30 16:30")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"schedule": "61 * * * *"}, "is not a cron expression"),
    ({"schedule": "0 0 30 2 *"}, "is not a cron expression"),
    ({"schedule": "@daily"}, "five cron fields"),
    ({"time_zone": "Mars/Olympus"}, "is not an IANA zone"),
    ({"duration_s": 30}, "between 1m and 168h"),
])
def test_bad_windows_are_refused_with_what_to_change(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"schedule": "0 2 * * *", "duration_s": 3600, "time_zone": "UTC", **kwargs}
    with pytest.raises(WindowError, match=message):
        Window(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "seconds"), [("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("1m", 60)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2d", "1.5h", "30s", "169h", "h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(WindowError):
        parse_duration(text)


ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "America/Santiago"]


@settings(max_examples=300, deadline=None)
@given(minute=st.integers(0, 59), hour=st.integers(0, 23), zone=st.sampled_from(ZONES),
       duration_min=st.integers(1, 600), offset_min=st.integers(0, 3 * 366 * 24 * 60))
def test_properties_of_a_daily_window(minute: int, hour: int, zone: str, duration_min: int, offset_min: int) -> None:
    """For any daily window and any minute of three years: open_until contains now and starts on a minute;
    next_window starts after now (after the open stretch, if one is open); and the minute before a window's
    start is not in that opening."""
    window = Window(f"{minute} {hour} * * *", duration_min * 60, zone)
    now = utc("2025-01-01 00:00:00") + timedelta(minutes=offset_min, seconds=17)
    span = open_until([window], now)
    if span is not None:
        assert span[0] <= now < span[1]
        assert span[0].second == 0 and (span[1] - span[0]).total_seconds() >= duration_min * 60
    upcoming = next_window([window], now)
    assert upcoming is not None
    assert upcoming[0] > (span[1] - timedelta(seconds=1) if span else now)
    assert upcoming[0] - now <= timedelta(days=2) + (span[1] - span[0] if span else timedelta())

"""Compaction windows: a cron schedule in an IANA time zone, and a duration. Pure: the time is passed in.

A window opens at each time its schedule names, read as wall-clock time in its zone (cron's reading, by
cronsim: a time that a daylight-saving jump skips runs once just after the jump, a time that repeats runs once),
and stays open for `duration` of real time (an hour-long window over a DST change lasts one hour). A window
that opens while another is open extends it: what counts is whether any window is open now, and until when.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

# A duration as Kubernetes writes them: "90m", "2h", "1h30m", "45s". At least a minute, at most a week.
DURATION_PATTERN = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?$"
WINDOW_DURATION_S_MIN = 60
WINDOW_DURATION_S_MAX = 7 * 24 * 3600


# A stretch of windows chained end to start is followed this many openings at most (a window opening every
# minute for an hour is one stretch without end: it is reported as open until the last end found).
CHAIN_MAX = 1000
# Starts skipped at most while looking for one strictly later (the repeated hour of a DST change).
STARTS_SKIPPED_MAX = 4


class WindowError(ValueError):
    """A window that cannot be: a bad cron expression, time zone or duration. The message says which."""


def parse_duration(text: str) -> int:
    """Seconds in a duration like "1h30m"."""
    m = re.fullmatch(DURATION_PATTERN, text.strip())
    if not text.strip() or m is None:
        raise WindowError(f"duration {text!r} is not like 90m, 2h or 1h30m")
    hours, minutes, seconds = (int(g[:-1]) if g else 0 for g in m.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if not WINDOW_DURATION_S_MIN <= total <= WINDOW_DURATION_S_MAX:
        raise WindowError(f"duration {text!r} must be between 1m and 168h")
    return total


def format_duration(seconds: int) -> str:
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or "0s"


@dataclass(frozen=True)
class Window:
    schedule: str      # five cron fields
    duration_s: int
    time_zone: str = "UTC"

    def __post_init__(self) -> None:
        try:
            zone = ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError) as e:
            raise WindowError(f"time zone {self.time_zone!r} is not an IANA zone (like Europe/Berlin)") from e
        if len(self.schedule.split()) != 5:
            raise WindowError(f"schedule {self.schedule!r} must have five cron fields (minute hour day month "
                              "weekday)")
        try:
            CronSim(self.schedule, datetime(2000, 1, 1, tzinfo=zone))
        except CronSimError as e:
            raise WindowError(f"schedule {self.schedule!r} is not a cron expression: {e}") from e
        if not WINDOW_DURATION_S_MIN <= self.duration_s <= WINDOW_DURATION_S_MAX:
            raise WindowError(f"duration {self.duration_s}s must be between 1m and 168h")

    def starts_after(self, after: datetime) -> datetime | None:
        """The first start strictly after `after` (aware), in UTC."""
        # In the hour a DST change repeats, cronsim can answer a wall-clock time that is earlier in real
        # time: skip what is not strictly later (cron runs such a time once, at its first occurrence).
        for _, start in zip(range(STARTS_SKIPPED_MAX), CronSim(self.schedule, after.astimezone(ZoneInfo(
                self.time_zone))), strict=False):
            start_utc = start.astimezone(UTC)
            if start_utc > after:
                return start_utc
        return None

    def open_at(self, now: datetime) -> tuple[datetime, datetime] | None:
        """(start, end) of the earliest opening of this window that contains `now`, if one does."""
        start = self.starts_after(now - timedelta(seconds=self.duration_s))
        if start is None or start > now:
            return None
        return start, start + timedelta(seconds=self.duration_s)


def open_until(windows: tuple[Window, ...] | list[Window], now: datetime) -> tuple[datetime, datetime] | None:
    """(start, end) of the stretch open at `now` over all windows: from the earliest start among those open to
    the latest end, following openings that begin before the stretch ends. None if none is open."""
    spans = [s for s in (w.open_at(now) for w in windows) if s is not None]
    if not spans:
        return None
    start = min(s for s, _ in spans)
    end = max(e for _, e in spans)
    for _ in range(CHAIN_MAX):  # an opening that contains the end goes on past it
        ends = [e for span in (w.open_at(end) for w in windows) if span is not None for e in span[1:]]
        if not ends:
            break
        end = max(ends)
    return start, end


def next_window(windows: tuple[Window, ...] | list[Window], now: datetime) -> tuple[datetime, datetime] | None:
    """The next stretch to open after `now`: after the one open now, if one is."""
    current = open_until(windows, now)
    after = current[1] if current is not None else now
    starts = [s for s in (w.starts_after(after) for w in windows) if s is not None]
    return open_until(windows, min(starts)) if starts else None

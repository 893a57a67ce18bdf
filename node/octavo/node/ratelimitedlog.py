"""Log lines a peer can cause (a request that does not parse, an admin call refused), limited so that a flood
of bad requests costs the log a bounded number of lines rather than one per request.

For each kind of line, at most `lines_max` lines per window of `window_s` seconds; the rest are counted, and
the first line let through after them says how many were dropped. The decision (`RateLimit.admit`) is pure:
the time comes in as an argument.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

LINES_MAX = 10  # per kind and window
WINDOW_S = 60.0
KINDS_MAX = 256  # kinds tracked; beyond that they share one (a peer cannot grow this table without bound)
OTHER_KIND = "(other)"
MESSAGE_CHARS_MAX = 300  # a line's message beyond this is cut: a peer's bytes never make a long line


class _Window:
    __slots__ = ("dropped", "lines", "start_s")

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.lines = 0
        self.dropped = 0  # lines dropped since the last line let through


class RateLimit:
    """Which lines of each kind go out: `lines_max` per `window_s` seconds, the rest counted."""

    def __init__(self, lines_max: int = LINES_MAX, window_s: float = WINDOW_S, kinds_max: int = KINDS_MAX) -> None:
        if lines_max < 1 or window_s <= 0 or kinds_max < 1:
            raise ValueError(f"rate limit needs lines_max >= 1, window_s > 0 and kinds_max >= 1, got {lines_max}, "
                             f"{window_s}, {kinds_max}")
        self.lines_max = lines_max
        self.window_s = window_s
        self.kinds_max = kinds_max
        self._windows: dict[str, _Window] = {}
        self.dropped_total = 0  # lines dropped since start, all kinds

    def admit(self, kind: str, now_s: float) -> int | None:
        """None: drop this line (it is counted). Otherwise let it through; the number is how many lines of this
        kind were dropped before it (0 when none)."""
        if kind not in self._windows and len(self._windows) >= self.kinds_max:
            kind = OTHER_KIND
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = _Window(now_s)
        if now_s - window.start_s >= self.window_s or now_s < window.start_s:  # a new window (or the clock stepped)
            window.start_s = now_s
            window.lines = 0
        if window.lines >= self.lines_max:
            window.dropped += 1
            self.dropped_total += 1
            return None
        window.lines += 1
        dropped, window.dropped = window.dropped, 0
        return dropped


class RateLimitedLog:
    """A logger's lines of each kind through a RateLimit; one line each, never a traceback."""

    def __init__(self, logger: logging.Logger, limit: RateLimit | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.limit = limit or RateLimit()
        self.clock = clock

    def warning(self, kind: str, message: str, **fields: Any) -> bool:
        """Log `message` (cut to MESSAGE_CHARS_MAX) unless this kind is over its limit; `fields` go into the record
        (the JSON log format writes them out). True when the line went out."""
        return self.log(logging.WARNING, kind, message, **fields)

    def error(self, kind: str, message: str, **fields: Any) -> bool:
        """As warning(), at ERROR level."""
        return self.log(logging.ERROR, kind, message, **fields)

    def log(self, level: int, kind: str, message: str, **fields: Any) -> bool:
        """Log `message` at `level` unless this kind is over its limit (warning() says the rest)."""
        dropped = self.limit.admit(kind, self.clock())
        if dropped is None:
            return False
        if len(message) > MESSAGE_CHARS_MAX:
            message = message[:MESSAGE_CHARS_MAX] + "..."
        if dropped:
            message += f" ({dropped} more like this dropped before this line: at most {self.limit.lines_max} per " \
                       f"{self.limit.window_s:g} s)"
            fields["dropped_lines"] = dropped
        self.logger.log(level, "%s", message, extra=fields)
        return True

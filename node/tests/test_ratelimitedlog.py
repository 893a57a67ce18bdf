"""The rate limit on lines a peer can cause: pure, with the time passed in."""

from __future__ import annotations

import logging
import sys

import pytest
from google.protobuf.message import DecodeError

from octavo.node.ratelimitedlog import MESSAGE_CHARS_MAX, OTHER_KIND, RateLimit, RateLimitedLog
from octavo.node.rpc import GrpcServicerErrors


def test_lines_max_per_window_then_counted_and_reported_by_the_next_line() -> None:
    limit = RateLimit(lines_max=3, window_s=10.0)
    assert [limit.admit("a", 0.0) for _ in range(3)] == [0, 0, 0]
    assert [limit.admit("a", 5.0) for _ in range(1000)] == [None] * 1000
    assert limit.admit("b", 5.0) == 0  # each kind has its own budget
    assert limit.admit("a", 9.999) is None
    assert limit.admit("a", 10.0) == 1001  # a new window: the first line says how many were dropped
    assert limit.admit("a", 10.0) == 0
    assert limit.dropped_total == 1001


def test_a_clock_stepping_back_opens_a_new_window() -> None:
    limit = RateLimit(lines_max=1, window_s=10.0)
    assert limit.admit("a", 100.0) == 0
    assert limit.admit("a", 101.0) is None
    assert limit.admit("a", 50.0) == 1


def test_kinds_are_bounded() -> None:
    limit = RateLimit(lines_max=1, window_s=10.0, kinds_max=4)
    for k in range(4):
        assert limit.admit(f"k{k}", 0.0) == 0
    assert limit.admit("new-1", 0.0) == 0  # beyond kinds_max: all new kinds share one budget
    assert limit.admit("new-2", 0.0) is None
    assert OTHER_KIND in limit._windows and len(limit._windows) == 5


@pytest.mark.parametrize("args", [(0, 1.0, 1), (1, 0.0, 1), (1, 1.0, 0)])
def test_limits_are_checked(args: tuple[int, float, int]) -> None:
    with pytest.raises(ValueError, match="rate limit needs"):
        RateLimit(*args)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _logger(name: str) -> tuple[logging.Logger, Lines]:
    logger = logging.getLogger(name)
    logger.propagate = False
    lines = Lines()
    logger.handlers = [lines]
    logger.setLevel(logging.INFO)
    return logger, lines


def test_the_log_says_how_many_were_dropped_and_cuts_long_messages() -> None:
    logger, lines = _logger("octavo.test.ratelimitedlog")
    now = [0.0]
    log = RateLimitedLog(logger, RateLimit(lines_max=2, window_s=60.0), clock=lambda: now[0])
    sent = [log.warning("malformed X", "bad request: " + "x" * 5000, event="bad_request") for _ in range(50)]
    assert sent == [True, True] + [False] * 48
    now[0] = 60.0
    assert log.warning("malformed X", "bad request again", event="bad_request")
    assert len(lines.records) == 3
    first, _, last = (r.getMessage() for r in lines.records)
    assert len(first) <= MESSAGE_CHARS_MAX + 3 and first.endswith("...")
    assert last == "bad request again (48 more like this dropped before this line: at most 2 per 60 s)"
    assert lines.records[2].dropped_lines == 48  # type: ignore[attr-defined]
    assert all(r.event == "bad_request" and r.exc_info is None for r in lines.records)  # type: ignore[attr-defined]


def _servicer_error(error: Exception, method: str) -> logging.LogRecord:
    try:
        raise error
    except Exception:
        exc_info = sys.exc_info()
    return logging.LogRecord(GrpcServicerErrors.LOGGER, logging.ERROR, "server.pyx", 1,
                             f"Unexpected [{type(error).__name__}] raised by servicer method [{method}]", None,
                             exc_info)


def test_grpc_servicer_errors_are_limited_and_decode_errors_lose_their_traceback() -> None:
    """The safety net on grpc's logger, for an exception that escapes a servicer."""
    net = GrpcServicerErrors()
    decode = [_servicer_error(DecodeError("Wire format was corrupt"), "/x.Y/Z") for _ in range(100)]
    passed = [r for r in decode if net.filter(r)]
    assert 1 <= len(passed) <= 10
    assert all(r.exc_info is None and r.levelno == logging.WARNING and "Wire format was corrupt" in r.getMessage()
               for r in passed)
    bug = _servicer_error(KeyError("k"), "/x.Y/Other")
    assert net.filter(bug) and bug.exc_info is not None  # a bug keeps its traceback (while under the limit)
    other = logging.LogRecord(GrpcServicerErrors.LOGGER, logging.INFO, "x", 1, "something else", None, None)
    assert all(net.filter(other) for _ in range(100))

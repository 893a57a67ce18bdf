"""Column statistics for data skipping: a ledger is skipped only when no row of it can match (soundness, checked
against the rows themselves), statistics survive encoding and merging, and bad metadata never prunes."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow", reason="the spark extra (make setup installs it)")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from octavo.client.colstats import (  # noqa: E402
    STATS_BYTES_MAX,
    STRING_PREFIX_CHARS,
    ColumnStats,
    LedgerStats,
    Predicate,
    combine,
    may_match,
)
from octavo.spark.skipping import StatsCollector, predicates  # noqa: E402

OPS = ["=", "<=>", "<", "<=", ">", ">=", "in", "is_null", "is_not_null", "starts_with"]


def holds(op: str, value: Any, literals: tuple[Any, ...]) -> bool:
    """Spark's meaning of one predicate on one row's value (None: SQL NULL, which no comparison matches)."""
    if op == "is_null":
        return value is None
    if op == "is_not_null":
        return value is not None
    if op == "<=>":
        return value == literals[0] if value is not None and literals[0] is not None else value is literals[0]
    if value is None:
        return False
    if op == "in":
        return any(v is not None and value == v for v in literals)
    lit = literals[0]
    if lit is None:
        return False
    return {"=": value == lit, "<": value < lit, "<=": value <= lit, ">": value > lit, ">=": value >= lit,
            "starts_with": isinstance(value, str) and value.startswith(lit)}[op]


def stats_of(*columns: tuple[str, pa.Array]) -> LedgerStats:
    collector = StatsCollector()
    collector.add(pa.RecordBatch.from_arrays([c for _, c in columns], names=[n for n, _ in columns]))
    decoded = LedgerStats.decode(collector.stats().encode())
    assert decoded is not None
    return decoded


values_int = st.lists(st.one_of(st.none(), st.integers(-50, 50)), min_size=1, max_size=30)
values_str = st.lists(st.one_of(st.none(), st.text("abcé\u00ff\U0001f600", max_size=4)), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(rows=values_int, op=st.sampled_from(OPS), lits=st.lists(st.one_of(st.none(), st.integers(-60, 60)),
                                                                min_size=1, max_size=3))
def test_an_int_ledger_is_skipped_only_when_no_row_matches(rows: list[int | None], op: str,
                                                           lits: list[int | None]) -> None:
    if op == "starts_with":
        return
    literals = tuple(lits) if op == "in" else (lits[0],)
    stats = stats_of(("x", pa.array(rows, pa.int64())))
    if not may_match(stats, [Predicate(op, "x", literals)]):
        assert not any(holds(op, v, literals) for v in rows), (rows, op, literals)


@settings(max_examples=300, deadline=None)
@given(rows=values_str, op=st.sampled_from(OPS), lit=st.text("abcé\u00ff\U0001f600", max_size=4))
def test_a_string_ledger_is_skipped_only_when_no_row_matches(rows: list[str | None], op: str, lit: str) -> None:
    stats = stats_of(("s", pa.array(rows, pa.string())))
    if not may_match(stats, [Predicate(op, "s", (lit,))]):
        assert not any(holds(op, v, (lit,)) for v in rows), (rows, op, lit)


def test_statistics_prune_what_they_prove_and_nothing_else() -> None:
    stats = stats_of(("x", pa.array([5, 9, None], pa.int64())), ("n", pa.array([None, None, None], pa.int64())))
    assert stats.columns["x"] == ColumnStats("int", 1, 5, 9)
    assert may_match(stats, [Predicate("=", "x", (7,))])
    assert not may_match(stats, [Predicate("=", "x", (10,))])
    assert not may_match(stats, [Predicate(">", "x", (9,))]) and may_match(stats, [Predicate(">=", "x", (9,))])
    assert not may_match(stats, [Predicate("<", "x", (5,))]) and may_match(stats, [Predicate("<=", "x", (5,))])
    assert not may_match(stats, [Predicate("in", "x", (1, 2, None))])
    assert may_match(stats, [Predicate("in", "x", (1, 6))])
    assert may_match(stats, [Predicate("is_null", "x")]) and may_match(stats, [Predicate("is_not_null", "x")])
    assert not may_match(stats, [Predicate("is_not_null", "n")]) and not may_match(stats, [Predicate("=", "n", (1,))])
    # AND of predicates: one that cannot match is enough.
    assert not may_match(stats, [Predicate(">", "x", (6,)), Predicate("<", "x", (5,))])
    # Unknown columns, no statistics, and literals of another type never prune.
    assert may_match(stats, [Predicate("=", "other", (1,))]) and may_match(None, [Predicate("=", "x", (10,))])
    assert may_match(stats, [Predicate("=", "x", ("ten",))])


def test_nan_infinities_and_long_strings_leave_their_bounds_unknown() -> None:
    inf = float("inf")
    collector = StatsCollector()
    for part in ([1.0, inf], [-inf, 0.5], [2.0]):  # an unknown bound stays unknown over later batches
        collector.add(pa.RecordBatch.from_arrays([pa.array(part)], names=["g"]))
    assert collector.stats().columns["g"] == ColumnStats("float", 0, None, None)
    stats = stats_of(("f", pa.array([1.0, float("nan")])), ("s", pa.array(["a", "z" * (STRING_PREFIX_CHARS + 5)])))
    assert stats.columns["f"].min is None and may_match(stats, [Predicate(">", "f", (100.0,))])
    assert stats.columns["s"].max is None and stats.columns["s"].min == "a"
    assert may_match(stats, [Predicate(">", "s", ("zz",))]) and not may_match(stats, [Predicate("<", "s", ("a",))])


def test_dates_timestamps_and_decimals_compare_in_their_domain() -> None:
    from pyspark.sql.datasource import EqualTo, GreaterThan, In, LessThan
    from pyspark.sql.types import DateType, DecimalType, StructField, StructType, TimestampNTZType, TimestampType

    utc = datetime.UTC
    stamps = [datetime.datetime(2026, 1, 1, 12, tzinfo=utc), datetime.datetime(2026, 1, 2, tzinfo=utc)]
    stats = stats_of(("ts", pa.array(stamps, pa.timestamp("us", tz="UTC"))),
                     ("day", pa.array([datetime.date(2026, 1, 1), datetime.date(2026, 1, 3)])),
                     ("dec", pa.array([decimal.Decimal("1.50"), decimal.Decimal("10.25")], pa.decimal128(38, 10))),
                     ("ntz", pa.array([datetime.datetime(2026, 1, 1), datetime.datetime(2026, 1, 5)],
                                      pa.timestamp("us"))))
    schema = StructType([StructField("ts", TimestampType()), StructField("day", DateType()),
                         StructField("dec", DecimalType(38, 10)), StructField("ntz", TimestampNTZType())])
    later = datetime.datetime(2026, 1, 2, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))  # 23:00 UTC
    assert not may_match(stats, predicates([GreaterThan(("ts",), datetime.datetime(2026, 1, 2, tzinfo=utc))], schema))
    assert may_match(stats, predicates([LessThan(("ts",), later)], schema))
    assert not may_match(stats, predicates([LessThan(("ts",), stamps[0])], schema))
    assert not may_match(stats, predicates([EqualTo(("day",), datetime.date(2026, 1, 4))], schema))
    assert may_match(stats, predicates([EqualTo(("day",), datetime.date(2026, 1, 2))], schema))
    assert not may_match(stats, predicates([In(("dec",), (decimal.Decimal("11"), decimal.Decimal("1.4")))], schema))
    assert may_match(stats, predicates([EqualTo(("dec",), decimal.Decimal("10.25"))], schema))
    assert not may_match(stats, predicates([GreaterThan(("ntz",), datetime.datetime(2026, 1, 5))], schema))
    # A zoned literal for a local-time column (or the reverse) is not compared: it prunes nothing.
    assert predicates([GreaterThan(("ntz",), later)], schema) == []


def test_merged_ledgers_combine_their_statistics() -> None:
    a = stats_of(("x", pa.array([1, 2], pa.int64())), ("s", pa.array(["m", None])))
    b = stats_of(("x", pa.array([None, 8], pa.int64())))  # written before column s existed: all null there
    both = combine([a, b])
    assert both is not None and both.rows == 4
    assert both.columns["x"] == ColumnStats("int", 1, 1, 8)
    assert both.columns["s"] == ColumnStats("str", 3, "m", "m")
    assert combine([a, None]) is None  # a source without statistics: the merged ledger keeps none
    nan = stats_of(("x", pa.array([0.5, float("nan")])))
    floats = combine([stats_of(("x", pa.array([0.1, 0.2]))), nan])
    assert floats is not None and floats.columns["x"].min is None  # one side unknown: the whole is unknown
    mixed = combine([a, stats_of(("x", pa.array(["text"])))])  # a column whose kind changed keeps none
    assert mixed is not None and "x" not in mixed.columns


def test_bad_or_oversized_statistics_prune_nothing() -> None:
    for text in ("", "{", '{"v": 99, "rows": 1, "columns": {}}', '{"v": 1, "rows": -1, "columns": {}}',
                 '{"v": 1, "rows": 2, "columns": {"x": ["int", 5, 1, 2]}}',
                 '{"v": 1, "rows": 2, "columns": {"x": ["blob", 0, 1, 2]}}', '[1, 2]'):
        assert LedgerStats.decode(text) is None, text
    wide = LedgerStats(1, {f"c{i}": ColumnStats("str", 0, "v" * 60, "v" * 60) for i in range(400)})
    assert wide.encode() is None and len(str(wide.columns)) > STATS_BYTES_MAX

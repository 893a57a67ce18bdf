"""Per-ledger column statistics for data skipping (docs/spark.md, "Data skipping").

A dataset ledger written by the Spark sink carries, in its own metadata in etcd (custom metadata key STATS_KEY,
set when the ledger is closed; never in the dataset's commit key), each skippable column's minimum, maximum and
null count, and the ledger's row count. A reader with `data_skipping` turns Spark's pushed filters into
`Predicate`s and skips the ledgers whose statistics prove no row can match. The statistics only prune: every
filter is still evaluated by Spark on the rows read, so a ledger without statistics (written before they
existed, closed by a recovery, or merged from ledgers without them) is simply read.

Values are kept in one ordered domain per kind, all comparable with Python's own ordering and JSON-safe:

    int, bool, float     as themselves (a float column holding NaN keeps no min/max: Spark orders NaN above
                         every number, and an exact bound is simpler than a special case)
    str                  the minimum cut to STRING_PREFIX_CHARS characters (a cut prefix is still a lower
                         bound); the maximum only when it is that short (else no upper bound). Python orders
                         str by code point, which is the order of UTF-8 bytes, Spark's binary collation; a
                         string column with another collation keeps no statistics
    date                 days since 1970-01-01
    timestamp            microseconds since the epoch (UTC); timestamp_ntz: its wall clock read as UTC
    decimal              the decimal's text, compared as decimal.Decimal

Pure: no IO; the Spark side (octavo.spark.skipping) computes statistics from Arrow batches and maps filters.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# The custom metadata key of a ledger's statistics.
STATS_KEY = "octavo.stats"
# Named limits: statistics are kept for at most this many columns (the first skippable ones in schema order),
# strings are cut to this many characters, and statistics over this many bytes are not kept at all.
STATS_COLUMNS_MAX = 64
STRING_PREFIX_CHARS = 64
STATS_BYTES_MAX = 16 * 1024
FORMAT_VERSION = 1

KINDS = ("int", "float", "bool", "str", "date", "ts", "ts_ntz", "decimal")
OPS = ("=", "<=>", "<", "<=", ">", ">=", "in", "is_null", "is_not_null", "starts_with")


@dataclass
class ColumnStats:
    """A column's statistics in one ledger: its null count, and the least and greatest non-null value, each
    None when unknown (a NaN in a float column, a long string's maximum) or when every value is null."""

    kind: str
    nulls: int = 0
    min: Any = None
    max: Any = None


@dataclass
class LedgerStats:
    rows: int
    columns: dict[str, ColumnStats] = field(default_factory=dict)

    def encode(self) -> str | None:
        """The JSON kept in the ledger's metadata; None when over STATS_BYTES_MAX (the ledger keeps none)."""
        doc = {"v": FORMAT_VERSION, "rows": self.rows,
               "columns": {name: [c.kind, c.nulls, c.min, c.max] for name, c in self.columns.items()}}
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
        return text if len(text.encode()) <= STATS_BYTES_MAX else None

    @staticmethod
    def decode(text: str | None) -> LedgerStats | None:
        """The statistics in a ledger's metadata; None when absent, of an unknown version, or malformed (a
        ledger without usable statistics is read, never skipped)."""
        if not text:
            return None
        try:
            doc = json.loads(text)
            rows = doc["rows"] if doc.get("v") == FORMAT_VERSION else None
            if not isinstance(rows, int) or not _count(rows):
                return None
            columns = {}
            for name, (kind, nulls, lo, hi) in doc["columns"].items():
                if kind not in KINDS or not _count(nulls) or nulls > rows:
                    return None
                columns[str(name)] = ColumnStats(kind, nulls, lo, hi)
            return LedgerStats(rows, columns)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def combine(parts: Sequence[LedgerStats | None]) -> LedgerStats | None:
    """Statistics of ledgers copied into one (a merge): None unless every part has statistics. A column missing
    from a part (added later by mergeSchema) is all null there; a column whose kind differs between parts keeps
    no statistics."""
    if not parts or any(p is None for p in parts):
        return None
    known = [p for p in parts if p is not None]
    names: list[str] = []
    for p in known:
        names += [n for n in p.columns if n not in names]
    out = LedgerStats(sum(p.rows for p in known))
    for name in names:
        kinds = {p.columns[name].kind for p in known if name in p.columns}
        if len(kinds) != 1:
            continue
        kind = kinds.pop()
        nulls = 0
        lo: Any = None
        hi: Any = None
        lo_known = hi_known = True
        for p in known:
            c = p.columns.get(name) or ColumnStats(kind, nulls=p.rows)
            nulls += c.nulls
            if c.nulls >= p.rows:
                continue  # no value here: nothing to bound
            lo_known = lo_known and c.min is not None
            hi_known = hi_known and c.max is not None
            lo = _extreme(kind, lo, c.min, min) if lo_known else None
            hi = _extreme(kind, hi, c.max, max) if hi_known else None
        out.columns[name] = ColumnStats(kind, nulls, lo, hi)
    return out


@dataclass(frozen=True)
class Predicate:
    """One pushed filter on a top-level column, its literal(s) already in the column kind's domain."""

    op: str
    column: str
    values: tuple[Any, ...] = ()


def may_match(stats: LedgerStats | None, predicates: Iterable[Predicate]) -> bool:
    """False only when the statistics prove that no row of the ledger satisfies every predicate (their AND).
    Unknown statistics, a column without statistics, or a literal that cannot be compared: True (read it)."""
    if stats is None:
        return True
    return all(_may_match_one(stats, p) for p in predicates)


def _may_match_one(stats: LedgerStats, p: Predicate) -> bool:
    c = stats.columns.get(p.column)
    if c is None:
        return True
    if p.op == "is_null":
        return c.nulls > 0
    if p.op == "is_not_null":
        return c.nulls < stats.rows
    if p.op == "<=>" and p.values == (None,):
        return c.nulls > 0
    if c.nulls >= stats.rows:  # every value null: no comparison with a literal is true
        return False
    try:
        lo = _value(c.kind, c.min)
        hi = _value(c.kind, c.max)
        values = [_value(c.kind, v) for v in p.values]
        if p.op in ("=", "<=>"):
            return _may_equal(lo, hi, values[0])
        if p.op == "in":
            return any(v is not None and _may_equal(lo, hi, v) for v in values)
        v = values[0]
        if v is None:
            return True
        if p.op == "<":
            return lo is None or lo < v
        if p.op == "<=":
            return lo is None or lo <= v
        if p.op == ">":
            return hi is None or hi > v
        if p.op == ">=":
            return hi is None or hi >= v
        if p.op == "starts_with" and c.kind == "str":
            if lo is not None and lo[:len(v)] > v:
                return False
            return hi is None or hi >= v
    except (TypeError, ValueError, decimal.InvalidOperation):
        return True
    return True


def _may_equal(lo: Any, hi: Any, v: Any) -> bool:
    if v is None:
        return False  # col = NULL is never true
    if lo is not None and v < lo:
        return False
    return not (hi is not None and v > hi)


def _value(kind: str, v: Any) -> Any:
    if v is None:
        return None
    if kind == "decimal":
        return decimal.Decimal(str(v))
    return v


def _extreme(kind: str, a: Any, b: Any, pick: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    if kind == "decimal":
        return str(pick(decimal.Decimal(str(a)), decimal.Decimal(str(b))))
    return pick(a, b)

"""Data skipping on the Spark side (docs/spark.md, "Data skipping"): column statistics computed from the Arrow
batches a sink task writes (kept in the ledger's metadata when it closes, octavo.client.colstats), and
Spark's pushed filters turned into predicates that prune ledgers at planning.

Only pruning: the reader hands every filter back to Spark, which evaluates it on the rows read, so results are
exact whatever the statistics say (PySpark evaluates no filter the reader keeps)."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from octavo.client.colstats import (
    STATS_COLUMNS_MAX,
    STATS_KEY,
    STRING_PREFIX_CHARS,
    ColumnStats,
    LedgerStats,
    Predicate,
)
from octavo.client.dataset import DatasetLedger
from octavo.meta.errors import OctavoError

log = logging.getLogger(__name__)

# At most this many ledgers' metadata read from etcd at once while planning a skipping read.
STATS_READS_IN_FLIGHT_MAX = 64
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


# -- writing: statistics of the batches a task writes ---------------------------------------------------
def _kind(t: pa.DataType) -> str | None:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_date32(t) or pa.types.is_date64(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "ts" if t.tz else "ts_ntz"
    if pa.types.is_decimal(t):
        return "decimal"
    return None


def _domain(kind: str, column: pa.Array) -> pa.Array:
    """The column in the statistics' domain: dates as days, timestamps as microseconds (UTC for zoned ones)."""
    if kind == "date":
        return column.cast(pa.date32()).cast(pa.int32())
    if kind in ("ts", "ts_ntz"):
        return column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
    return column


class StatsCollector:
    """Accumulates LedgerStats over the record batches of one ledger."""

    def __init__(self) -> None:
        self.rows = 0
        self.columns: dict[str, ColumnStats] = {}
        self.unknown: set[str] = set()  # columns whose bounds are unknown (a NaN, a type change)

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        kept = 0
        for f, column in zip(batch.schema, batch.columns, strict=True):
            kind = _kind(f.type)
            if kind is None or (f.name not in self.columns and kept >= STATS_COLUMNS_MAX):
                continue
            kept += 1
            self._add_column(f.name, kind, column)

    def _add_column(self, name: str, kind: str, column: pa.Array) -> None:
        c = self.columns.setdefault(name, ColumnStats(kind))
        if c.kind != kind:
            self.unknown.add(name)
        c.nulls += column.null_count
        if column.null_count == len(column) or name in self.unknown:
            return
        if kind == "float" and pc.any(pc.is_nan(column)).as_py():
            self.unknown.add(name)
            return
        bounds = pc.min_max(_domain(kind, column)).as_py()
        lo, hi = bounds["min"], bounds["max"]
        if kind == "decimal":
            lo, hi = str(lo), str(hi)
        elif kind == "str":
            lo, hi = lo[:STRING_PREFIX_CHARS], hi if len(hi) <= STRING_PREFIX_CHARS else None
        elif kind == "float":  # an infinity is no bound (and no JSON number)
            lo, hi = (v if math.isfinite(v) else None for v in (lo, hi))
        self._bound(name, "min", kind, lo, min)
        self._bound(name, "max", kind, hi, max)

    def _bound(self, name: str, side: str, kind: str, value: Any, pick: Any) -> None:
        """Fold one batch's bound in; once a batch's bound is unknown, the ledger's is (sticky)."""
        c = self.columns[name]
        if value is None:
            self.unknown.add(f"{name}\0{side}")
            return
        old = getattr(c, side)
        setattr(c, side, value if old is None else _pick(kind, old, value, pick))

    def stats(self) -> LedgerStats:
        out = LedgerStats(self.rows)
        for name, c in self.columns.items():
            if name in self.unknown:
                c = ColumnStats(c.kind, c.nulls)
            else:
                c = ColumnStats(c.kind, c.nulls, None if f"{name}\0min" in self.unknown else c.min,
                                None if f"{name}\0max" in self.unknown else c.max)
            out.columns[name] = c
        return out

    def metadata(self) -> dict[str, str]:
        """The ledger's custom metadata entry for its statistics (none when they are over STATS_BYTES_MAX)."""
        text = self.stats().encode()
        return {STATS_KEY: text} if text is not None else {}


def _pick(kind: str, a: Any, b: Any, pick: Any) -> Any:
    if kind == "decimal":
        return str(pick(decimal.Decimal(a), decimal.Decimal(b)))
    return pick(a, b)


# -- reading: pushed filters as predicates ----------------------------------------------------------
_OPS: dict[type, str] = {EqualTo: "=", EqualNullSafe: "<=>", GreaterThan: ">", GreaterThanOrEqual: ">=",
                         LessThan: "<", LessThanOrEqual: "<=", In: "in", IsNull: "is_null",
                         IsNotNull: "is_not_null", StringStartsWith: "starts_with"}


def predicates(filters: Iterable[Filter], schema: StructType) -> list[Predicate]:
    """The filters that statistics can decide, as predicates; any other filter (Not, StringEndsWith, a nested
    column, a collated string, a literal of another type) prunes nothing."""
    out = []
    types = {f.name: f.dataType for f in schema.fields}
    for f in filters:
        op = _OPS.get(type(f))
        path: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
        if op is None or len(path) != 1 or path[0] not in types:
            continue
        column = path[0]
        kind = _spark_kind(types[column])
        if kind is None:
            continue
        if op in ("is_null", "is_not_null"):
            out.append(Predicate(op, column))
            continue
        value: Any = getattr(f, "value", None)
        raw = tuple(value) if op == "in" else (value,)
        try:
            values = tuple(_literal(kind, v) for v in raw)
        except (TypeError, ValueError, decimal.InvalidOperation):
            continue
        out.append(Predicate(op, column, values))
    return out


def _spark_kind(t: DataType) -> str | None:
    if isinstance(t, BooleanType):
        return "bool"
    if isinstance(t, IntegralType):
        return "int"
    if isinstance(t, FloatType | DoubleType):
        return "float"
    if isinstance(t, StringType):
        # Another collation orders (and equates) strings otherwise than their code points.
        return "str" if getattr(t, "collation", "UTF8_BINARY") == "UTF8_BINARY" else None
    if isinstance(t, DateType):
        return "date"
    if isinstance(t, TimestampType):
        return "ts"
    if isinstance(t, TimestampNTZType):
        return "ts_ntz"
    if isinstance(t, DecimalType):
        return "decimal"
    return None


def _literal(kind: str, v: Any) -> Any:
    """A filter's literal in the statistics' domain (TypeError when it is not of the column's type)."""
    if v is None:
        return None
    if kind == "bool" and isinstance(v, bool):
        return v
    if kind == "int" and isinstance(v, int) and not isinstance(v, bool):
        return v
    if kind == "float" and isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    if kind == "str" and isinstance(v, str):
        return v
    if kind == "date" and isinstance(v, datetime.date) and not isinstance(v, datetime.datetime):
        return (v - datetime.date(1970, 1, 1)).days
    if kind == "ts" and isinstance(v, datetime.datetime) and v.tzinfo is not None:
        return _micros(v - _EPOCH_UTC)
    if kind == "ts_ntz" and isinstance(v, datetime.datetime) and v.tzinfo is None:
        return _micros(v - _EPOCH)
    if kind == "decimal" and isinstance(v, decimal.Decimal | int) and not isinstance(v, bool):
        return str(v)
    raise TypeError(f"a {type(v).__name__} literal for a {kind} column")


def _micros(d: datetime.timedelta) -> int:
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


async def ledger_stats(client: Any, ledgers: Sequence[DatasetLedger]) -> list[LedgerStats | None]:
    """Each ledger's statistics, read from its metadata in etcd (STATS_READS_IN_FLIGHT_MAX at once); None for a
    ledger without them or whose metadata cannot be read (it is read, never skipped)."""
    gate = asyncio.Semaphore(STATS_READS_IN_FLIGHT_MAX)

    async def one(x: DatasetLedger) -> LedgerStats | None:
        async with gate:
            try:
                meta, _ = await client.metadata_store.read_ledger(x.ledger_id)
            except OctavoError:
                return None
        stats = LedgerStats.decode(meta.custom_metadata.get(STATS_KEY))
        return stats if stats is not None and stats.rows == x.rows else None

    return list(await asyncio.gather(*(one(x) for x in ledgers)))

"""Spark discovers Python data sources in top-level packages named `pyspark_*` that define `DefaultSource`:
this one makes `format("octavo")` work without a register() call."""

from octavo.spark.source import OctavoDataSource as DefaultSource

__all__ = ["DefaultSource"]

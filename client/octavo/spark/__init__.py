"""Octavo as a Spark data source (`spark.read.format("octavo")`, `df.write.format("octavo")`).

Installed with the `spark` extra (pyspark >= 4, pyarrow). Spark finds the source by itself through the
top-level package `pyspark_octavo` (Spark's convention for Python data sources); `register(spark)` does the
same explicitly. See docs/spark.md.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the `octavo` data source with a Spark session (needed only where auto-discovery is off)."""
    from octavo.spark.source import OctavoDataSource

    spark.dataSource.register(OctavoDataSource)

"""Makes ``spark.read.format("warren")`` work without ``warren.spark.register(spark)``.

pyspark (4.0 and later) looks once per Spark application for top-level
modules named ``pyspark_*`` with a ``DefaultSource`` (a DataSource class)
and registers each under its ``name()``. The lookup runs in the Python
Spark starts for its workers (``PYSPARK_PYTHON``, else ``python3`` from
PATH), so it finds this only where that Python has Warren;
``warren.spark.register(spark)`` works regardless (docs/spark.md). Without
pyarrow or with a pyspark too old for the source, this module defines
nothing, so the lookup of other data sources goes on unharmed.
"""

from __future__ import annotations

__all__ = ["DefaultSource"]

try:
    import pyspark

    from warren.spark import MIN_PYSPARK

    _version = tuple(int(p) for p in pyspark.__version__.split(".")[:2] if p.isdigit())
    if _version >= MIN_PYSPARK:
        from warren.spark.source import WarrenDataSource as DefaultSource
except ImportError:  # pragma: no cover - the spark extra is not installed
    pass

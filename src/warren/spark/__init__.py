"""``warren``: a PySpark data source for stream queues, and a sink (docs/spark.md).

    df = spark.read.format("warren").option("url", url).option("queue", "events").load()

pyspark finds the source by its name through the ``pyspark_warren`` package;
where its lookup cannot (another Python on the driver), ``register(spark)``.

Needs the ``spark`` extra (pyspark >= 4.2, pyarrow). Nothing in the broker
imports this package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MIN_PYSPARK", "register"]

#: Admission control (maxRecordsPerTrigger) and trigger(availableNow=True) for
#: Python streaming sources arrived in Spark 4.2.
MIN_PYSPARK = (4, 2)


def register(spark: Any) -> None:
    """Register the ``warren`` format with a SparkSession (``spark.dataSource.register``)."""
    import pyspark

    version = tuple(int(p) for p in pyspark.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_PYSPARK:
        raise RuntimeError(
            f"warren.spark needs pyspark >= {'.'.join(map(str, MIN_PYSPARK))}, "
            f"found {pyspark.__version__}"
        )
    from warren.spark.source import WarrenDataSource

    spark.dataSource.register(WarrenDataSource)

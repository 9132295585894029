"""``warren``: a PySpark data source for stream queues, and a sink (docs/spark.md).

    df = spark.read.format("warren").option("url", url).option("queue", "events").load()

pyspark finds the source by its name through the ``pyspark_warren`` package
when the Python its workers run has Warren; ``register(spark)`` works with
any, and on a local session makes the workers run this interpreter.

Needs the ``spark`` extra (pyspark >= 4.2, pyarrow). Nothing in the broker
imports this package.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["MIN_PYSPARK", "register", "worker_python"]

#: Admission control (maxRecordsPerTrigger) and trigger(availableNow=True) for
#: Python streaming sources arrived in Spark 4.2.
MIN_PYSPARK = (4, 2)


def register(spark: Any) -> None:
    """Register the ``warren`` format with a SparkSession (``spark.dataSource.register``).

    pyspark pickles the source with the interpreter its Python workers start
    (``SparkContext.pythonExec``: ``PYSPARK_PYTHON``, else ``python3`` from
    PATH, which is rarely the one with Warren). ``worker_python`` says which
    one to use instead; the source is registered with it, and only it.
    """
    import pyspark

    version = tuple(int(p) for p in pyspark.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_PYSPARK:
        raise RuntimeError(
            f"warren.spark needs pyspark >= {'.'.join(map(str, MIN_PYSPARK))}, "
            f"found {pyspark.__version__}"
        )
    from warren.spark.source import WarrenDataSource

    context = _classic_context(spark)
    python = worker_python(context) if context is not None else None
    if python is None:
        spark.dataSource.register(WarrenDataSource)
        return
    # dataSource.register wraps the class in a Python function carrying
    # context.pythonExec: the planner processes and the tasks of every read
    # and write of this format run that interpreter.
    previous = context.pythonExec
    context.pythonExec = python
    try:
        spark.dataSource.register(WarrenDataSource)
    finally:
        context.pythonExec = previous


def worker_python(context: Any) -> str | None:
    """The interpreter the source's Python workers should run, or None for Spark's own.

    ``PYSPARK_PYTHON`` in the driver's environment is Spark's choice and stays.
    Without it Spark starts ``python3`` from PATH, even when the session was
    built with ``spark.pyspark.python`` (that setting is read only by
    spark-submit), so: that setting when given, else, on a local master (the
    workers run on this machine), this interpreter. A cluster's executors keep
    ``python3``: their interpreter is the deployment's (docs/spark.md).
    """
    if os.environ.get("PYSPARK_PYTHON"):
        return None
    configured = context.getConf().get("spark.pyspark.python")
    if configured:
        return str(configured)
    master = str(context.master or "")
    if master == "local" or master.startswith(("local[", "local-cluster[")):
        return sys.executable
    return None


def _classic_context(spark: Any) -> Any:
    """The session's SparkContext, or None on Spark Connect (which has none)."""
    try:
        return spark.sparkContext
    except AttributeError:  # PySparkAttributeError (JVM_ATTRIBUTE_NOT_SUPPORTED) on Connect
        return None

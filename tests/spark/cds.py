"""A class-data sharing archive for the Spark JVMs of `make test`'s Spark pass.

Every JVM a Spark test starts (the tests' SparkSession, a standalone master and
worker, a Connect server, spark-submit's drivers) loads and verifies the same
~20,000 classes from Spark's jars: most of the 5-9 s such a JVM takes to come up
on two busy cores. ``python tests/spark/cds.py ARCHIVE`` runs one small local
job in a JVM that dumps the classes it loaded (Java 17's dynamic archive,
``-XX:ArchiveClassesAtExit``); ``deploy.JAVA_OPTS`` then maps that archive into
every later JVM (``-XX:SharedArchiveFile``), which skips the loading: a session
comes up in about half the time (measured: 8-9.6 s -> 4.8-5.3 s start and its
first job 5 s -> 1.8 s, on the loaded machine of 2026-11-29).

The archive is a cache (build/, git-ignored): made when missing or older than
pyspark's jars, never required. A JVM whose class path or Java differs from the
dump's ignores it (``-Xshare:auto``, Java's default) and starts as before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyspark

#: Where make test keeps it, beside the compiled build's other outputs.
DEFAULT_ARCHIVE = Path(__file__).resolve().parents[2] / "build" / "spark-cds.jsa"
#: The JVM options without the archive (deploy.py adds it to these).
BASE_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss4m"
#: Quiet about classes it cannot share (signed jars, old class files).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

_JOB = """
import sys
from pyspark.sql import SparkSession
spark = (
    SparkSession.builder.master("local[2]").appName("warren-cds")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.driver.extraJavaOptions", sys.argv[1])
    .getOrCreate()
)
df = spark.range(1000).selectExpr("id % 7 AS k", "CAST(id AS STRING) AS v")
df.groupBy("k").count().orderBy("k").collect()
df.write.mode("overwrite").json(sys.argv[2])
spark.read.json(sys.argv[2]).where("k > 3").collect()
spark.stop()
"""


def jars_mtime() -> float:
    return (Path(pyspark.__file__).resolve().parent / "jars").stat().st_mtime


def usable(archive: Path) -> bool:
    """The archive is there and was made from the jars installed now."""
    return archive.is_file() and archive.stat().st_mtime >= jars_mtime()


def archive_opts(archive: Path = DEFAULT_ARCHIVE) -> str:
    """What deploy.JAVA_OPTS adds: the archive's options, or nothing without one."""
    return f" -XX:SharedArchiveFile={archive} {QUIET}" if usable(archive) else ""


def make(archive: Path) -> bool:
    """Run the job in a dumping JVM; the archive is renamed into place only whole."""
    if usable(archive):
        return True
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.tmp")
    opts = f"{BASE_OPTS} -XX:ArchiveClassesAtExit={partial} {QUIET}"
    out = archive.parent / f"spark-cds-job.{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _JOB, opts, str(out)],
            env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not partial.is_file():
            print(f"spark-cds: no archive (the job failed: {done.stderr[-2000:]})", file=sys.stderr)
            return False
        partial.replace(archive)
        return True
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_ARCHIVE
    # Never fails make test: without an archive the JVMs start as they always did.
    make(target)

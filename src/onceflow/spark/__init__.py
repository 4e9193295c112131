"""onceflow for Spark: the `onceflow` data source (PySpark's Python Data Source API).

    import onceflow.spark
    onceflow.spark.register(spark)
    spark.readStream.format("onceflow").option("kafka.bootstrap.servers", ...).option("subscribe", "in")

A session built with `.config(*onceflow.spark.DAEMON_MODULE)` starts its Python workers sooner.

The source reads with read_committed and keeps offsets only in Spark's checkpoint; the sink writes
exactly once per write task (see `onceflow.spark.sink`). The format is not called `kafka` because
Spark's built-in sources take precedence over Python ones of the same name.
"""

from __future__ import annotations

from typing import Any

from onceflow.extras import MissingExtraError

try:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource
    from pyspark.sql.types import StructType
except ImportError as error:
    raise MissingExtraError("onceflow.spark", "PySpark", "spark") from error

from onceflow.spark.collector import freeze_between_tasks
from onceflow.spark.rows import SCHEMA
from onceflow.spark.sink import OnceflowBatchWriter, OnceflowStreamWriter
from onceflow.spark.source import OnceflowBatchReader, OnceflowStreamReader

FORMAT = "onceflow"
# A session's setting (`SparkSession.builder.config(*DAEMON_MODULE)`): Spark then forks its Python
# workers from a daemon that imported what they need once (`onceflow.spark_daemon`).
DAEMON_MODULE = ("spark.python.daemon.module", "onceflow.spark_daemon")


class OnceflowDataSource(DataSource):
    """Its methods run in the driver's planning workers, which PySpark's daemon reuses and
    collects after every call, as it does the tasks' workers: each freezes first."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        freeze_between_tasks()
        return SCHEMA

    def reader(self, schema: StructType) -> OnceflowBatchReader:
        freeze_between_tasks()
        return OnceflowBatchReader(self.options)

    def streamReader(self, schema: StructType) -> OnceflowStreamReader:
        freeze_between_tasks()
        return OnceflowStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> OnceflowBatchWriter:
        freeze_between_tasks()
        return OnceflowBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> OnceflowStreamWriter:
        freeze_between_tasks()
        return OnceflowStreamWriter(self.options, schema)


def register(spark: SparkSession) -> None:
    """Make `format("onceflow")` available in this session."""
    spark.dataSource.register(OnceflowDataSource)


__all__: list[Any] = ["DAEMON_MODULE", "FORMAT", "OnceflowDataSource", "register"]

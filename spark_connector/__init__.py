"""txmq for Apache Spark: an exactly-once sink and a source for Structured Streaming and batch
jobs, built on txmq's transactional messages.

pyspark >= 4.0 (Python data sources)::

    from txmq.spark_connector import register
    register(spark)
    (df.writeStream.format("txmq")
       .option("broker", "127.0.0.1:10911")
       .option("topic", "orders")
       .option("checkpointLocation", "/path/ckpt")
       .start())
    spark.readStream.format("txmq").option("broker", ...).option("topic", "orders").load()

Spark 3.5: :func:`txmq_foreach_batch` for ``writeStream.foreachBatch``.

See docs/spark.md for options, guarantees and deployment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .foreach_batch import txmq_foreach_batch
from .options import SinkOptions, SourceOptions, TxmqOptionError
from .sink import PartitionResult

if TYPE_CHECKING:
    from .datasource import TxmqDataSource


def register(spark: Any) -> None:
    """Register format ``txmq`` with a Spark session (needs pyspark >= 4.0)."""
    from .datasource import register as _register

    _register(spark)


def __getattr__(name: str) -> Any:
    # The data source needs pyspark >= 4.0; import it only when asked for, so the Spark 3.5
    # helper works without it.
    if name == "TxmqDataSource":
        from .datasource import TxmqDataSource

        return TxmqDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PartitionResult",
    "SinkOptions",
    "SourceOptions",
    "TxmqDataSource",
    "TxmqOptionError",
    "register",
    "txmq_foreach_batch",
]

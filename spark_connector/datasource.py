"""``TxmqDataSource``: the Python data source registered as format ``txmq`` (pyspark >= 4.0).

Register it once per Spark session::

    from txmq.spark_connector import register
    register(spark)          # == spark.dataSource.register(TxmqDataSource)
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .options import (
    TxmqOptionError,
    check_sink_schema,
    parse_sink_options,
    parse_source_options,
)
from .reader import SOURCE_SCHEMA, TxmqBatchReader, TxmqStreamReader
from .writer import TxmqBatchWriter, TxmqStreamWriter


def _columns(schema: StructType) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in schema.fields}


class TxmqDataSource(DataSource):
    """Streaming and batch source and sink for txmq topics.

    The sink is exactly-once: see :mod:`txmq.spark_connector.writer`.  The source reads
    committed messages only; its schema is :data:`~txmq.spark_connector.reader.SOURCE_SCHEMA`.
    """

    @classmethod
    def name(cls) -> str:
        return "txmq"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    # -- sink --------------------------------------------------------------------------------

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = parse_sink_options(self.options)
        check_sink_schema(_columns(schema), options)
        writer: DataSourceStreamWriter = TxmqStreamWriter(options)
        return writer

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise TxmqOptionError("a txmq topic cannot be overwritten; use mode('append')")
        options = parse_sink_options(self.options)
        check_sink_schema(_columns(schema), options)
        writer: DataSourceWriter = TxmqBatchWriter(options)
        return writer

    # -- source ------------------------------------------------------------------------------

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TxmqStreamReader(parse_source_options(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TxmqBatchReader(parse_source_options(self.options))


def register(spark: Any) -> None:
    """Register format ``txmq`` with a Spark session (pyspark >= 4.0)."""
    spark.dataSource.register(TxmqDataSource)

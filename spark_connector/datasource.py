"""``TxmqDataSource``: the Python data source registered as format ``txmq`` (pyspark >= 4.0).

Register it once per Spark session::

    from txmq.spark_connector import register
    register(spark)          # == spark.dataSource.register(TxmqDataSource)
"""

from __future__ import annotations

from collections.abc import Mapping
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
    SinkOptions,
    SourceOptions,
    TxmqOptionError,
    check_sink_schema,
    parse_sink_options,
    parse_source_options,
)
from .reader import SOURCE_SCHEMA, TxmqBatchReader, TxmqStreamReader
from .session import ssl_context
from .writer import TxmqBatchWriter, TxmqStreamWriter


def _columns(schema: StructType) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in schema.fields}


def _sink(options: Mapping[str, Any], schema: StructType) -> SinkOptions:
    """The sink's options, checked against the input's columns and its TLS files loaded once on
    the driver (a bad file fails the query at its start, not in every task)."""
    sink = parse_sink_options(options)
    check_sink_schema(_columns(schema), sink)
    ssl_context(sink.tls)
    return sink


def _source(options: Mapping[str, Any]) -> SourceOptions:
    """The source's options, its TLS files loaded once on the driver."""
    source = parse_source_options(options)
    ssl_context(source.tls)
    return source


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
        options = _sink(self.options, schema)
        writer: DataSourceStreamWriter = TxmqStreamWriter(options)
        return writer

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise TxmqOptionError("a txmq topic cannot be overwritten; use mode('append')")
        options = _sink(self.options, schema)
        writer: DataSourceWriter = TxmqBatchWriter(options)
        return writer

    # -- source ------------------------------------------------------------------------------

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TxmqStreamReader(_source(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TxmqBatchReader(_source(self.options))


def register(spark: Any) -> None:
    """Register format ``txmq`` with a Spark session (pyspark >= 4.0)."""
    spark.dataSource.register(TxmqDataSource)

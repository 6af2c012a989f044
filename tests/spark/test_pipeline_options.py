"""The ``pipeline`` option's checks, before any task runs: a valid name, a checkpoint location
on the sink, and a source ``producerGroup`` only together with ``pipeline``."""

from __future__ import annotations

import pytest

from txmq.spark_connector.options import (
    TxmqOptionError,
    offsets_text,
    parse_sink_options,
    parse_source_options,
)

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

from txmq.spark_connector.writer import TxmqStreamWriter  # noqa: E402  (needs pyspark)

SINK = {"broker": "127.0.0.1:1", "topic": "out"}
SOURCE = {"broker": "127.0.0.1:1", "topic": "in"}


def test_pipeline_options_are_checked() -> None:
    with pytest.raises(TxmqOptionError, match="option 'pipeline'.*not a valid group name"):
        parse_sink_options({**SINK, "pipeline": "bad name"})
    with pytest.raises(TxmqOptionError, match="needs the query's option 'checkpointLocation'"):
        TxmqStreamWriter(parse_sink_options({**SINK, "pipeline": "p"}))
    sink = parse_sink_options({**SINK, "pipeline": "p", "checkpointLocation": "/tmp/c"})
    assert (sink.pipeline, sink.checkpoint_location) == ("p", "/tmp/c")
    # Every query start makes its own batch keys.
    assert TxmqStreamWriter(sink).run_id != TxmqStreamWriter(sink).run_id

    with pytest.raises(TxmqOptionError, match="'producerGroup' of a source.*'pipeline'"):
        parse_source_options({**SOURCE, "producerGroup": "g"})
    source = parse_source_options({**SOURCE, "pipeline": "p", "producerGroup": "g"})
    assert (source.pipeline, source.producer_group) == ("p", "g")


def test_offsets_text_is_canonical() -> None:
    a = offsets_text({"t": {"1": 5, "0": 3}, "s": {"g2:0": 1, "g1:0": 2}})
    b = offsets_text({"s": {"g1:0": 2, "g2:0": 1}, "t": {"0": 3, "1": 5}})
    assert a == b == '{"s":{"g1:0":2,"g2:0":1},"t":{"0":3,"1":5}}'

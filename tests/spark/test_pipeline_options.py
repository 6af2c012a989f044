"""The ``pipeline`` option's checks, before any task runs: a valid name, a checkpoint location
on the sink, and a source ``producerGroup`` only together with ``pipeline``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txmq.spark_connector.options import (
    TxmqOptionError,
    offsets_text,
    parse_sink_options,
    parse_source_options,
)

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

from txmq.protocol.errors import TxmqError  # noqa: E402
from txmq.spark_connector.pipeline import logged_offsets, with_marker  # noqa: E402
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


def _entry(folder: Path, batch: int, *sources: str) -> None:
    (folder / "offsets").mkdir(exist_ok=True)
    lines = ["v1", '{"batchWatermarkMs":0,"batchTimestampMs":1}', *sources]
    (folder / "offsets" / str(batch)).write_text("\n".join(lines))


def test_the_sink_finds_its_source_in_the_offset_log_by_the_pipeline_marker(
    tmp_path: Path,
) -> None:
    marked = with_marker({"in": {"0": 5}}, "p")
    assert marked == {"@pipeline:p": {"0": 0}, "in": {"0": 5}}
    before = with_marker({"in": {"0": 2}}, "p")
    # Another source of the query (a Kafka-like one, one without offsets) is passed over.
    _entry(tmp_path, 0, '{"other":{"0":1}}', json.dumps(before), "-")
    _entry(tmp_path, 1, '{"other":{"0":3}}', json.dumps(marked), "-")
    assert logged_offsets(str(tmp_path), 1, "p") == (marked, before)
    assert logged_offsets(str(tmp_path), 0, "p") == (before, None)
    assert logged_offsets(str(tmp_path), 2, "p") is None
    # A txmq source without the option leaves no marker: the sink refuses to record.
    _entry(tmp_path, 3, '{"in":{"0":9}}')
    with pytest.raises(TxmqError, match="give the query's txmq source the option pipeline=p"):
        logged_offsets(str(tmp_path), 3, "p")
    with pytest.raises(TxmqError, match="pipeline=q"):
        logged_offsets(str(tmp_path), 1, "q")

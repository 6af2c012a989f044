"""Option parsing and offset planning of the Spark connector: pure functions, no Spark session
and no broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.spark_connector.options import (
    EARLIEST,
    LATEST,
    TxmqOptionError,
    admit_batch,
    check_sink_schema,
    normalize_offsets,
    offsets_behind,
    parse_duration,
    parse_sink_options,
    parse_source_options,
    rows_for_bytes,
    share_budget,
    split_ranges,
    stream_producer_group,
)

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

from txmq.spark_connector.reader import plan_end, plan_partitions  # noqa: E402  (needs pyspark)

BROKER = {"broker": "127.0.0.1:10911"}

# --- sink -------------------------------------------------------------------------------------


def test_sink_defaults_and_case_insensitive_keys() -> None:
    o = parse_sink_options(
        {
            "Broker": "h:1",
            "TOPIC": "orders",
            "batchsize": "100",
            "queueColumn": "customer",
            "maxInFlight": "8",
            "requestTimeout": "2.5",
        }
    )
    assert (
        o.broker,
        o.topic,
        o.batch_size,
        o.queue_column,
        o.max_in_flight,
        o.request_timeout,
        o.producer_group,
    ) == ("h:1", "orders", 100, "customer", 8, 2.5, None)
    d = parse_sink_options(BROKER)
    assert (d.topic, d.batch_size, d.max_request_bytes, d.max_in_flight) == (
        None,
        512,
        1024 * 1024,
        8,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option 'broker' is required"),
        ({"broker": "localhost"}, "must be host:port"),
        ({"broker": "h:99999"}, "must be host:port"),
        ({**BROKER, "topic": "bad topic"}, "not a valid topic name"),
        ({**BROKER, "batchSize": "many"}, "'batchSize' must be an integer"),
        ({**BROKER, "batchSize": "0"}, "'batchSize' must be between 1 and"),
        ({**BROKER, "maxRequestBytes": "100"}, "'maxRequestBytes' must be between"),
        ({**BROKER, "requestTimeout": "-1"}, "'requestTimeout' must be a positive number"),
        ({**BROKER, "producerGroup": "a group"}, "not a valid group name"),
    ],
)
def test_sink_option_errors_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(TxmqOptionError, match=message):
        parse_sink_options(options)


def test_sink_schema_checks() -> None:
    with_topic = parse_sink_options({**BROKER, "topic": "t"})
    check_sink_schema({"body": "binary", "tags": "string"}, with_topic)
    check_sink_schema({"body": "string", "properties": "map<string,string>"}, with_topic)
    with pytest.raises(TxmqOptionError, match="needs a 'body' column"):
        check_sink_schema({"value": "binary"}, with_topic)
    with pytest.raises(TxmqOptionError, match="'body' must be binary or string, not int"):
        check_sink_schema({"body": "int"}, with_topic)
    with pytest.raises(TxmqOptionError, match="'properties' must be map<string,string>"):
        check_sink_schema({"body": "binary", "properties": "map<string,int>"}, with_topic)
    with pytest.raises(TxmqOptionError, match="no topic to write to"):
        check_sink_schema({"body": "binary"}, parse_sink_options(BROKER))
    check_sink_schema({"body": "binary", "topic": "string"}, parse_sink_options(BROKER))
    keyed = parse_sink_options({**BROKER, "topic": "t", "queueColumn": "customer"})
    with pytest.raises(TxmqOptionError, match="'queueColumn' names 'customer'"):
        check_sink_schema({"body": "binary"}, keyed)


def test_stream_producer_group_is_derived_from_the_query_id() -> None:
    qid = "0b5c3a52-5b0e-4d7e-9a51-7f0e8f1d2c3b"
    assert stream_producer_group(qid) == f"txmq-spark-{qid}"


# --- source -----------------------------------------------------------------------------------


def test_source_options() -> None:
    o = parse_source_options(
        {
            **BROKER,
            "topic": " a, b ,a ",
            "maxMessagesPerTrigger": "500",
            "startingOffsets": "LATEST",
            "failOnDataLoss": "false",
        }
    )
    assert (o.topics, o.max_messages_per_trigger, o.starting_offsets, o.fail_on_data_loss) == (
        ("a", "b"),
        500,
        LATEST,
        False,
    )
    d = parse_source_options({**BROKER, "topic": "a"})
    assert (
        d.starting_offsets,
        d.max_messages_per_trigger,
        d.pull_batch_size,
        d.fail_on_data_loss,
    ) == (EARLIEST, None, 256, True)
    j = parse_source_options(
        {**BROKER, "topic": "a,b", "startingOffsets": json.dumps({"a": {"0": 12, "1": -1}})}
    )
    assert j.starting_offsets == {"a": {"0": 12, "1": -1}}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (BROKER, "option 'topic' is required"),
        ({**BROKER, "topic": " , "}, "names no topic"),
        (
            {**BROKER, "topic": "a", "startingOffsets": "soon"},
            "must be 'earliest', 'latest' or JSON",
        ),
        ({**BROKER, "topic": "a", "startingOffsets": "[1]"}, "must be a JSON object of topics"),
        ({**BROKER, "topic": "a", "startingOffsets": '{"b": {"0": 1}}'}, "names topic 'b'"),
        ({**BROKER, "topic": "a", "startingOffsets": '{"a": {"x": 1}}'}, "is not a queue id"),
        ({**BROKER, "topic": "a", "startingOffsets": '{"a": {"0": -5}}'}, "must be >= 0"),
        ({**BROKER, "topic": "a", "startingOffsets": '{"a": 3}'}, "needs an object"),
        ({**BROKER, "topic": "a", "maxMessagesPerTrigger": "0"}, "must be at least 1"),
        ({**BROKER, "topic": "a", "pullBatchSize": "5000"}, "between 1 and 1024"),
        ({**BROKER, "topic": "a", "failOnDataLoss": "maybe"}, "must be true or false"),
    ],
)
def test_source_option_errors_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(TxmqOptionError, match=message):
        parse_source_options(options)


# --- offsets ----------------------------------------------------------------------------------


def test_offsets_serialise_in_one_canonical_order() -> None:
    # Spark compares offsets as JSON text: the same positions must give the same text.
    a = normalize_offsets({"t2": {"10": 1, "2": 5}, "t1": {"0": 3}})
    b = normalize_offsets({"t1": {0: 3}, "t2": {"2": 5, 10: 1}})
    assert json.dumps(a) == json.dumps(b) == '{"t1": {"0": 3}, "t2": {"2": 5, "10": 1}}'


def test_plan_end_and_partitions() -> None:
    start = {"t": {"0": 5, "1": 10}}
    latest = {"t": {"0": 8, "1": 10, "2": 4}, "u": {"0": 2}}  # queue t/2 and topic u are new
    end = plan_end(start, latest, None)
    assert end == {"t": {"0": 8, "1": 10, "2": 4}, "u": {"0": 2}}
    parts = plan_partitions(start, end)
    assert sorted((p.topic, p.queue_id, p.start, p.end) for p in parts) == [
        ("t", 0, 5, 8),
        ("t", 2, 0, 4),
        ("u", 0, 0, 2),
    ]
    # A start beyond the queue's end never moves backwards.
    assert plan_end({"t": {"0": 9}}, {"t": {"0": 3}}, None) == {"t": {"0": 9}}
    # A cap of 4 messages is shared over the three queues with a backlog (3 + 4 + 2 waiting).
    capped = plan_end(start, latest, 4)
    granted = {(t, q): capped[t][q] - start.get(t, {}).get(q, 0) for t in capped for q in capped[t]}
    assert (
        sum(granted.values()) == 4
        and max(granted.values()) - min(v for k, v in granted.items() if k != ("t", "1")) <= 1
    )


@given(
    st.dictionaries(st.tuples(st.sampled_from("ab"), st.sampled_from("0123")), st.integers(0, 50)),
    st.integers(1, 120),
)
def test_share_budget_is_bounded_fair_and_makes_progress(
    backlogs: dict[tuple[str, str], int], budget: int
) -> None:
    grant = share_budget(backlogs, budget)
    total = sum(backlogs.values())
    assert sum(grant.values()) == min(budget, total)
    assert all(0 < n <= backlogs[k] for k, n in grant.items())
    # Fair: a queue that got less than its backlog got at least as much as any other - 1.
    short = [n for k, n in grant.items() if n < backlogs[k]]
    if short:
        assert min(short) >= max(grant.values()) - 1
    # Queues without a grant are either empty or budget ran out before them.
    assert all(
        backlogs[k] == 0 or sum(grant.values()) == budget for k in backlogs if k not in grant
    )


# --- Kafka-style source options ---------------------------------------------------------------


def test_unknown_source_options_are_refused_by_name() -> None:
    with pytest.raises(
        TxmqOptionError, match=r"unknown options .*'maxOffsetPerTrigger', 'subscribe'"
    ):
        parse_source_options({**BROKER, "topic": "a", "subscribe": "a", "maxOffsetPerTrigger": "5"})
    # Known options are accepted in any case.
    parse_source_options({"BROKER": "h:1", "Topic": "a", "MINPARTITIONS": "3"})


def test_kafka_style_source_options() -> None:
    o = parse_source_options(
        {
            **BROKER,
            "subscribePattern": "orders-.*",
            "startingOffsetsByTimestamp": json.dumps({"orders-eu": {"0": 1700000000000}}),
            "endingOffsets": json.dumps({"orders-eu": {"0": 50, "1": -1}}),
            "minPartitions": "6",
            "maxBytesPerTrigger": "1048576",
            "minOffsetsPerTrigger": "100",
            "maxTriggerDelay": "30s",
        }
    )
    assert o.topics == () and o.topic_pattern == "orders-.*"
    assert o.wants("orders-eu") and not o.wants("orders") and not o.wants("x-orders-eu")
    assert o.starting_timestamps == {"orders-eu": {"0": 1700000000000}}
    assert o.ending_offsets == {"orders-eu": {"0": 50, "1": -1}}
    assert (o.min_partitions, o.max_bytes_per_trigger, o.min_offsets_per_trigger) == (
        6,
        1048576,
        100,
    )
    assert o.max_trigger_delay == 30.0
    d = parse_source_options({**BROKER, "topic": "a", "startingTimestamp": "1700000000000"})
    assert (d.starting_timestamp, d.ending_offsets, d.max_trigger_delay) == (
        1700000000000,
        LATEST,
        15 * 60.0,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribePattern": "a.*", "topic": "a"}, "one of the options 'topic' and"),
        ({"subscribePattern": "(a"}, "'subscribePattern' is not a regular expression"),
        (
            {"topic": "a", "startingOffsets": "latest", "startingTimestamp": "5"},
            "'startingOffsets' and 'startingTimestamp' exclude each other",
        ),
        ({"topic": "a", "startingTimestamp": "soon"}, "'startingTimestamp' must be an integer"),
        (
            {"topic": "a", "startingOffsetsByTimestamp": '{"b": {"0": 5}}'},
            "names topic 'b', which is not read",
        ),
        (
            {"subscribePattern": "a.*", "startingOffsetsByTimestamp": '{"b": {"0": 5}}'},
            r"names topic 'b', which is not read \(subscribePattern: a\.\*\)",
        ),
        (
            {"topic": "a", "startingOffsetsByTimestamp": '{"a": {"0": -2}}'},
            "epoch milliseconds",
        ),
        ({"topic": "a", "endingOffsets": "earliest"}, "'endingOffsets' must be 'latest' or JSON"),
        ({"topic": "a", "endingOffsets": '{"a": {"0": -2}}'}, r"must be >= 0, or -1 \(latest\)"),
        ({"topic": "a", "minPartitions": "0"}, "'minPartitions' must be at least 1"),
        ({"topic": "a", "maxBytesPerTrigger": "lots"}, "'maxBytesPerTrigger' must be an integer"),
        ({"topic": "a", "minOffsetsPerTrigger": "0"}, "'minOffsetsPerTrigger' must be at least"),
        ({"topic": "a", "maxTriggerDelay": "15"}, "'maxTriggerDelay' must be a duration"),
    ],
)
def test_kafka_style_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(TxmqOptionError, match=message):
        parse_source_options({**BROKER, **options})


def test_durations() -> None:
    assert [parse_duration(d, "x") for d in ("500ms", "30s", "2m", "1.5h", "1d", "3 min")] == [
        0.5,
        30.0,
        120.0,
        5400.0,
        86400.0,
        180.0,
    ]


def test_min_partitions_splits_the_largest_ranges_and_covers_each_offset_once() -> None:
    start = {"t": {"0": 0, "1": 10}}
    end = {"t": {"0": 100, "1": 13}}
    parts = plan_partitions(start, end, 5)
    assert len(parts) == 5
    covered = sorted((p.queue_id, o) for p in parts for o in range(p.start, p.end))
    assert covered == [(0, o) for o in range(100)] + [(1, o) for o in range(10, 13)]
    # Never more than one partition per message.
    assert len(split_ranges([("t", 0, 0, 3)], 10)) == 3
    assert split_ranges([("t", 0, 5, 5)], 4) == []
    assert len(plan_partitions(start, end, None)) == 2


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=6), st.integers(1, 30))
def test_split_ranges_is_an_exact_cover(bounds: list[tuple[int, int]], n: int) -> None:
    ranges = [("t", q, min(a, b), max(a, b)) for q, (a, b) in enumerate(bounds)]
    out = split_ranges(ranges, n)
    total = sum(e - s for _, _, s, e in ranges)
    assert len(out) >= min(n, total)
    assert sorted((q, o) for _, q, s, e in out for o in range(s, e)) == sorted(
        (q, o) for _, q, s, e in ranges for o in range(s, e)
    )


def test_rows_for_bytes_and_admission() -> None:
    assert rows_for_bytes(10_240, [1024] * 8) == 10
    assert rows_for_bytes(100, [1024]) == 1  # always progress
    assert rows_for_bytes(100, []) == 100
    # minOffsetsPerTrigger 50, maxTriggerDelay 10 s
    assert admit_batch(50, 50, 1.0, 10.0)
    assert not admit_batch(20, 50, 1.0, 10.0)
    assert admit_batch(20, 50, 10.0, 10.0)
    assert admit_batch(20, 50, None, 10.0)  # the first batch of a run is not held back
    assert not admit_batch(0, None, None, 10.0)
    assert admit_batch(1, None, 0.0, 10.0)


def test_offsets_behind_from_query_progress() -> None:
    source = {
        "endOffset": json.dumps({"t": {"0": 10, "1": 4}}),
        "latestOffset": json.dumps({"t": {"0": 15, "1": 4, "2": 7}}),
    }
    assert offsets_behind(source) == {
        "minOffsetsBehindLatest": 0,
        "maxOffsetsBehindLatest": 7,
        "avgOffsetsBehindLatest": 4,
        "totalOffsetsBehindLatest": 12,
    }
    assert offsets_behind({"endOffset": None, "latestOffset": None}) == {}


# --- TLS and unknown sink options ------------------------------------------------------------


def test_tls_options_of_sink_and_source() -> None:
    from txmq.spark_connector.options import TlsOptions

    assert parse_sink_options({**BROKER, "topic": "a"}).tls is None
    assert parse_sink_options({**BROKER, "topic": "a", "tls": "true"}).tls == TlsOptions()
    # A path turns TLS on; keys are case-insensitive, as all of Spark's.
    mutual = {"TLSCAPATH": "/ca.pem", "tlsCertPath": "/c.pem", "tlsKeyPath": "/c.key"}
    assert parse_source_options({**BROKER, "topic": "a", **mutual}).tls == TlsOptions(
        "/ca.pem", "/c.pem", "/c.key"
    )
    assert parse_sink_options({**BROKER, "tls": "false"}).tls is None
    with pytest.raises(TxmqOptionError, match="tlsCertPath and tlsKeyPath go together"):
        parse_sink_options({**BROKER, "tlsCertPath": "/c.pem"})
    with pytest.raises(TxmqOptionError, match="option tls is false, but tlsCaPath is only used"):
        parse_source_options({**BROKER, "topic": "a", "tls": "false", "tlsCaPath": "/ca.pem"})
    with pytest.raises(TxmqOptionError, match="option 'tls' must be true or false"):
        parse_sink_options({**BROKER, "tls": "mutual"})


def test_unknown_sink_options_are_refused_by_name_but_spark_s_own_pass() -> None:
    with pytest.raises(TxmqOptionError, match=r"unknown option for the txmq sink: 'tlsCA'"):
        parse_sink_options({**BROKER, "tlsCA": "/ca.pem"})
    parse_sink_options(
        {**BROKER, "checkpointlocation": "/ckpt", "queryname": "q", "path": "/p", "TLS": "1"}
    )


def test_tls_files_are_loaded_with_errors_naming_the_option(tmp_path: Path) -> None:
    from txmq.spark_connector.options import TlsOptions
    from txmq.spark_connector.session import ssl_context

    assert ssl_context(None) is None
    assert ssl_context(TlsOptions()) is not None  # the system's CA store
    with pytest.raises(TxmqOptionError, match="option tlsCaPath: cannot load the TLS CA file"):
        ssl_context(TlsOptions(ca_path=str(tmp_path / "missing.pem")))
    with pytest.raises(TxmqOptionError, match="option tlsCertPath/tlsKeyPath: cannot load"):
        ssl_context(TlsOptions(cert_path=str(tmp_path / "c.pem"), key_path=str(tmp_path / "k")))

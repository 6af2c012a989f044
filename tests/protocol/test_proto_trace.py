"""Trace records in RocketMQ's encoding: the strings below were written out by hand from
RocketMQ 5.3's ``TraceDataEncoder`` (field order, ``\\x01`` between fields, ``\\x02`` after each
record, Java's ``true``/``false``, msgType by ordinal)."""

from __future__ import annotations

import pytest

from txmq.protocol.trace import (
    MessageType,
    TraceError,
    TraceRecord,
    TraceType,
    decode,
    encode,
    encode_many,
    keys_of,
)

S, F = "\x01", "\x02"

PUB = (
    S.join(
        [
            "Pub",
            "1700000000123",
            "DefaultRegion",
            "PID_orders",
            "orders",
            "7F000001000118B4AAC2000000000000",
            "TagA",
            "order-1 order-2",
            "127.0.0.1:10911",
            "11",
            "4",
            "1",
            "7F00000100002A9F0000000000000C5E",
            "true",
        ]
    )
    + F
)
SUB_BEFORE = (
    S.join(["SubBefore", "1700000000200", "DefaultRegion", "CID_billing", "req-9", "M1", "2", "k"])
    + F
)
SUB_AFTER = (
    S.join(["SubAfter", "req-9", "M1", "17", "false", "k", "3", "1700000000220", "CID_billing"]) + F
)
END_TX = (
    S.join(
        [
            "EndTransaction",
            "1700000000300",
            "DefaultRegion",
            "PID_orders",
            "orders",
            "M1",
            "TagA",
            "k",
            "127.0.0.1:10911",
            "1",
            "7F0000010001TX",
            "COMMIT_MESSAGE",
            "true",
        ]
    )
    + F
)


def test_a_pub_record_is_rocketmqs_string_both_ways() -> None:
    rec = TraceRecord(
        TraceType.PUB,
        timestamp=1700000000123,
        group="PID_orders",
        topic="orders",
        msg_id="7F000001000118B4AAC2000000000000",
        tags="TagA",
        keys="order-1 order-2",
        store_host="127.0.0.1:10911",
        body_length=11,
        cost_time=4,
        msg_type=MessageType.TRANS_HALF,
        offset_msg_id="7F00000100002A9F0000000000000C5E",
        success=True,
    )
    assert encode(rec) == PUB
    assert decode(PUB) == [rec]
    assert keys_of([rec]) == "7F000001000118B4AAC2000000000000 order-1 order-2"


def test_sub_before_sub_after_and_end_transaction_round_trip() -> None:
    body = SUB_BEFORE + SUB_AFTER + END_TX
    before, after, end = decode(body.encode())
    assert (before.type, before.group, before.request_id, before.msg_id, before.retry_times) == (
        TraceType.SUB_BEFORE,
        "CID_billing",
        "req-9",
        "M1",
        2,
    )
    assert (after.type, after.cost_time, after.success, after.context_code) == (
        TraceType.SUB_AFTER,
        17,
        False,
        3,
    )
    assert (after.timestamp, after.group) == (1700000000220, "CID_billing")
    assert (end.transaction_id, end.transaction_state, end.from_transaction_check) == (
        "7F0000010001TX",
        "COMMIT_MESSAGE",
        True,
    )
    assert end.msg_type is MessageType.TRANS_HALF
    assert encode_many([before, after, end]) == body


def test_older_and_shorter_writers_are_read() -> None:
    # a Pub of 13 fields (success right after msgType, no offsetMsgId), as older clients wrote
    old_pub = S.join(["Pub", "1", "R", "G", "T", "M", "", "", "h:1", "3", "0", "0", "false"]) + F
    (rec,) = decode(old_pub)
    assert (rec.success, rec.offset_msg_id) == (False, "")
    # a Pub with clientHost (RocketMQ's newest), and a SubAfter without timestamp and group
    with_host = PUB[:-1] + S + "10.0.0.7" + F
    assert decode(with_host)[0].client_host == "10.0.0.7"
    short_after = S.join(["SubAfter", "r", "M", "5", "true", "", "0"]) + F
    assert decode(short_after)[0].timestamp == 0
    # Java's split drops a trailing empty field: a SubBefore without keys ends early
    assert decode(S.join(["SubBefore", "1", "R", "G", "r", "M", "0"]) + F)[0].keys == ""


def test_unknown_types_are_skipped_and_broken_records_refused() -> None:
    assert decode(S.join(["Future", "1", "2"]) + F + PUB)[0].type is TraceType.PUB
    with pytest.raises(TraceError, match="fields"):
        decode(S.join(["Pub", "1", "R"]) + F)
    with pytest.raises(TraceError, match="bad field"):
        decode(PUB.replace("1700000000123", "soon"))
    with pytest.raises(TraceError, match="separator"):
        encode(TraceRecord(TraceType.PUB, keys="a\x02b"))


def test_txmqs_tx_event_round_trips() -> None:
    rec = TraceRecord(
        TraceType.TX_EVENT,
        timestamp=5,
        group="PID",
        topic="orders",
        msg_id="M",
        transaction_id="TX",
        event="committed",
        detail="check",
        store_host="h:1",
    )
    assert (
        encode(rec)
        == S.join(
            [
                "TxEvent",
                "5",
                "DefaultRegion",
                "PID",
                "orders",
                "M",
                "TX",
                "committed",
                "check",
                "h:1",
            ]
        )
        + F
    )
    assert decode(encode(rec)) == [rec]
    assert keys_of([rec, rec]) == "M TX"

"""What each fuzzing finding gets now: the parser's documented error (or a clean answer), with
the message saying what was wrong."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest

from tests.fuzz.regressions import _stored_v2_negative_topic
from txmq.broker.acl import AclConfigError, load_acl_file, requirements
from txmq.broker.clients import parse_heartbeat
from txmq.broker.grpc import convert
from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
from txmq.broker.messaging.pop import ReceiptHandleError, parse_handle
from txmq.broker.sql_filter import SqlFilterError, compile_sql
from txmq.broker.store.checkpoint import StoreCheckpoint
from txmq.broker.store.consumer_offset import ConsumerOffsetManager
from txmq.broker.store.topic_config import TopicConfigManager
from txmq.broker.transaction.persistence import CheckStateError, parse_check_state
from txmq.broker.transaction.state import OpKind, OpRecord, OpRecordError
from txmq.protocol import fastjson
from txmq.protocol.codes import RequestCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError, ProtocolError
from txmq.protocol.locks import LockBatchRequest, decode_lock_response
from txmq.protocol.txn_offsets import TxnOffsets


@pytest.mark.parametrize("text", [b"[" * 5000, b"{" * 5000, b'{"a":' * 3000])
def test_fastjson_deep_nesting_is_a_value_error(text: bytes) -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        fastjson.loads(text)


def test_fastjson_still_reads_nesting_within_the_limit() -> None:
    doc = fastjson.loads(b"[" * 200 + b"]" * 200)
    for _ in range(199):
        assert isinstance(doc, list) and len(doc) == 1
        doc = doc[0]
    assert doc == []


@pytest.mark.parametrize(
    "content,message",
    [
        (b"accounts:\n  - accessKey: \xff\xfe\n", "is not UTF-8 text"),
        (b"[" * 5000, "nested too deeply"),
        (b"1: a\nb: c\n", "unknown key"),
    ],
)
def test_acl_file_errors(tmp_path: os.PathLike[str], content: bytes, message: str) -> None:
    path = os.path.join(tmp_path, "plain_acl.yml")
    with open(path, "wb") as fh:
        fh.write(content)
    with pytest.raises(AclConfigError, match=message):
        load_acl_file(path)


@pytest.mark.parametrize("expression", ["NOT " * 3000 + "a = 1", "a = " + "-" * 3000 + "1"])
def test_sql_deep_nesting_is_a_filter_error(expression: str) -> None:
    with pytest.raises(SqlFilterError, match="nested too deeply"):
        compile_sql(expression)


def test_sql_record_with_negative_topic_length_matches_nothing() -> None:
    f = compile_sql("a IS NULL")
    assert f.matches({}) is True
    assert f.matches_stored(_stored_v2_negative_topic()) is False


@pytest.mark.parametrize("middle", ["\u00b2-1", "1-\u0663", "\u0661-2"])
def test_receipt_handle_with_non_ascii_digits_is_invalid(middle: str) -> None:
    with pytest.raises(ReceiptHandleError) as info:
        parse_handle(f"{middle}-n")
    assert convert.status_of(info.value).code == convert.Code.INVALID_RECEIPT_HANDLE
    assert parse_handle("3-42-n") == (3, 42, "n")


@pytest.mark.parametrize("message_id", ["a\x01b", "\x02", "U\x02K"])
def test_message_id_with_a_separator_is_illegal(message_id: str) -> None:
    m = pb.Message(body=b"x")
    m.topic.name = "TopicA"
    m.system_properties.message_id = message_id
    with pytest.raises(convert.GrpcStatusError) as info:
        convert.check_message(m, 1024)
    assert info.value.code == convert.Code.ILLEGAL_MESSAGE_ID


@pytest.mark.parametrize(
    "data", [b"[1]", b"\xff", b'{"checks": {"t": [1]}}', b'{"checks": 5}', b"[" * 5000]
)
def test_unreadable_check_state_is_a_check_state_error(data: bytes) -> None:
    with pytest.raises(CheckStateError, match="unreadable check-state index"):
        parse_check_state(data)


def test_check_state_reads_what_the_broker_writes() -> None:
    data = b'{"version": 1, "checks": {"tx-1": [2, 1700000000000], "tx-2": [0, 0]}}'
    assert parse_check_state(data) == [("tx-1", 2, 1_700_000_000_000), ("tx-2", 0, 0)]


def test_op_record_committed_list_only_on_batches() -> None:
    body = b"\x85\xa1v\x01\xa1k\xa6resume\xa1g\xa2pg\xa1t\x91\xa1x\xa1c\x91\xa1y"
    rec = OpRecord.decode(body)
    assert (rec.kind, rec.txids, rec.committed) == (OpKind.RESUME, ("x",), ())
    assert OpRecord.decode(rec.encode()) == rec
    batch = OpRecord(OpKind.BATCH, "pg", ("r",), batch_key="b", committed=("c",))
    assert OpRecord.decode(batch.encode()).committed == ("c",)


def test_built_stored_record_has_the_v2_magic() -> None:
    # The record built for these tests must be what it says, or the SQL test would prove nothing.
    record = _stored_v2_negative_topic()
    assert struct.unpack_from(">i", record, 4)[0] == -626843477
    assert struct.unpack_from(">h", record, 88)[0] == -1


DEEP_JSON = b"[" * 5000


def test_deep_json_bodies_are_the_parsers_errors() -> None:
    with pytest.raises(InvalidParameterError, match="heartbeat body is not JSON"):
        parse_heartbeat(DEEP_JSON)
    with pytest.raises(InvalidParameterError, match="LOCK_BATCH_MQ body is not JSON"):
        LockBatchRequest.decode(DEEP_JSON)
    with pytest.raises(InvalidParameterError, match="answer body is not JSON"):
        decode_lock_response(DEEP_JSON)
    with pytest.raises(ProtocolError, match="not a transactional offsets body"):
        TxnOffsets.decode(DEEP_JSON)


@pytest.mark.parametrize(
    "body,needs",
    [
        (DEEP_JSON, []),
        (b'{"consumerDataSet": 5}', []),
        (b'{"consumerDataSet": [{"groupName": "g", "subscriptionDataSet": 5}]}', ["g"]),
        (
            b'{"consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [{"topic": "T"}]}]}',
            ["g", "T"],
        ),
    ],
)
def test_acl_reads_odd_heartbeats(body: bytes, needs: list[str]) -> None:
    cmd = RemotingCommand(code=RequestCode.HEART_BEAT, body=body)
    admin_only, got = requirements(cmd, cast(Any, None))  # a heartbeat needs no transactions
    assert admin_only is False
    assert [n.resource for n in got] == needs


def test_gzip_body_is_inflated_up_to_the_limit_only() -> None:
    body = b"hello " * 1000
    m = pb.Message(body=gzip.compress(body))
    m.system_properties.body_encoding = pb.GZIP
    assert convert.to_message_ext(m, "T", "10.0.0.1", 1, len(body)).body == body
    with pytest.raises(convert.GrpcStatusError) as info:
        convert.to_message_ext(m, "T", "10.0.0.1", 1, len(body) - 1)
    assert info.value.code == convert.Code.MESSAGE_BODY_TOO_LARGE
    # A bomb: 5 MiB of zeros from about 5 KiB, against the default limit of 4 MiB.
    m.body = gzip.compress(bytes(5 * 1024 * 1024))
    with pytest.raises(convert.GrpcStatusError) as info:
        convert.to_message_ext(m, "T", "10.0.0.1", 1, 4 * 1024 * 1024)
    assert info.value.code == convert.Code.MESSAGE_BODY_TOO_LARGE


@pytest.mark.parametrize(
    "body",
    [gzip.compress(b"x" * 100, mtime=0)[:-4], b"not gzip", gzip.compress(b"x", mtime=0) + b"junk"],
)
def test_gzip_body_that_does_not_inflate_is_corrupted(body: bytes) -> None:
    m = pb.Message(body=body)
    m.system_properties.body_encoding = pb.GZIP
    with pytest.raises(convert.GrpcStatusError) as info:
        convert.to_message_ext(m, "T", "10.0.0.1", 1, 1024)
    assert info.value.code == convert.Code.MESSAGE_CORRUPTED


def test_gzip_body_of_two_members_is_both() -> None:
    m = pb.Message(body=gzip.compress(b"ab") + gzip.compress(b"cd"))
    m.system_properties.body_encoding = pb.GZIP
    assert convert.to_message_ext(m, "T", "10.0.0.1", 1, 1024).body == b"abcd"


def test_infinity_where_an_integer_belongs_is_each_parsers_error(tmp_path: Path) -> None:
    with pytest.raises(CheckStateError):
        parse_check_state(b'{"checks": {"t": [Infinity, 1]}}')
    with pytest.raises(OpRecordError, match="malformed op record"):
        OpRecord.decode(msgpack.packb({"v": 1, "k": "commit", "h": [float("inf")]}))
    with pytest.raises(ProtocolError, match="not a transactional offsets body"):
        TxnOffsets.decode(b'{"group": "g", "generation": Infinity, "clientId": "c", "offsets": []}')
    topics, offsets = tmp_path / "topics.json", tmp_path / "consumerOffset.json"
    # The store's tables: read as damaged (set aside, started from the backup or empty).
    topics.write_bytes(b'{"topicConfigTable": {}, "dataVersion": {"counter": Infinity}}')
    table = TopicConfigManager(str(topics))
    table.load()
    assert table.damaged and table.all() == {}
    for content in (b'{"offsetTable": {"a@g": {"1": -Infinity}}}', b"[" * 5000):
        offsets.write_bytes(content)
        manager = ConsumerOffsetManager(str(offsets))
        manager.load()
        assert manager.damaged


@pytest.mark.parametrize(
    "content", [b'{"formatVersion": Infinity}', b"[" * 5000, b'{"formatVersion": 1}']
)
def test_unreadable_checkpoint_is_none(tmp_path: Path, content: bytes) -> None:
    # None: the store dispatches the commit log again, as for any checkpoint it cannot read.
    path = tmp_path / "checkpoint"
    path.write_bytes(content)
    assert StoreCheckpoint.read(str(path)) is None

"""Fuzz targets: one function per parser that reads bytes from the network or from disk.

Each target takes ``bytes``, hands them to the product's real parser, and checks the parser's
contract: it returns a value (checked for the shape and round trip promised) or raises the
error type the parser documents.  Anything else escapes the target, which is a finding: an
``IndexError``, ``KeyError``, ``struct.error``, ``UnicodeDecodeError``, ``RecursionError`` or
``AssertionError`` out of a target means a parser broke its contract on that input.

The targets run under atheris (``bench/fuzz.py``) and, without it, in the corpus replay test
(``tests/fuzz/test_corpus_replay.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

from google.protobuf.message import DecodeError

from tests.support import scratch
from txmq.broker.acl import AclConfigError, load_acl_file, requirements
from txmq.broker.clients import parse_heartbeat
from txmq.broker.grpc import convert
from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
from txmq.broker.messaging.pop import ReceiptHandleError, parse_handle
from txmq.broker.sql_filter import SqlFilterError, compile_sql
from txmq.broker.store.checkpoint import StoreCheckpoint
from txmq.broker.store.commit_log import parse_dispatch_info
from txmq.broker.store.consumer_offset import ConsumerOffsetManager
from txmq.broker.store.errors import StoreCorruptError
from txmq.broker.store.topic_config import TopicConfigManager
from txmq.broker.topics import validate_topic
from txmq.broker.transaction import snapshot
from txmq.broker.transaction.machine import TransactionStateMachine
from txmq.broker.transaction.persistence import CheckStateError, parse_check_state
from txmq.broker.transaction.state import OpRecord, OpRecordError
from txmq.protocol import fastjson, headers
from txmq.protocol.codes import RequestCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    FrameTooLargeError,
    InvalidParameterError,
    ProtocolError,
    TxmqError,
)
from txmq.protocol.frame import FrameDecoder, decode_header, encode_frame
from txmq.protocol.locks import LockBatchRequest, decode_lock_response
from txmq.protocol.message import (
    MessageExt,
    batch_entry_at,
    decode_batch,
    decode_messages,
    encode_batch,
    encode_message,
    properties_to_string,
    string_to_properties,
)
from txmq.protocol.txn_offsets import TxnOffsets

Target = Callable[[bytes], None]

#: Every request header class a broker or client decodes from ``extFields``.
HEADER_CLASSES: tuple[type[headers.Header], ...] = tuple(
    sorted(
        (
            cls
            for cls in vars(headers).values()
            if isinstance(cls, type)
            and issubclass(cls, headers.Header)
            and cls is not headers.Header
        ),
        key=lambda c: c.__name__,
    )
)


# -- remoting ----------------------------------------------------------------------------------


def frame(data: bytes) -> None:
    """The remoting frame decoder over a stream: the stream cut in two (where the first byte
    says) decodes as it does whole, every frame it yields encodes again and decodes to the same
    command, and errors are :class:`ProtocolError` only."""
    whole = FrameDecoder()
    whole.feed(data)
    got = _drain(whole, len(data))
    cut = data[0] % (len(data) + 1) if data else 0
    split = FrameDecoder()
    split.feed(data[:cut])
    got_split = _drain(split, len(data))
    if got_split[-1] != "too large":
        split.feed(data[cut:])
        got_split += _drain(split, len(data))
    assert [x for x in got_split if x != "more"] == [x for x in got if x != "more"], (
        "the stream decoded differently when cut in two"
    )


def _drain(dec: FrameDecoder, bound: int) -> list[object]:
    """What the decoder yields until it needs more bytes: commands (as comparable tuples),
    "malformed", and "too large" last when the stream cannot go on."""
    out: list[object] = []
    for _ in range(bound + 2):  # each frame taken consumes at least its 4-byte length
        try:
            cmd = dec.next_command()
        except FrameTooLargeError:
            return [*out, "too large"]
        except ProtocolError:
            out.append("malformed")  # the frame is consumed; the stream goes on
            continue
        if cmd is None:
            return [*out, "more"]
        _check_command(cmd)
        out.append((cmd.code, cmd.opaque, cmd.flag, cmd.remark, cmd.body, sorted(cmd.ext_fields)))
    raise AssertionError("the frame decoder went on without consuming its input")


def _check_command(cmd: RemotingCommand) -> None:
    assert isinstance(cmd.ext_fields, dict)
    assert all(isinstance(k, str) for k in cmd.ext_fields)
    try:
        again = encode_frame(cmd)
    except ProtocolError:
        return  # a value the encoding cannot carry back (e.g. a msgpack int beyond 64 bits)
    dec = FrameDecoder(max_frame_size=len(again) + 8)
    dec.feed(again)
    back = dec.next_command()
    assert back is not None and not dec.buffered, "an encoded frame did not decode whole"
    assert (back.code, back.opaque, back.flag, back.body) == (
        cmd.code,
        cmd.opaque,
        cmd.flag,
        cmd.body,
    ), "a decoded frame did not survive encoding again"


def remoting_header(data: bytes) -> None:
    """One header (first byte: the serialize type) decoded, then read as every typed request
    header: :class:`ProtocolError` or :class:`InvalidParameterError` only."""
    if not data:
        return
    try:
        cmd = decode_header(data[0] % 4, data[1:], b"")
    except ProtocolError:
        return
    ext = cmd.ext_fields
    for cls in HEADER_CLASSES:
        try:
            cls.from_ext_fields(ext)
        except InvalidParameterError:
            pass
    try:
        headers.SendMessageRequestHeader.from_v2_ext_fields(ext)
    except InvalidParameterError:
        pass


_BODY_REQUESTS = (RequestCode.HEART_BEAT, RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ)


def remoting_body(data: bytes) -> None:
    """The JSON bodies of remoting requests and answers (first byte: which): heartbeats,
    queue locks and their answer, transactional consumer offsets; each parser raises its
    documented error, and the ACL's reading of a body (what the request needs) raises
    nothing."""
    if not data:
        return
    kind, body = data[0] % 4, data[1:]
    try:
        if kind == 0:
            parse_heartbeat(body)
        elif kind == 1:
            LockBatchRequest.decode(body)
        elif kind == 2:
            decode_lock_response(body)
        else:
            TxnOffsets.decode(body)
    except (InvalidParameterError, ProtocolError):
        pass
    # The ACL reads these bodies before any processor does (no transaction table needed).
    code = _BODY_REQUESTS[data[0] % len(_BODY_REQUESTS)]
    admin_only, needs = requirements(RemotingCommand(code=code, body=body), cast(Any, None))
    assert admin_only is False and isinstance(needs, list)


# -- messages ----------------------------------------------------------------------------------


def properties(data: bytes) -> None:
    """The ``key\\x01value\\x02`` properties string: a dict of strings; what encodes again
    reads back the same."""
    text = data.decode("utf-8", "replace")
    props = string_to_properties(text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())
    try:
        again = properties_to_string(props)
    except ProtocolError:
        return  # a value holding a separator (the parser keeps what follows the first one)
    assert string_to_properties(again) == props, "properties did not survive encoding"


def batch(data: bytes) -> None:
    """A SEND_BATCH_MESSAGE body: :class:`ProtocolError` only; what decodes is what the fast
    path's reader (``batch_entry_at``) sees, and encodes to a body that decodes the same."""
    try:
        entries = decode_batch(data)
    except ProtocolError:
        return
    pos = 0
    for body, flag, _props in entries:
        at = batch_entry_at(data, pos, len(data))
        assert at is not None, f"decode_batch took an entry at {pos} the fast path refuses"
        size, at_flag, at_body, _start, _end = at
        assert (at_flag, at_body) == (flag, body)
        pos += size
    assert pos == len(data)
    try:
        again = encode_batch(entries)
    except ProtocolError:
        return
    assert decode_batch(again) == entries, "a decoded batch did not survive encoding"


def stored_message(data: bytes) -> None:
    """Stored message records (PULL bodies, commit-log payloads): :class:`ProtocolError` from
    the decoder, ``ValueError`` from the store's dispatch reader; a decoded record encodes
    again."""
    try:
        messages = decode_messages(data)
    except ProtocolError:
        messages = []
    for m in messages:
        assert isinstance(m, MessageExt)
        assert isinstance(m.properties, dict)
        try:
            encode_message(m)
        except ProtocolError:
            pass  # properties holding a separator in a value cannot be written back
    try:
        info = parse_dispatch_info(data)
    except ValueError:
        return
    assert isinstance(info.topic, str) and info.topic


# -- gRPC --------------------------------------------------------------------------------------


_PEER = "10.0.0.9"
#: Small, so that a gzip body the fuzzer makes can inflate past it.
_MAX_BODY = 64 * 1024


def grpc_request(data: bytes) -> None:
    """A RocketMQ 5 request as protobuf bytes (first byte: which request), converted as the
    gRPC front end does: protobuf's ``DecodeError``, a :class:`GrpcStatusError` or a
    :class:`TxmqError`; a message that passes the checks can be stored."""
    if not data:
        return
    kind, raw = data[0] % 3, data[1:]
    try:
        if kind == 0:
            send = spb.SendMessageRequest.FromString(raw)
            for m in send.messages:
                _convert_message(m)
        elif kind == 1:
            recv = spb.ReceiveMessageRequest.FromString(raw)
            fe = recv.filter_expression
            convert.resource_name(recv.group)
            convert.duration_s(recv.invisible_duration)
            convert.duration_s(recv.long_polling_timeout)
            if recv.HasField("filter_expression") and fe.type == pb.SQL:
                compile_sql(fe.expression)
        else:
            ack = spb.AckMessageRequest.FromString(raw)
            for e in ack.entries:
                _receipt_handle(e.receipt_handle)
    except (DecodeError, convert.GrpcStatusError, TxmqError, SqlFilterError):
        return


def _convert_message(m: pb.Message) -> None:
    convert.check_message(m, _MAX_BODY)
    topic = convert.resource_name(m.topic)
    validate_topic(topic)
    msg = convert.to_message_ext(m, topic, _PEER, 1, _MAX_BODY)
    assert len(msg.body) <= _MAX_BODY, "an inflated body is over the limit"
    if m.system_properties.HasField("delivery_timestamp"):
        convert.timestamp_ms(m.system_properties.delivery_timestamp)
    # What passed the checks is stored: it must have a stored form.
    try:
        encode_message(msg)
    except ProtocolError as exc:
        raise AssertionError(f"a message that passed the checks cannot be stored: {exc}") from exc


def _receipt_handle(handle: str) -> None:
    try:
        qid, offset, nonce = parse_handle(handle)
    except ReceiptHandleError:
        return
    assert qid >= 0 and offset >= 0 and nonce


# -- files -------------------------------------------------------------------------------------

_ACL_DIR: str | None = None


def acl_file(data: bytes) -> None:
    """The ACL file (``plain_acl.yml``) as the broker loads it: :class:`AclConfigError`
    only."""
    global _ACL_DIR
    if _ACL_DIR is None:
        _ACL_DIR = scratch.mkdtemp("txmq-fuzz-acl-")
    path = os.path.join(_ACL_DIR, "plain_acl.yml")
    with open(path, "wb") as fh:
        fh.write(data)
    try:
        cfg = load_acl_file(path)
    except AclConfigError:
        return
    for account in cfg.accounts.values():
        pattern = account.white_remote_address
        if pattern is not None:
            assert isinstance(pattern.match("192.168.1.10"), bool)
        account.perm("TopicA", False)
    for p in cfg.global_white:
        assert isinstance(p.match("10.1.2.3"), bool)
        assert isinstance(p.match("::1"), bool)


_STORE_DIR: str | None = None


def store_files(data: bytes) -> None:
    """The store's own files (first byte: which): the topic table (``topics.json``), the
    consumer offsets and the store checkpoint, read as the store reads them at start:
    :class:`StoreCorruptError` only (an unreadable checkpoint is None: the commit log is
    dispatched again)."""
    global _STORE_DIR
    if not data:
        return
    if _STORE_DIR is None:
        _STORE_DIR = scratch.mkdtemp("txmq-fuzz-store-")
    kind = data[0] % 3
    path = os.path.join(_STORE_DIR, ("topics.json", "consumerOffset.json", "checkpoint")[kind])
    with open(path, "wb") as fh:
        fh.write(data[1:])
    try:
        if kind == 0:
            topics = TopicConfigManager(path)
            topics.load()
            for tc in topics.all().values():
                assert isinstance(tc.topic_name, str) and isinstance(tc.read_queue_nums, int)
        elif kind == 1:
            ConsumerOffsetManager(path).load()
        else:
            cp = StoreCheckpoint.read(path)
            assert cp is None or isinstance(cp.physic_offset, int)
    except StoreCorruptError:
        return


def op_record(data: bytes) -> None:
    """A body of the transaction op queue: :class:`OpRecordError` only; a record decoded
    encodes to one that decodes the same."""
    try:
        rec = OpRecord.decode(data)
    except OpRecordError:
        return
    assert OpRecord.decode(rec.encode()) == rec, "an op record did not survive encoding"


def tx_snapshot(data: bytes) -> None:
    """The transaction table's snapshot file, decoded and restored into an empty state
    machine: :class:`SnapshotError` only."""
    try:
        snap = snapshot.decode(data)
        snapshot.restore(TransactionStateMachine(), snap)
    except snapshot.SnapshotError:
        return


def check_state(data: bytes) -> None:
    """The check-state index (``checkState.json``): :class:`CheckStateError` only."""
    try:
        rows = parse_check_state(data)
    except CheckStateError:
        return
    for txid, times, last in rows:
        assert isinstance(txid, str) and isinstance(times, int) and isinstance(last, int)


# -- text --------------------------------------------------------------------------------------

_PROPS: tuple[dict[str, str], ...] = (
    {},
    {"a": "1", "b": "abc", "c": "1.5", "d": "true", "TAGS": "TagA", "KEYS": "k1 k2"},
    {"a": "-7", "b": "", "c": "x", "d": "FALSE", "e": "9223372036854775808"},
)


def sql_filter(data: bytes) -> None:
    """A SQL92 property filter (up to the first NUL) compiled and evaluated over property
    maps and over the stored record after the NUL: :class:`SqlFilterError` at compile time
    only; evaluation gives a bool and raises nothing."""
    expr, _, record = data.partition(b"\x00")
    try:
        f = compile_sql(expr.decode("utf-8", "replace"))
    except SqlFilterError:
        return
    for props in _PROPS:
        assert isinstance(f.matches(props), bool)
    assert isinstance(f.matches_stored(record), bool)


def fastjson_doc(data: bytes) -> None:
    """fastjson's object-keyed JSON (admin bodies): ``ValueError`` only."""
    try:
        doc = fastjson.loads(data)
    except ValueError:
        return
    fastjson.dumps(doc)


#: The targets by name (the name is also the corpus folder's).
TARGETS: dict[str, Target] = {
    "frame": frame,
    "remoting_header": remoting_header,
    "remoting_body": remoting_body,
    "properties": properties,
    "batch": batch,
    "stored_message": stored_message,
    "grpc_request": grpc_request,
    "acl_file": acl_file,
    "store_files": store_files,
    "op_record": op_record,
    "tx_snapshot": tx_snapshot,
    "check_state": check_state,
    "sql_filter": sql_filter,
    "fastjson": fastjson_doc,
}

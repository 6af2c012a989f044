"""Golden bytes for the wire and stored formats.

Every expected byte string below was written by hand from the layouts in docs/protocol.md (and
checked against RocketMQ's ``RemotingCommand``, ``RocketMQSerializable`` and ``MessageDecoder``),
not copied from the encoder's output.  Each is checked in both directions: the encoder must
produce exactly these bytes and the decoder must read them back into the same value.  If one of
these tests fails, a wire format changed: that breaks every client in the field.
"""

from __future__ import annotations

import zlib
from typing import Any

from txmq.protocol.codes import LanguageCode, RequestCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.frame import decode_frame, encode_frame
from txmq.protocol.message import (
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MessageExt,
    create_offset_msg_id,
    decode_batch,
    decode_message,
    decode_offset_msg_id,
    encode_batch,
    encode_message,
)


def h(annotated: str) -> bytes:
    """Hex digits; spaces, line breaks and ``# comments`` are ignored."""
    return bytes.fromhex(
        "".join(line.split("#")[0] for line in annotated.splitlines()).replace(" ", "")
    )


#: SEND_MESSAGE (10), opaque 1, extFields {topic: "T", queueId: 1}, body b"hi"; language PYTHON
#: (3) and version 1 are RemotingCommand's defaults.
SEND: dict[str, Any] = dict(code=RequestCode.SEND_MESSAGE, opaque=1, body=b"hi")


# --- frames -----------------------------------------------------------------------------------

MSGPACK_FRAME = h(
    """
    00000052                    # length 82 = 4 + 76 + 2
    0200004c                    # serialize type 2 (MSGPACK) << 24 | header length 76
    87                          # map, 7 entries
    a4 636f6465 0a              # "code": 10
    a8 6c616e6775616765 03      # "language": 3
    a7 76657273696f6e 01        # "version": 1
    a6 6f7061717565 01          # "opaque": 1
    a4 666c6167 00              # "flag": 0
    a6 72656d61726b c0          # "remark": nil
    a9 6578744669656c6473 82    # "extFields": map, 2 entries
    a5 746f706963 a1 54         #    "topic": "T"
    a7 71756575654964 01        #    "queueId": 1 (a native int)
    6869                        # body "hi"
    """
)


def test_golden_msgpack_frame() -> None:
    cmd = RemotingCommand(**SEND, ext_fields={"topic": "T", "queueId": 1})
    assert len(MSGPACK_FRAME) == 86
    assert encode_frame(cmd) == MSGPACK_FRAME
    assert decode_frame(MSGPACK_FRAME) == cmd


# {"code":10,"language":"PYTHON","version":1,"opaque":1,"flag":0,
#  "serializeTypeCurrentRPC":"JSON","extFields":{"topic":"T","queueId":"1"}}   (136 bytes)
JSON_FRAME = h(
    """
    0000008e 00000088           # length 142 = 4 + 136 + 2; type 0 (JSON), header length 136
    7b22636f6465223a31302c226c616e67 75616765223a22505954484f4e222c22
    76657273696f6e223a312c226f706171 7565223a312c22666c6167223a302c22
    73657269616c697a6554797065437572 72656e74525043223a224a534f4e222c
    226578744669656c6473223a7b22746f 706963223a2254222c22717565756549
    64223a2231227d7d
    6869                        # body "hi"
    """
)


def test_golden_json_frame() -> None:
    header = (
        b'{"code":10,"language":"PYTHON","version":1,"opaque":1,"flag":0,'
        b'"serializeTypeCurrentRPC":"JSON","extFields":{"topic":"T","queueId":"1"}}'
    )
    assert JSON_FRAME[8:-2] == header  # the hex above spells exactly this text
    cmd = RemotingCommand(
        **SEND, ext_fields={"topic": "T", "queueId": 1}, serialize_type=SerializeType.JSON
    )
    assert encode_frame(cmd) == JSON_FRAME
    # JSON carries every extFields value as a string (RocketMQ requires it).
    want = RemotingCommand(
        **SEND, ext_fields={"topic": "T", "queueId": "1"}, serialize_type=SerializeType.JSON
    )
    assert decode_frame(JSON_FRAME) == want


# RocketMQSerializable.rocketMQProtocolEncode: code i16 | language u8 | version i16 |
# opaque i32 | flag i32 | remark len i32 + bytes | extFields len i32 +
# (key len i16 + key, value len i32 + value)*
ROCKETMQ_FRAME = h(
    """
    00000035 0100002f           # length 53 = 4 + 47 + 2; type 1 (ROCKETMQ), header length 47
    000a 03 0001                # code 10, language 3 (PYTHON), version 1
    00000001 00000000           # opaque 1, flag 0
    00000000                    # remark: length 0 (null)
    0000001a                    # extFields: 26 bytes
    0005 746f706963 00000001 54         # "topic" -> "T"
    0007 71756575654964 00000001 31     # "queueId" -> "1"
    6869                        # body "hi"
    """
)


def test_golden_rocketmq_frame() -> None:
    cmd = RemotingCommand(
        **SEND, ext_fields={"topic": "T", "queueId": 1}, serialize_type=SerializeType.ROCKETMQ
    )
    assert encode_frame(cmd) == ROCKETMQ_FRAME
    want = RemotingCommand(
        **SEND, ext_fields={"topic": "T", "queueId": "1"}, serialize_type=SerializeType.ROCKETMQ
    )
    assert decode_frame(ROCKETMQ_FRAME) == want


# A response with a remark and no extFields or body: the remark is length-prefixed (i32).
ROCKETMQ_RESPONSE = h(
    """
    0000001b 01000017           # length 27 = 4 + 23; type 1, header length 23
    0000 03 0001                # code 0 (SUCCESS), language 3, version 1
    00000001 00000001           # opaque 1, flag 1 (response)
    00000002 6f6b               # remark "ok"
    00000000                    # no extFields
    """
)


def test_golden_rocketmq_response_with_remark() -> None:
    cmd = RemotingCommand(
        code=0, opaque=1, flag=1, remark="ok", serialize_type=SerializeType.ROCKETMQ
    )
    assert encode_frame(cmd) == ROCKETMQ_RESPONSE
    got = decode_frame(ROCKETMQ_RESPONSE)
    assert got == cmd and got.is_response and not got.is_oneway


# What a Java client sends: SEND_MESSAGE_V2 (310 = 0x0136), language JAVA (0), version 413
# (0x019d, V4_9_4), opaque 42, extFields {"b": "T"}, body b"x".
JAVA_ROCKETMQ_REQUEST = h(
    """
    00000022 0100001d           # length 34 = 4 + 29 + 1; type 1, header length 29
    0136 00 019d                # code 310, language 0 (JAVA), version 413
    0000002a 00000000           # opaque 42, flag 0
    00000000                    # no remark
    00000008 0001 62 00000001 54        # extFields: "b" -> "T"
    78                          # body "x"
    """
)


def test_golden_java_style_rocketmq_request_decodes() -> None:
    cmd = decode_frame(JAVA_ROCKETMQ_REQUEST)
    assert cmd == RemotingCommand(
        code=RequestCode.SEND_MESSAGE_V2,
        opaque=42,
        ext_fields={"b": "T"},
        body=b"x",
        language=LanguageCode.JAVA,
        version=413,
        serialize_type=SerializeType.ROCKETMQ,
    )
    assert encode_frame(cmd) == JAVA_ROCKETMQ_REQUEST


def test_oneway_flag_bit() -> None:
    # flag bit 1 (value 2) = oneway, bit 0 = response (RemotingCommand.RPC_ONEWAY / RPC_TYPE).
    cmd = RemotingCommand.request(
        RequestCode.END_TRANSACTION, oneway=True, serialize_type=SerializeType.ROCKETMQ
    )
    frame = encode_frame(cmd)
    assert frame[8 + 9 : 8 + 13] == h("00000002")
    assert decode_frame(frame).is_oneway


# --- stored message ---------------------------------------------------------------------------

STORED_MESSAGE = h(
    """
    00000065                    # TOTALSIZE 101
    daa320a7                    # MAGICCODE -626843481 (V1)
    58932aac                    # BODYCRC crc32(b"hi") & 0x7fffffff
    00000001                    # QUEUEID 1
    00000002                    # FLAG 2
    0000000000000003            # QUEUEOFFSET 3
    0000000000000004            # PHYSICALOFFSET 4
    00000008                    # SYSFLAG 8 (transaction commit)
    0000000000000005            # BORNTIMESTAMP 5
    0a000001 00000006           # BORNHOST 10.0.0.1:6
    0000000000000007            # STORETIMESTAMP 7
    0a000002 00002a9f           # STOREHOST 10.0.0.2:10911
    00000009                    # RECONSUMETIMES 9
    000000000000000a            # PREPARED_TRANSACTION_OFFSET 10
    00000002 6869               # BODY length 2, "hi"
    01 54                       # TOPIC length 1, "T"
    0007 54414753 01 61 02      # PROPERTIES length 7, "TAGS" \x01 "a" \x02
    """
)


STORED = MessageExt(
    topic="T",
    body=b"hi",
    queue_id=1,
    flag=2,
    queue_offset=3,
    commit_log_offset=4,
    sys_flag=8,
    born_timestamp=5,
    born_host=("10.0.0.1", 6),
    store_timestamp=7,
    store_host=("10.0.0.2", 10911),
    reconsume_times=9,
    prepared_transaction_offset=10,
    properties={"TAGS": "a"},
)


def test_golden_stored_message() -> None:
    assert MESSAGE_MAGIC_CODE == -626843481
    assert MESSAGE_MAGIC_CODE & 0xFFFFFFFF == 0xDAA320A7
    assert zlib.crc32(b"hi") & 0x7FFFFFFF == 0x58932AAC
    assert len(STORED_MESSAGE) == 101
    assert encode_message(STORED) == STORED_MESSAGE
    got = decode_message(STORED_MESSAGE)
    assert got == STORED.copy(body_crc=0x58932AAC, store_size=101)
    assert got.tags == "a"
    assert got.offset_msg_id == "0A00000200002A9F0000000000000004"


def test_golden_stored_message_with_long_topic_uses_v2() -> None:
    # RocketMQ's V1 topic length is a signed byte: topics over 127 bytes take MAGIC_CODE_V2 and
    # a two-byte length (CommitLog's autoMessageVersionOnTopicLen).
    topic = "%RETRY%" + "g" * 121  # 128 bytes
    msg = MessageExt(topic=topic, body=b"", store_host=("10.0.0.2", 10911))
    raw = encode_message(msg)
    assert MESSAGE_MAGIC_CODE_V2 & 0xFFFFFFFF == 0xDAA320AB
    assert raw[4:8] == h("daa320ab")
    assert raw[88:90] == h("0080")  # topic length as i16, right after the empty body
    assert raw[90:218] == topic.encode()
    assert raw[218:] == h("0000")  # no properties
    assert len(raw) == int.from_bytes(raw[:4], "big") == 88 + 2 + 128 + 2
    assert decode_message(raw).topic == topic

    short = encode_message(msg.copy(topic="t" * 127))
    assert short[4:8] == h("daa320a7") and short[88] == 127


def test_golden_offset_msg_id() -> None:
    # MessageDecoder.createMessageId: store IP (4) + port (i32) + commit-log offset (i64), hex.
    assert create_offset_msg_id(("10.0.0.2", 10911), 4) == "0A00000200002A9F0000000000000004"
    assert decode_offset_msg_id("0A00000200002A9F0000000000000004") == (("10.0.0.2", 10911), 4)


# --- SEND_BATCH_MESSAGE body ------------------------------------------------------------------

# MessageDecoder.encodeMessages: per message TOTALSIZE i32 | MAGICCODE i32 (0) | BODYCRC i32 (0)
# | FLAG i32 | BODY len i32 + bytes | PROPERTIES len i16 + string.
BATCH_BODY = h(
    """
    0000001f 00000000 00000000  # TOTALSIZE 31, MAGICCODE 0, BODYCRC 0
    00000003 00000002 6869      # FLAG 3, BODY length 2, "hi"
    0007 54414753 01 61 02      # PROPERTIES "TAGS" \x01 "a" \x02
    00000016 00000000 00000000  # TOTALSIZE 22, MAGICCODE 0, BODYCRC 0
    00000000 00000000           # FLAG 0, empty BODY
    0000                        # no PROPERTIES
    """
)


def test_golden_batch_body() -> None:
    batch = [(b"hi", 3, {"TAGS": "a"}), (b"", 0, {})]
    assert encode_batch(batch) == BATCH_BODY
    assert decode_batch(BATCH_BODY) == batch

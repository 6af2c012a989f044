"""Seed inputs of every fuzz target, made by the product's own encoders (and the golden frames).

``python -m tests.fuzz.seeds`` writes them into ``tests/fuzz/corpus/<target>/`` (named by their
SHA-1, as libFuzzer names what it adds), next to whatever the corpus already holds.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import tempfile

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
from txmq.broker.store.checkpoint import StoreCheckpoint
from txmq.broker.store.consumer_offset import ConsumerOffsetManager
from txmq.broker.store.topic_config import TopicConfig, TopicConfigManager
from txmq.broker.transaction import snapshot
from txmq.broker.transaction.machine import TransactionStateMachine
from txmq.broker.transaction.state import HalfRef, OpKind, OpRecord, TxRecord, TxState
from txmq.protocol.codes import LanguageCode, RequestCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.frame import encode_frame, encode_header
from txmq.protocol.headers import (
    EndTransactionRequestHeader,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from txmq.protocol.locks import LockBatchRequest, encode_lock_response
from txmq.protocol.message import (
    MessageExt,
    encode_batch,
    encode_message,
    properties_to_string,
)
from txmq.protocol.txn_offsets import QueueOffset, TxnOffsets

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def _commands() -> list[RemotingCommand]:
    send = SendMessageRequestHeader(producer_group="pg", topic="TopicA", queue_id=1, sys_flag=4)
    pull = PullMessageRequestHeader(
        consumer_group="cg",
        topic="TopicA",
        queue_id=0,
        queue_offset=7,
        max_msg_nums=32,
        sys_flag=2,
        commit_offset=0,
        suspend_timeout_millis=1000,
        subscription="TagA || TagB",
        sub_version=1,
    )
    end = EndTransactionRequestHeader(
        producer_group="pg",
        tran_state_table_offset=3,
        commit_log_offset=4096,
        commit_or_rollback=8,
        msg_id="0A00000100002A9F0000000000001000",
        transaction_id="tx-1",
    )
    out = []
    for st in SerializeType:
        out += [
            RemotingCommand(
                code=RequestCode.SEND_MESSAGE,
                opaque=1,
                ext_fields=send.to_ext_fields(),
                body=b"hi",
                serialize_type=st,
            ),
            RemotingCommand(
                code=RequestCode.SEND_MESSAGE_V2,
                opaque=2,
                ext_fields=send.to_v2_ext_fields(),
                serialize_type=st,
                language=LanguageCode.JAVA,
            ),
            RemotingCommand(
                code=RequestCode.PULL_MESSAGE,
                opaque=3,
                ext_fields=pull.to_ext_fields(),
                serialize_type=st,
            ),
            RemotingCommand(
                code=RequestCode.END_TRANSACTION,
                opaque=4,
                flag=2,
                remark="from the producer",
                ext_fields=end.to_ext_fields(),
                serialize_type=st,
            ),
        ]
    return out


def _bodies() -> list[bytes]:
    heartbeat = {
        "clientID": "10.0.0.1@1234",
        "producerDataSet": [{"groupName": "pg"}],
        "consumerDataSet": [
            {
                "groupName": "cg",
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [
                    {"topic": "TopicA", "subString": "TagA || TagB", "expressionType": "TAG"}
                ],
            }
        ],
    }
    mqs = frozenset({("TopicA", "broker-a", 0), ("TopicA", "broker-a", 1)})
    offsets = TxnOffsets("cg", 7, "10.0.0.1@1234", (QueueOffset("TopicA", "broker-a", 0, 42, 40),))
    return [
        b"\x00" + json.dumps(heartbeat).encode(),
        b"\x01" + LockBatchRequest("cg", "10.0.0.1@1234", mqs, True).encode(),
        b"\x02" + encode_lock_response(mqs),
        b"\x03" + offsets.encode(),
    ]


def _store_files() -> list[bytes]:
    """topics.json, consumerOffset.json and the checkpoint as the store writes them."""
    with tempfile.TemporaryDirectory() as d:
        topics = TopicConfigManager(os.path.join(d, "topics.json"))
        topics.put(TopicConfig("TopicA", 8, 8, order=True))
        topics.put(TopicConfig("%RETRY%cg", 1, 1))
        offsets = ConsumerOffsetManager(os.path.join(d, "consumerOffset.json"))
        offsets.commit("cg", "TopicA", 0, 42)
        offsets.commit("cg", "TopicA", 3, 7)
        offsets.persist()
        StoreCheckpoint(4096, 8192, 1_700_000_000_000, {("TopicA", 0): 42}).write(
            os.path.join(d, "checkpoint")
        )
        out = []
        for i, name in enumerate(("topics.json", "consumerOffset.json", "checkpoint")):
            with open(os.path.join(d, name), "rb") as fh:
                out.append(bytes([i]) + fh.read())
    return out


def _message(topic: str = "TopicA", **kw: object) -> MessageExt:
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "0A0000010000AB", "a": "1"}
    return MessageExt(
        topic=topic,
        body=b"hello",
        queue_id=1,
        queue_offset=3,
        commit_log_offset=4096,
        sys_flag=kw.pop("sys_flag", 0),  # type: ignore[arg-type]
        born_timestamp=1_700_000_000_000,
        born_host=("10.0.0.1", 5000),
        store_timestamp=1_700_000_000_100,
        store_host=("10.0.0.2", 10911),
        properties=props,
    )


def _grpc() -> list[bytes]:
    m = pb.Message(body=b"hello")
    m.topic.name = "TopicA"
    m.user_properties["a"] = "1"
    sp = m.system_properties
    sp.message_id = "0A0000010000AB"
    sp.tag = "TagA"
    sp.keys.extend(["k1", "k2"])
    sp.message_type = pb.NORMAL
    sp.body_encoding = pb.IDENTITY
    sp.born_host = "10.0.0.1"
    sp.born_timestamp.seconds = 1_700_000_000
    fifo = pb.Message()
    fifo.CopyFrom(m)
    fifo.system_properties.message_type = pb.FIFO
    fifo.system_properties.message_group = "g1"
    delay = pb.Message()
    delay.CopyFrom(m)
    delay.system_properties.message_type = pb.DELAY
    delay.system_properties.delivery_timestamp.seconds = 1_800_000_000
    tx = pb.Message()
    tx.CopyFrom(m)
    tx.system_properties.message_type = pb.TRANSACTION
    tx.system_properties.orphaned_transaction_recovery_duration.seconds = 30
    zipped = pb.Message()
    zipped.CopyFrom(m)
    zipped.body = gzip.compress(b"hello " * 10_000)  # 60,000 bytes inflated
    zipped.system_properties.body_encoding = pb.GZIP
    send = spb.SendMessageRequest(messages=[m, fifo, delay, tx, zipped])
    recv = spb.ReceiveMessageRequest(batch_size=16, auto_renew=True)
    recv.group.name = "cg"
    recv.message_queue.topic.name = "TopicA"
    recv.filter_expression.type = pb.SQL
    recv.filter_expression.expression = "a > 0 AND TAGS IN ('TagA')"
    recv.invisible_duration.seconds = 30
    ack = spb.AckMessageRequest()
    ack.group.name = "cg"
    ack.entries.add(message_id="m1", receipt_handle="0badf00d-1-42-abcd")
    return [
        b"\x00" + send.SerializeToString(),
        b"\x01" + recv.SerializeToString(),
        b"\x02" + ack.SerializeToString(),
    ]


def _tx_table() -> TransactionStateMachine:
    m = TransactionStateMachine()
    half = HalfRef(4096, 0, "TopicA", 1, 1_700_000_000_000, "U1", "0A00000100002A9F", None)
    rec = TxRecord("tx-1", "pg", halves=[half], check_times=2, last_check_ms=5)
    m.records[rec.transaction_id] = rec
    m.pending[rec.transaction_id] = rec
    done = TxRecord(
        "tx-2",
        "pg",
        state=TxState.COMMITTED,
        halves=[HalfRef(8192, 1, "TopicB", 0, 1, "U2", "0A", 30_000)],
        batch_key="b1",
        decided_ms=10,
        decided_by="producer",
        decision_end_offset=9000,
        remark="producer",
    )
    m.records[done.transaction_id] = done
    m.batches[("pg", "b1")] = {"committed": ["tx-2"], "rolledBack": []}
    return m


ACL_FILE = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.{1,2}
  - 10.0.0.0/8
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.1-100
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
    groupPerms:
      - groupA=DENY
  - accessKey: rocketmq2
    secretKey: 12345678
    admin: true
"""

SQL = [
    "a > 0",
    "a BETWEEN 1 AND 3 AND b = 'abc'",
    "TAGS IN ('TagA', 'TagB') OR c IS NULL",
    "NOT (d = TRUE) AND e IS NOT NULL",
    "b LIKE 'a%' OR b NOT LIKE '_x'",
    "(a + 1) * 2 >= -3.5 AND c <> 'x'",
    "b CONTAINS 'bc' OR b STARTSWITH 'a' OR b ENDSWITH 'c'",
]


def seeds() -> dict[str, list[bytes]]:
    """Seed inputs by target name."""
    frames = [encode_frame(c) for c in _commands()]
    stored = [
        encode_message(_message()),
        encode_message(_message("T" * 200)),
        encode_message(_message(sys_flag=4)),
    ]
    op_records = [
        OpRecord(OpKind.COMMIT, "pg", ("tx-1",), (4096,), "producer", 5).encode(),
        OpRecord(OpKind.ROLLBACK, "pg", ("tx-2",), remark="operator: ticket 42").encode(),
        OpRecord(OpKind.BATCH, "pg", ("tx-3",), batch_key="b1", committed=("tx-4",)).encode(),
        OpRecord(OpKind.RESUME, "pg", ("tx-5",)).encode(),
    ]
    table = _tx_table()
    snap = snapshot.encode(snapshot.take(table, 9000, 2, 1))
    check = json.dumps({"version": 1, "checks": {"tx-1": [2, 1_700_000_000_000]}}).encode()
    sql = [e.encode() for e in SQL]
    sql.append(b"a > 0\x00" + stored[0])
    sql.append(b"TAGS = 'TagA'\x00" + stored[1])
    return {
        "frame": [frames[0] + frames[1], *frames],
        "remoting_header": [bytes([int(c.serialize_type)]) + encode_header(c) for c in _commands()],
        "remoting_body": _bodies(),
        "properties": [
            properties_to_string({"TAGS": "TagA", "KEYS": "k1 k2", "a": "1"}).encode(),
            b"a\x01b\x02\x02c\x01\x01d",
        ],
        "batch": [
            encode_batch([(b"one", 0, {"UNIQ_KEY": "U1", "TAGS": "TagA"})]),
            encode_batch([(b"a", 1, {"UNIQ_KEY": "U1"}), (b"bb", 2, {"UNIQ_KEY": "U2"})]),
        ],
        "stored_message": [*stored, stored[0] + stored[1]],
        "grpc_request": _grpc(),
        "acl_file": [ACL_FILE.encode()],
        "store_files": _store_files(),
        "op_record": op_records,
        "tx_snapshot": [snap],
        "check_state": [check],
        "sql_filter": sql,
        "fastjson": [
            b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:'
            b'{"brokerOffset":5,"consumerOffset":3,"lastTimestamp":0}},"consumeTps":0.5}',
            b'[1, "x", true, null, {"a": [1.5e3]}]',
        ],
    }


def write(corpus: str = CORPUS) -> int:
    """Write the seeds into the corpus folders; the number of files written."""
    n = 0
    for name, inputs in seeds().items():
        folder = os.path.join(corpus, name)
        os.makedirs(folder, exist_ok=True)
        for data in inputs:
            path = os.path.join(folder, hashlib.sha1(data).hexdigest())
            if not os.path.exists(path):
                with open(path, "wb") as fh:
                    fh.write(data)
                n += 1
    return n


if __name__ == "__main__":
    print(f"{write()} seed files written under {CORPUS}", file=sys.stderr)

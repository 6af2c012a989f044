"""Finding messages by key and by message id on a real broker: the SDK's admin calls,
QUERY_MESSAGE on the wire as RocketMQ defines it, and the ``txmq message`` commands."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

from click.testing import CliRunner

from tests.client.helpers import FAST_CLIENT
from tests.support.brokers import started
from tests.support.raw import connected
from tests.support.waiting import wait_until, wait_until_sync
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.broker.store.index import key_hash
from txmq.cli import main
from txmq.client import (
    AsyncProducer,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    TransactionListener,
)
from txmq.client.admin import AsyncAdminClient
from txmq.client.sync import Producer
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.errors import QueryNotFoundError, ServiceNotAvailableError, TopicNotExistError
from txmq.protocol.message import decode_messages, decode_offset_msg_id

FAR_FUTURE = 2**62
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


def _offset(offset_msg_id: str) -> int:
    return decode_offset_msg_id(offset_msg_id)[1]


async def _indexed(broker: BrokerController) -> None:
    index = broker.index
    assert index is not None
    await wait_until(lambda: index.behind == 0, what="the index to catch up with the commit log")


async def test_find_by_key_and_by_message_id_through_the_sdk(broker: BrokerController) -> None:
    async with AsyncProducer("q-producer", broker=broker.address, config=FAST_CLIENT) as p:
        sent = [
            await p.send(Message("orders", f"order {i}", tags="created", keys=f"o-{i % 5} shop-1"))
            for i in range(20)
        ]
        await p.send(Message("payments", "same key, other topic", keys="o-1"))
    await _indexed(broker)
    async with AsyncAdminClient(broker.address) as admin:
        found = await admin.query_messages("orders", "o-1")
        assert [m.body for m in found.messages] == [
            b"order 16",
            b"order 11",
            b"order 6",
            b"order 1",
        ]
        assert all(m.topic == "orders" and m.tags == "created" for m in found.messages)
        assert found.index_last_update_phy_offset == broker.store.max_phy_offset
        assert found.index_last_update_timestamp >= found.messages[0].store_timestamp

        everything = await admin.query_messages("orders", "shop-1", max_num=100)
        assert len(everything.messages) == 20
        assert len((await admin.query_messages("orders", "shop-1", max_num=3)).messages) == 3

        by_id = await admin.query_messages("orders", sent[7].msg_id, unique=True)
        assert [m.msg_id for m in by_id.messages] == [sent[7].msg_id]
        assert [m.body for m in by_id.messages] == [b"order 7"]
        # A key query finds a message id too (one index, as in RocketMQ); a unique query
        # does not find a plain key.
        assert len((await admin.query_messages("orders", sent[3].msg_id)).messages) == 1
        assert (await admin.query_messages("orders", "o-1", unique=True)).messages == []

        assert (await admin.query_messages("orders", "no-such-key")).messages == []

        viewed = await admin.view_message(sent[4].offset_msg_id)
        assert viewed.body == b"order 4" and viewed.commit_log_offset == _offset(
            sent[4].offset_msg_id
        )
        by_uniq = await admin.view_message(sent[9].msg_id, topic="orders")
        assert by_uniq.body == b"order 9"


#: Two keys of topic "collide" with the same index hash (found by a birthday search).
COLLIDING = ("25f4ea1b11cc", "7436c76af4e0")


async def test_a_hash_collision_never_returns_the_other_message(broker: BrokerController) -> None:
    k1, k2 = COLLIDING
    assert key_hash(b"collide", k1.encode()) == key_hash(b"collide", k2.encode())
    async with AsyncProducer("q-producer", broker=broker.address, config=FAST_CLIENT) as p:
        await p.send(Message("collide", "one", keys=k1))
        await p.send(Message("collide", "two", keys=k2))
    await _indexed(broker)
    async with AsyncAdminClient(broker.address) as admin:
        assert [m.body for m in (await admin.query_messages("collide", k1)).messages] == [b"one"]
        assert [m.body for m in (await admin.query_messages("collide", k2)).messages] == [b"two"]


class ByBody(TransactionListener):
    """Commits a message whose body says commit, rolls back the rest."""

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        if message.payload == b"commit":
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.ROLLBACK_MESSAGE

    def check_local_transaction(self, message: object) -> LocalTransactionState:
        return LocalTransactionState.ROLLBACK_MESSAGE


async def test_a_transactional_message_is_found_in_its_topic_once_committed(
    broker: BrokerController,
) -> None:
    async with AsyncTransactionProducer("q-tx", ByBody(), broker.address, config=FAST_CLIENT) as tx:
        rolled = await tx.send_message_in_transaction(Message("tx-q", "rollback", keys="tx-r"))
        committed = await tx.send_message_in_transaction(Message("tx-q", "commit", keys="tx-c"))
    async with AsyncAdminClient(broker.address) as admin:

        async def found() -> list[str]:
            res = await admin.query_messages("tx-q", "tx-c")
            return [m.msg_id for m in res.messages]

        # The rollback was decided before the commit (one connection, in order).
        assert await wait_until(found, what="the committed message indexed") == [committed.msg_id]
        assert (await admin.query_messages("tx-q", "tx-r")).messages == []
        assert (await admin.query_messages("tx-q", rolled.msg_id, unique=True)).messages == []


async def test_the_time_range_bounds_what_is_found(broker: BrokerController) -> None:
    async with AsyncProducer("q-producer", broker=broker.address, config=FAST_CLIENT) as p:
        first = await p.send(Message("timed", "early", keys="k"))
        async with AsyncAdminClient(broker.address) as admin:
            await _indexed(broker)
            early = (await admin.query_messages("timed", "k")).messages[0]
            # A later store time, without sleeping a fixed time: send until one is later.
            later = None
            while later is None or later.store_timestamp <= early.store_timestamp:
                res = await p.send(Message("timed", "late", keys="k"))
                await _indexed(broker)
                later = await admin.view_message(res.offset_msg_id)
            t = early.store_timestamp
            only_early = await admin.query_messages("timed", "k", begin=0, end=t)
            assert [m.msg_id for m in only_early.messages] == [first.msg_id]
            only_late = await admin.query_messages("timed", "k", begin=t + 1, end=FAR_FUTURE)
            assert first.msg_id not in [m.msg_id for m in only_late.messages]
            assert only_late.messages and all(m.body == b"late" for m in only_late.messages)


async def test_query_message_on_the_wire(broker: BrokerController) -> None:
    async with AsyncProducer("q-producer", broker=broker.address, config=FAST_CLIENT) as p:
        sent = [await p.send(Message("wire", f"m{i}", keys="wk")) for i in range(3)]
    await _indexed(broker)
    async with connected(broker.address) as raw:
        # What a stock Java client sends: JSON header, string values, RocketMQ's field names.
        ext = {
            "topic": "wire",
            "key": "wk",
            "maxNum": "32",
            "beginTimestamp": "0",
            "endTimestamp": str(FAR_FUTURE),
        }
        resp = await raw.call(RequestCode.QUERY_MESSAGE, ext, st=SerializeType.JSON)
        assert int(RequestCode.QUERY_MESSAGE) == 12
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert int(resp.ext_fields["indexLastUpdatePhyoffset"]) == broker.store.max_phy_offset
        assert int(resp.ext_fields["indexLastUpdateTimestamp"]) > 0
        # The body is the stored messages back to back (MessageDecoder.decodes), as stored.
        msgs = decode_messages(resp.body)
        assert [m.body for m in msgs] == [b"m2", b"m1", b"m0"]
        assert resp.body == b"".join(
            broker.store.read_message_bytes(_offset(r.offset_msg_id)) for r in reversed(sent)
        )
        assert sum(m.store_size for m in msgs) == len(resp.body)

        unique = dict(ext, key=sent[1].msg_id, _UNIQUE_KEY_QUERY="true")
        resp = await raw.call(RequestCode.QUERY_MESSAGE, unique, st=SerializeType.JSON)
        assert resp.code == ResponseCode.SUCCESS
        assert [m.msg_id for m in decode_messages(resp.body)] == [sent[1].msg_id]

        resp = await raw.call(RequestCode.QUERY_MESSAGE, dict(ext, key="none"))
        assert resp.code == ResponseCode.QUERY_NOT_FOUND and int(resp.code) == 22
        assert resp.remark == "can not find message, maybe time range not correct"
        assert "indexLastUpdatePhyoffset" in resp.ext_fields

        resp = await raw.call(RequestCode.QUERY_MESSAGE, dict(ext, topic="no-such-topic"))
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        assert "no-such-topic" in (resp.remark or "")

        missing = {k: v for k, v in ext.items() if k != "maxNum"}
        resp = await raw.call(RequestCode.QUERY_MESSAGE, missing)
        assert resp.code == ResponseCode.INVALID_PARAMETER and "maxNum" in (resp.remark or "")

        # VIEW_MESSAGE_BY_ID is still served.
        resp = await raw.call(
            RequestCode.VIEW_MESSAGE_BY_ID, {"offset": _offset(sent[0].offset_msg_id)}
        )
        assert resp.code == ResponseCode.SUCCESS and decode_messages(resp.body)[0].body == b"m0"


async def test_a_broker_without_the_index_says_so(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    async with started(make_broker_config(message_index_enable=False)) as b:
        assert b.index is None
        async with AsyncAdminClient(b.address) as admin:
            await admin.create_topic("plain")
            try:
                await admin.query_messages("plain", "k")
            except ServiceNotAvailableError as exc:
                assert "messageIndexEnable" in str(exc)
            else:
                raise AssertionError("a query on a broker without the index succeeded")
            try:
                await admin.query_messages("missing-topic", "k")
            except (ServiceNotAvailableError, TopicNotExistError):
                pass
            try:
                await admin.view_message("not-an-id")
            except QueryNotFoundError:
                pass
            else:
                raise AssertionError("viewing a malformed id succeeded")


def test_txmq_message_find_and_show(broker_thread: BrokerController) -> None:
    addr = broker_thread.address
    with Producer("cli-producer", broker=addr) as p:
        sent = [
            p.send(
                Message(
                    "cli-msgs", f"body {i}", tags="t", keys=f"ck-{i % 2}", properties={"a": "b"}
                )
            )
            for i in range(4)
        ]
    index = broker_thread.index
    assert index is not None
    wait_until_sync(lambda: index.behind == 0, what="the index to catch up")
    r = CliRunner()

    def run(*args: str) -> str:
        """The command's output without the broker's log lines (the broker runs in this
        process and logs to the same stdout)."""
        res = r.invoke(main, [*args, "-b", addr], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return "".join(x for x in res.output.splitlines(True) if not LOG_LINE.match(x))

    docs = json.loads(run("message", "find", "--topic", "cli-msgs", "--key", "ck-1", "--json"))
    assert [d["body"] for d in docs] == ["body 3", "body 1"]
    d = docs[0]
    assert d["msgId"] == sent[3].msg_id and d["offsetMsgId"] == sent[3].offset_msg_id
    assert d["topic"] == "cli-msgs" and d["queueId"] == sent[3].queue_id
    assert d["queueOffset"] == sent[3].queue_offset and d["tags"] == "t" and d["keys"] == "ck-1"
    assert d["properties"]["a"] == "b" and d["storeTimestamp"] > 0

    text = run("message", "find", "-t", "cli-msgs", "-k", sent[2].msg_id, "--unique-key")
    assert f"msgId:        {sent[2].msg_id}" in text and "body 2" in text
    assert "body 0" not in text

    now_ms = int(time.time() * 1000)
    none = r.invoke(
        main, ["message", "find", "-t", "cli-msgs", "-k", "ck-1", "--end", "2001-01-01", "-b", addr]
    )
    assert none.exit_code != 0 and "no message" in none.output
    recent = run(
        "message",
        "find",
        "-t",
        "cli-msgs",
        "-k",
        "ck-0",
        "--begin",
        "0",
        "--end",
        str(now_ms + 60_000),
        "--max",
        "1",
        "--json",
    )
    shown, more = recent.split("more: --cursor ")  # stdout, then where the next page starts
    assert [x["body"] for x in json.loads(shown)] == ["body 2"]
    older = run(
        "message", "find", "-t", "cli-msgs", "-k", "ck-0", "--cursor", more.strip(), "-o", "json"
    )
    assert [x["body"] for x in json.loads(older)] == ["body 0"]

    shown = json.loads(run("message", "show", sent[1].offset_msg_id, "--json"))
    assert [x["body"] for x in shown] == ["body 1"]
    shown = json.loads(run("message", "show", sent[0].msg_id, "--json"))  # searched by id
    assert [x["msgId"] for x in shown] == [sent[0].msg_id]
    missing = r.invoke(main, ["message", "show", "00" * 8 + "7F" + "00" * 7, "-b", addr])
    assert missing.exit_code != 0 and "no message" in missing.output

"""What stock RocketMQ remoting clients rely on, checked over the wire: header spellings,
answers and broker-sent requests in the client's own encoding, TBW102 routes for topic
auto-creation, offsets of a new group, the oneway check-back of a stock producer, and streams
that are not remoting at all."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest

from tests.support.brokers import started
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.frame import FrameDecoder
from txmq.protocol.headers import CheckTransactionStateRequestHeader, SendMessageRequestHeader
from txmq.protocol.message import MessageConst, properties_to_string

JSON = SerializeType.JSON
COMMIT = 8


@pytest.fixture
async def client(broker: BrokerController) -> AsyncIterator[RawClient]:
    c = await RawClient.connect(broker.address)
    yield c
    await c.close()


def cpp_style_send_header(topic: str, **overrides: str) -> dict[str, str]:
    """A SEND_MESSAGE header as rocketmq-client-cpp writes it: every value a string, booleans
    as "0"/"1"."""
    ext = {
        "producerGroup": "cpp-group",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "1",
        "sysFlag": "0",
        "bornTimestamp": str(int(time.time() * 1000)),
        "flag": "0",
        "properties": properties_to_string({MessageConst.UNIQ_KEY: "C0FFEE", "TAGS": "TagA"}),
        "reconsumeTimes": "0",
        "unitMode": "0",
        "batch": "0",
    }
    ext.update(overrides)
    return ext


@pytest.mark.parametrize("unit_mode", ["0", "1", "false", "true", "False"])
async def test_boolean_header_values_in_every_spelling(client: RawClient, unit_mode: str) -> None:
    ext = cpp_style_send_header("spellings", unitMode=unit_mode)
    resp = await client.call(RequestCode.SEND_MESSAGE, ext, b"x", st=JSON)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    # A JSON request is answered in JSON, every header value a string.
    assert resp.serialize_type == JSON
    assert resp.ext_fields and all(isinstance(v, str) for v in resp.ext_fields.values())


async def test_a_boolean_header_value_that_is_not_one_is_named(client: RawClient) -> None:
    ext = cpp_style_send_header("spellings", unitMode="maybe")
    resp = await client.call(RequestCode.SEND_MESSAGE, ext, b"x", st=JSON)
    assert resp.code != ResponseCode.SUCCESS
    assert "unitMode" in (resp.remark or "") and "maybe" in (resp.remark or "")


async def test_tbw102_routes_a_new_topic_that_the_first_send_creates(
    broker: BrokerController, client: RawClient
) -> None:
    route = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "brand-new"}, st=JSON)
    assert route.code == ResponseCode.TOPIC_NOT_EXIST
    default = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}, st=JSON)
    assert default.code == ResponseCode.SUCCESS, default.remark
    [qd] = json.loads(default.body)["queueDatas"]
    assert qd["perm"] & 0x1 and qd["writeQueueNums"] == broker.config.default_topic_queue_nums
    # The client sends with TBW102's route; the broker creates the topic.
    resp = await client.call(RequestCode.SEND_MESSAGE, cpp_style_send_header("brand-new"), b"x")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    route = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "brand-new"}, st=JSON)
    assert route.code == ResponseCode.SUCCESS
    # TBW102 itself is a template: never listed, never a destination.
    assert "TBW102" not in broker.topics.all()
    refused = await client.call(RequestCode.SEND_MESSAGE, cpp_style_send_header("TBW102"), b"x")
    assert refused.code == ResponseCode.NO_PERMISSION


async def test_no_tbw102_route_without_auto_creation(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    async with started(make_broker_config(auto_create_topic_enable=False)) as b:
        c = await RawClient.connect(b.address)
        resp = await c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}, st=JSON)
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        await c.close()


async def test_a_new_group_is_told_offset_zero_while_the_queue_starts_at_zero(
    client: RawClient,
) -> None:
    await client.send("fresh", b"x", queue_id=0)
    q = {"consumerGroup": "new-group", "topic": "fresh", "queueId": "0"}
    resp = await client.call(RequestCode.QUERY_CONSUMER_OFFSET, q, st=JSON)
    assert (resp.code, resp.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "0")
    # An empty queue has nothing to start from: not found, as RocketMQ answers.
    empty = await client.call(RequestCode.QUERY_CONSUMER_OFFSET, {**q, "queueId": "3"}, st=JSON)
    assert empty.code == ResponseCode.QUERY_NOT_FOUND
    # A client that asks not to be given a zero (the txmq SDK) gets not found.
    no_zero = {**q, "setZeroIfNotFound": "false"}
    resp = await client.call(RequestCode.QUERY_CONSUMER_OFFSET, no_zero, st=JSON)
    assert resp.code == ResponseCode.QUERY_NOT_FOUND


async def test_notify_consumer_ids_changed_speaks_the_clients_encoding(
    broker: BrokerController, client: RawClient
) -> None:
    seen: list[RemotingCommand] = []

    async def handler(conn: object, cmd: RemotingCommand) -> None:
        seen.append(cmd)

    def heartbeat_body(c: RawClient) -> bytes:
        doc = {
            "clientID": c.client_id,
            "producerDataSet": [],
            "consumerDataSet": [
                {"groupName": "json-group", "subscriptionDataSet": [{"topic": "t"}]}
            ],
        }
        return json.dumps(doc).encode()

    async with connected(broker.address, handler) as stock:
        resp = await stock.call(RequestCode.HEART_BEAT, body=heartbeat_body(stock), st=JSON)
        assert resp.code == ResponseCode.SUCCESS
        # A second member joins: the first one is told, in JSON.
        resp = await client.call(RequestCode.HEART_BEAT, body=heartbeat_body(client))
        assert resp.code == ResponseCode.SUCCESS
        await wait_until(lambda: bool(seen), what="NOTIFY_CONSUMER_IDS_CHANGED")
        assert seen[0].code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        assert seen[0].serialize_type == JSON
        assert seen[0].ext_fields == {"consumerGroup": "json-group"}


async def test_a_stock_producer_gets_the_check_oneway_in_json_and_answers_oneway(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    b = BrokerController(
        make_broker_config(transaction_time_out=200, transaction_check_interval=100)
    )
    await b.start()
    checks: list[RemotingCommand] = []

    async def handler(conn: object, cmd: RemotingCommand) -> None:
        checks.append(cmd)
        return None  # a stock client acknowledges nothing

    try:
        producer = await RawClient.connect(b.address, handler)
        body = json.dumps(
            {
                "clientID": producer.client_id,
                "producerDataSet": [{"groupName": "stock-tx"}],
                "consumerDataSet": [],
            }
        ).encode()
        assert (await producer.call(RequestCode.HEART_BEAT, body=body, st=JSON)).code == 0
        half = await producer.send(
            "stock-orders", b"half", group="stock-tx", transactional=True, st=JSON
        )
        assert half.code == ResponseCode.SUCCESS, half.remark
        await wait_until(lambda: bool(checks), what="CHECK_TRANSACTION_STATE")
        check = checks[0]
        assert check.code == RequestCode.CHECK_TRANSACTION_STATE
        assert check.serialize_type == JSON and check.is_oneway
        h = CheckTransactionStateRequestHeader.from_ext_fields(check.ext_fields)
        assert h.transaction_id == producer.send_header(half).transaction_id
        assert await producer.pull_all("stock-orders") == []  # still invisible
        # The answer a stock producer gives: END_TRANSACTION, oneway, from the check.
        await producer.end_transaction_oneway("stock-tx", half, COMMIT, from_check=True)
        await wait_until(lambda: not b.transactions.pending, what="the half to be decided")
        [m] = await producer.pull_all("stock-orders")
        assert m.body == b"half"
        await producer.close()
    finally:
        await b.shutdown()


@pytest.mark.parametrize(
    ("preface", "named"),
    [
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/2"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40, "TLS"),
    ],
)
async def test_a_stream_that_is_not_remoting_is_closed_and_named(
    broker: BrokerController, client: RawClient, preface: bytes, named: str
) -> None:
    errors_before = broker.metrics.protocol_errors._value.get()
    reader, writer = await asyncio.open_connection(*broker.address.rsplit(":", 1))
    writer.write(preface)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)  # the broker closes the connection
    writer.close()
    dec = FrameDecoder()
    dec.feed(data)
    answer = dec.next_command()
    assert answer is not None and named in (answer.remark or "")
    assert broker.metrics.protocol_errors._value.get() == errors_before + 1
    # Everyone else is still served.
    resp = await client.send("still-served", b"x")
    assert resp.code == ResponseCode.SUCCESS


async def test_send_header_unit_mode_from_the_typed_header_round_trips() -> None:
    h = SendMessageRequestHeader.from_ext_fields(cpp_style_send_header("t", unitMode="1"))
    assert h.unit_mode is True

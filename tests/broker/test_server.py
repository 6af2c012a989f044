"""The broker over real TCP: plain messages, errors, long polling, offsets, admin."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest

from tests.support.brokers import started
from tests.support.ports import free_port
from tests.support.raw import RawClient
from tests.support.waiting import parked_pulls, wait_until
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.frame import encode_frame
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import MessageConst, MessageExt, encode_batch


@pytest.fixture
async def client(broker: BrokerController):
    c = await RawClient.connect(broker.address)
    yield c
    await c.close()


@pytest.mark.parametrize("st", list(SerializeType))
async def test_send_and_pull_round_trip_in_every_encoding(client: RawClient, st: SerializeType):
    resp = await client.send(
        "orders",
        b"hello",
        props={"TAGS": "created", "KEYS": "order-1", "region": "eu"},
        queue_id=2,
        st=st,
    )
    assert resp.serialize_type == st
    h = client.send_header(resp)
    assert h.queue_id == 2 and h.queue_offset == 0 and len(h.msg_id) == 32
    pr, msgs = await client.pull("orders", 2, 0)
    assert pr.code == ResponseCode.SUCCESS
    [m] = msgs
    assert (m.topic, m.body, m.tags, m.keys) == ("orders", b"hello", "created", "order-1")
    assert m.user_properties == {"region": "eu"}
    assert m.offset_msg_id == h.msg_id
    assert int(pr.ext_fields["nextBeginOffset"]) == 1


async def test_send_v1_header_and_store_timestamp(client: RawClient):
    resp = await client.send("v1topic", b"x", v2=False)
    assert resp.code == ResponseCode.SUCCESS
    _, [m] = await client.pull("v1topic", 0, 0)
    assert m.store_timestamp > 0 and m.born_timestamp > 0


async def test_batch_send(client: RawClient):
    body = encode_batch(
        [(f"m{i}".encode(), 0, {"UNIQ_KEY": f"K{i}", "TAGS": "b"}) for i in range(5)]
    )
    h = SendMessageRequestHeader(producer_group="g", topic="batchy", queue_id=1, batch=True)
    resp = await client.call(RequestCode.SEND_BATCH_MESSAGE, h.to_v2_ext_fields(), body)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert len(resp.ext_fields["msgId"].split(",")) == 5
    _, msgs = await client.pull("batchy", 1, 0)
    assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(5)]
    assert [m.queue_offset for m in msgs] == list(range(5))


async def test_tag_filtering(client: RawClient):
    for tag in ["a", "b", "c", "a"]:
        await client.send("tagged", tag.encode(), props={"TAGS": tag})
    _, msgs = await client.pull("tagged", 0, 0, expression="a || c")
    assert [m.body for m in msgs] == [b"a", b"c", b"a"]
    resp, msgs = await client.pull("tagged", 0, 1, expression="zzz")
    assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY and not msgs
    assert int(resp.ext_fields["nextBeginOffset"]) == 4


async def test_unknown_code_gets_request_code_not_supported(client: RawClient):
    resp = await client.call(9999)
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert resp.remark is not None and "9999" in resp.remark


async def test_oversized_body_is_refused_and_nothing_is_stored(make_broker_config) -> None:
    async with started(make_broker_config(max_message_size=1024)) as ctl:
        c = await RawClient.connect(ctl.address)
        resp = await c.send("big", b"x" * 2000)
        assert (
            resp.code == ResponseCode.MESSAGE_ILLEGAL
            and resp.remark is not None
            and "1024" in resp.remark
        )
        ok = await c.send("big", b"small")
        assert ok.code == ResponseCode.SUCCESS
        assert [m.body for m in await c.pull_all("big")] == [b"small"]
        await c.close()


async def test_missing_header_field_names_the_field(client: RawClient):
    resp = await client.call(RequestCode.SEND_MESSAGE, {"producerGroup": "g"}, b"x")
    assert resp.code == ResponseCode.INVALID_PARAMETER
    assert resp.remark is not None and "topic" in resp.remark


async def test_malformed_frame_gets_an_error_and_the_connection_goes_on(broker, client):
    reader, writer = await asyncio.open_connection(*broker.address.split(":"))
    garbage_header = b"\x93\xff\x00"  # not a msgpack map
    frame = struct.pack(">II", 4 + len(garbage_header), (2 << 24) | len(garbage_header))
    writer.write(frame + garbage_header)
    ping = RemotingCommand.request(9999)
    ping.opaque = 77
    writer.write(encode_frame(ping))
    await writer.drain()
    from txmq.protocol.frame import FrameDecoder

    dec = FrameDecoder()
    answers: list[RemotingCommand] = []
    while len(answers) < 2:
        dec.feed(await asyncio.wait_for(reader.read(65536), 5))
        while (cmd := dec.next_command()) is not None:
            answers.append(cmd)
    assert (
        answers[0].code == ResponseCode.SYSTEM_ERROR
        and answers[0].remark is not None
        and "malformed" in answers[0].remark
    )
    assert answers[1].opaque == 77 and answers[1].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    writer.close()
    # everyone else is still served
    assert (await client.send("after", b"x")).code == ResponseCode.SUCCESS


async def test_oversized_frame_closes_only_that_connection(broker, client):
    reader, writer = await asyncio.open_connection(*broker.address.split(":"))
    writer.write(struct.pack(">I", broker.config.max_frame_size + 1))
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)  # error frame, then EOF
    assert b"exceeds the limit" in data
    writer.close()
    assert (await client.send("after", b"x")).code == ResponseCode.SUCCESS


async def test_long_poll_does_not_delay_a_send_on_the_same_connection(
    broker: BrokerController, client: RawClient
):
    await client.send("lp", b"first")
    poll = asyncio.ensure_future(client.pull("lp", 0, 1, suspend_ms=30_000))
    await wait_until(lambda: parked_pulls(broker, "lp", 0) == 1, 10, "the pull to be parked")
    assert not poll.done()
    t0 = asyncio.get_running_loop().time()
    resp = await client.send("lp", b"second")  # same connection as the parked pull
    assert resp.code == ResponseCode.SUCCESS
    # not held behind the 30 s poll (the bound leaves room for a loaded machine)
    assert asyncio.get_running_loop().time() - t0 < 10.0
    presp, msgs = await asyncio.wait_for(poll, 10)
    assert presp.code == ResponseCode.SUCCESS and [m.body for m in msgs] == [b"second"]


async def test_long_poll_times_out_with_pull_not_found(client: RawClient):
    await client.send("lp2", b"x")
    resp, _ = await client.pull("lp2", 0, 1, suspend_ms=200)
    assert resp.code == ResponseCode.PULL_NOT_FOUND


async def test_auto_create_can_be_switched_off(make_broker_config):
    async with started(make_broker_config(auto_create_topic_enable=False)) as ctl:
        c = await RawClient.connect(ctl.address)
        resp = await c.send("nope", b"x")
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        route = await c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "nope"})
        assert route.code == ResponseCode.TOPIC_NOT_EXIST
        created = await c.call(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "nope", "readQueueNums": 2, "writeQueueNums": 2},
        )
        assert created.code == ResponseCode.SUCCESS
        assert (await c.send("nope", b"x")).code == ResponseCode.SUCCESS
        await c.close()


async def test_route_info_and_auto_created_queue_count(broker, client: RawClient):
    await client.send("routed", b"x")
    resp = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "routed"})
    route = json.loads(resp.body)
    assert route["queueDatas"][0]["writeQueueNums"] == 4
    assert route["brokerDatas"][0]["brokerAddrs"]["0"] == broker.advertised_address


async def test_sending_to_a_system_topic_is_refused(client: RawClient):
    resp = await client.send("RMQ_SYS_TRANS_HALF_TOPIC", b"x")
    assert resp.code == ResponseCode.NO_PERMISSION


async def test_invalid_topic_name(client: RawClient):
    resp = await client.send("bad topic!", b"x")
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL


async def test_consumer_offsets(client: RawClient):
    await client.send("off", b"x")
    q = {"consumerGroup": "g1", "topic": "off", "queueId": 0, "setZeroIfNotFound": False}
    assert (
        await client.call(RequestCode.QUERY_CONSUMER_OFFSET, q)
    ).code == ResponseCode.QUERY_NOT_FOUND
    resp = await client.call(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 1})
    assert resp.code == ResponseCode.SUCCESS
    resp = await client.call(RequestCode.QUERY_CONSUMER_OFFSET, q)
    assert int(resp.ext_fields["offset"]) == 1
    mx = await client.call(RequestCode.GET_MAX_OFFSET, {"topic": "off", "queueId": 0})
    mn = await client.call(RequestCode.GET_MIN_OFFSET, {"topic": "off", "queueId": 0})
    assert (int(mx.ext_fields["offset"]), int(mn.ext_fields["offset"])) == (1, 0)


async def test_heartbeat_and_consumer_list_and_notification(broker, client: RawClient):
    notified = asyncio.Event()

    async def handler(conn, cmd):
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            notified.set()
        return None

    await client.heartbeat(consumer_groups={"cg": {"t": "*"}})
    other = await RawClient.connect(broker.address, handler)
    await other.heartbeat(consumer_groups={"cg": {"t": "*"}})
    resp = await client.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"})
    assert sorted(json.loads(resp.body)["consumerIdList"]) == sorted(
        [client.client_id, other.client_id]
    )
    await client.close()  # a member leaves: the other one is told
    await asyncio.wait_for(notified.wait(), 5)
    resp = await other.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"})
    assert json.loads(resp.body)["consumerIdList"] == [other.client_id]
    await other.close()


async def test_delayed_message_is_delivered_after_its_level(client: RawClient):
    await client.send("later", b"x", props={MessageConst.DELAY: "2"})  # 200 ms in tests
    _, msgs = await client.pull("later", 0, 0)
    assert msgs == []

    async def delivered() -> list[MessageExt]:
        return (await client.pull("later", 0, 0))[1]

    msgs = await wait_until(delivered, what="the delayed message to be delivered")
    assert [m.body for m in msgs] == [b"x"]


async def test_send_back_goes_to_retry_then_dlq(client: RawClient, broker: BrokerController):
    await client.send("work", b"job")
    bytes_out = broker.metrics.bytes_out._value.get()
    _, [m] = await client.pull("work", 0, 0)
    assert broker.metrics.bytes_out._value.get() > bytes_out, "txmq_bytes_out_total"
    for attempt in range(3):
        resp = await client.call(
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {
                "offset": m.commit_log_offset,
                "group": "wg",
                "delayLevel": 1,
                "originMsgId": m.msg_id,
                "originTopic": "work",
                "maxReconsumeTimes": 2,
            },
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        if attempt == 2:
            break

        async def retried(offset: int = attempt) -> list[MessageExt]:
            return (await client.pull("%RETRY%wg", 0, offset))[1]

        [m] = await wait_until(retried, what=f"retry #{attempt + 1} in the retry topic")
        assert m.reconsume_times == attempt + 1
        assert m.properties[MessageConst.RETRY_TOPIC] == "work"
    _, dead = await client.pull("%DLQ%wg", 0, 0)
    assert [d.body for d in dead] == [b"job"] and dead[0].reconsume_times == 3
    assert broker.metrics.dead_lettered.labels("wg")._value.get() == 1


async def test_graceful_shutdown_answers_parked_pulls(make_broker_config):
    ctl = BrokerController(make_broker_config())
    await ctl.start()
    c = await RawClient.connect(ctl.address)
    await c.send("gs", b"x")
    poll = asyncio.ensure_future(c.pull("gs", 0, 1, suspend_ms=30_000))
    await wait_until(lambda: parked_pulls(ctl, "gs", 0) == 1, 10, "the pull to be parked")
    await asyncio.wait_for(ctl.shutdown(), 10)
    resp, _ = await poll
    assert resp.code == ResponseCode.PULL_NOT_FOUND
    await c.close()


async def test_retention_moves_a_consumer_to_the_new_minimum(make_broker_config):
    import os
    import time as _time

    async with started(
        make_broker_config(mapped_file_size_commit_log=64 * 1024, max_message_size=4096)
    ) as ctl:
        c = await RawClient.connect(ctl.address)
        for _ in range(200):
            assert (await c.send("old", b"x" * 1000, queue_id=0)).code == ResponseCode.SUCCESS
        seg_dir = os.path.join(ctl.config.store_path_root_dir, "commitlog")
        segs = sorted(os.listdir(seg_dir))
        assert len(segs) > 2
        old = _time.time() - 73 * 3600
        for s in segs[:-1]:
            os.utime(os.path.join(seg_dir, s), (old, old))
        assert ctl.store.delete_expired_files() == len(segs) - 1
        resp, _ = await c.pull("old", 0, 0)
        assert resp.code == ResponseCode.PULL_OFFSET_MOVED
        new_min = int(resp.ext_fields["nextBeginOffset"])
        assert 0 < new_min < 200
        resp, msgs = await c.pull("old", 0, new_min)
        assert resp.code == ResponseCode.SUCCESS and msgs[0].queue_offset == new_min
        await c.close()


async def test_metrics_over_http_and_as_json(make_broker_config):
    import urllib.request

    port = free_port()
    async with started(make_broker_config(metrics_port=port)) as ctl:
        c = await RawClient.connect(ctl.address)
        await c.send("metered", b"x")
        doc = json.loads((await c.call(RequestCode.TXMQ_GET_METRICS)).body)
        assert doc["txmq_messages_put_total{topic=metered}"] == 1.0
        await c.close()
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(
            None,
            lambda: (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                .read()
                .decode()
            ),
        )
        # with the broker's identity, as every sample (labels in name order)
        cfg = ctl.config
        assert (
            f'txmq_messages_put_total{{broker="{cfg.broker_name}",'
            f'cluster="{cfg.broker_cluster_name}",topic="metered"}} 1.0'
        ) in text

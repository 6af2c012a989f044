"""The operator's commands that change things: delete and update a topic, reset a live group's
offsets, list and resend dead letters; at the wire in RocketMQ's encodings (what mqadmin's
deleteTopic / resetOffsetByTime send and decode) and through the SDK and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from tests.support.brokers import started
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_all_consumed, wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.cli import main
from txmq.client import AsyncOrderlyPushConsumer, AsyncProducer, AsyncPushConsumer, Message
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.aio import Connection
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import NoPermissionError
from txmq.protocol.fastjson import ObjectKeyMap, loads
from txmq.protocol.message import MessageConst, decode_offset_msg_id

pytestmark = pytest.mark.external

#: How long one command may take (a loaded machine, a cold interpreter).
CLI_TIMEOUT = 60.0


async def cli(*args: str, input: str | None = None, ok: bool = True) -> str:
    """``txmq ARGS`` in a process of its own (the broker runs in this one, and its log lines
    must not mix with what the command prints); its output, and its errors when it fails."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "txmq", *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(
            proc.communicate((input or "").encode()), timeout=CLI_TIMEOUT
        )
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"txmq {' '.join(args)} did not end in {CLI_TIMEOUT} s") from None
    if ok:
        assert proc.returncode == 0, (args, out.decode(), err.decode())
        return out.decode()
    assert proc.returncode != 0, (args, out.decode())
    return out.decode() + err.decode()


async def test_delete_topic_at_the_wire(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        await c.create_topic("doomed", 2)
        await c.create_topic("kept", 1)
        for i in range(4):
            RawClient.send_header(await c.send("doomed", b"d%d" % i, queue_id=i % 2))
        RawClient.send_header(await c.send("kept", b"k"))
        for topic in ("doomed", "kept"):
            resp = await c.call(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "g1", "topic": topic, "queueId": 0, "commitOffset": 1},
            )
            assert resp.code == ResponseCode.SUCCESS
        cq_dir = os.path.join(broker.ctx.config.store_path_root_dir, "consumequeue", "doomed")
        await wait_until(lambda: os.path.isdir(os.path.join(cq_dir, "1")), 10, "queue 1's files")

        # the broker's own topics are refused
        resp = await c.call(
            RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "RMQ_SYS_TRANS_HALF_TOPIC"}
        )
        assert resp.code == ResponseCode.INVALID_PARAMETER and "system topic" in (resp.remark or "")
        assert broker.ctx.topics.get("RMQ_SYS_TRANS_HALF_TOPIC") is not None

        # refused while a live consumer subscribes to it, naming its group
        await c.heartbeat(consumer_groups={"live-group": {"doomed": "*"}})
        resp = await c.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "doomed"})
        assert resp.code == ResponseCode.SYSTEM_ERROR, resp
        assert "live consumers" in (resp.remark or "") and "live-group" in (resp.remark or "")
        resp = await c.call(
            RequestCode.UNREGISTER_CLIENT, {"clientID": c.client_id, "consumerGroup": "live-group"}
        )
        assert resp.code == ResponseCode.SUCCESS

        # mqadmin deleteTopic's request: a DeleteTopicRequestHeader (topic), JSON-serialized
        resp = await c.call(
            RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "doomed"}, st=SerializeType.JSON
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert broker.ctx.topics.get("doomed") is None
        assert not os.path.exists(cq_dir)
        assert broker.ctx.store.queue_ids("doomed") == []
        assert broker.ctx.offsets.offsets("g1", "doomed") == {}
        assert broker.ctx.offsets.offsets("g1", "kept") == {0: 1}  # other topics untouched
        resp, msgs = await c.pull("kept")
        assert [m.body for m in msgs] == [b"k"]

        resp = await c.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "doomed"})
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        # a topic of the same name starts afresh
        await c.create_topic("doomed", 2)
        RawClient.send_header(await c.send("doomed", b"new"))
        resp, msgs = await c.pull("doomed")
        assert [(m.body, m.queue_offset) for m in msgs] == [(b"new", 0)]


async def test_reset_offset_at_the_wire(broker: BrokerController) -> None:
    told: list[RemotingCommand] = []

    async def client_side(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            told.append(cmd)
        return None

    async with connected(broker.address, client_side) as c:
        await c.create_topic("ledger", 2)
        for i in range(6):
            RawClient.send_header(await c.send("ledger", b"l%d" % i, queue_id=i % 2))
        commit = {"consumerGroup": "g2", "topic": "ledger", "commitOffset": 3}
        for q in (0, 1):
            resp = await c.call(RequestCode.UPDATE_CONSUMER_OFFSET, {**commit, "queueId": q})
            assert resp.code == ResponseCode.SUCCESS

        # mqadmin resetOffsetByTime -t ledger -g g2 -s 0 (force): every queue to its start
        await c.heartbeat(consumer_groups={"g2": {"ledger": "*"}})
        header = {"topic": "ledger", "group": "g2", "timestamp": 0, "isForce": "true"}
        resp = await c.call(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header, st=SerializeType.JSON
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        # ResetOffsetBody as fastjson writes it: MessageQueue objects as the map's keys
        assert resp.body.startswith(b'{"offsetTable":{{"brokerName":'), resp.body[:60]
        table = loads(resp.body)["offsetTable"]
        assert isinstance(table, ObjectKeyMap)
        name = broker.ctx.config.broker_name
        assert sorted((mq["topic"], mq["brokerName"], mq["queueId"], o) for mq, o in table) == [
            ("ledger", name, 0, 0),
            ("ledger", name, 1, 0),
        ]
        assert broker.ctx.offsets.offsets("g2", "ledger") == {0: 0, 1: 0}
        # the live consumer was told: RESET_CONSUMER_CLIENT_OFFSET, same header and body
        await wait_until(lambda: len(told) == 1, 10, "the consumer is told of the reset")
        (note,) = told
        assert note.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET
        assert note.ext_fields["group"] == "g2" and note.ext_fields["topic"] == "ledger"
        assert sorted(o for _, o in loads(note.body)["offsetTable"]) == [0, 0]

        # without isForce a queue only moves back: a time ahead keeps the committed offsets
        ahead = int(time.time() * 1000) + 3_600_000
        resp = await c.call(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": "ledger", "group": "g2", "timestamp": ahead, "isForce": "false"},
        )
        assert resp.code == ResponseCode.SUCCESS
        assert broker.ctx.offsets.offsets("g2", "ledger") == {0: 0, 1: 0}
        # RocketMQ 5's queueId and offset: one queue, an exact offset (clamped to its end)
        resp = await c.call(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": "ledger", "group": "g2", "timestamp": 0, "isForce": "true"}
            | {"queueId": 1, "offset": 99},
        )
        assert resp.code == ResponseCode.SUCCESS
        assert [(mq["queueId"], o) for mq, o in loads(resp.body)["offsetTable"]] == [(1, 3)]
        assert broker.ctx.offsets.offsets("g2", "ledger") == {0: 0, 1: 3}

        resp = await c.call(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": "no-such", "group": "g2", "timestamp": 0, "isForce": "true"},
        )
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        resp = await c.call(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": "ledger", "group": "g2", "timestamp": 0, "isForce": "true", "queueId": 2},
        )
        assert resp.code == ResponseCode.INVALID_PARAMETER and "queueId 2" in (resp.remark or "")
        assert broker.ctx.offsets.offsets("g2", "ledger") == {0: 0, 1: 3}
        resp = await c.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "ledger"})
        assert resp.code != ResponseCode.SUCCESS and "group" in (resp.remark or "")


async def test_reset_offset_of_a_live_sdk_consumer(broker: BrokerController) -> None:
    addr = broker.address
    await cli("topic", "create", "replay", "-q", "2", "-b", addr)
    got: list[bytes] = []
    producer = AsyncProducer("replay-producer", addr)
    consumer = AsyncPushConsumer("replayers", addr, consume_from="first")
    consumer.subscribe("replay", "*", lambda m: got.append(m.body))
    await producer.start()
    try:
        for i in range(4):
            await producer.send(Message("replay", b"early-%d" % i))
        cut = int(time.time() * 1000)
        await wait_until(lambda: time.time() * 1000 > cut + 2, 5, "the clock passes the cut")
        for i in range(4):
            await producer.send(Message("replay", b"late-%d" % i))
        await consumer.start()
        await wait_all_consumed(
            addr, got, 8, "replayers", "replay", "the group's committed offsets reach the end"
        )

        # back to a time before the late messages: the live consumer receives them again
        out = await cli(
            "group", "reset-offset", "replayers", "-t", "replay", "--to-time", str(cut + 1),
            "-o", "json", "-b", addr,
        )  # fmt: skip
        rows = json.loads(out)
        assert sorted(r["queueId"] for r in rows) == [0, 1]
        assert sum(r["offset"] for r in rows) == 4  # the early ones stay consumed
        await wait_until(lambda: len(got) == 12, 30, "the late messages are delivered again")
        assert sorted(got[8:]) == sorted(b"late-%d" % i for i in range(4))

        # to the latest: nothing more, though the consumer had been sent back
        await cli("group", "reset-offset", "replayers", "-t", "replay", "--to-earliest", "-b", addr)
        await wait_until(lambda: len(got) == 20, 30, "everything is delivered once more")
        await cli("group", "reset-offset", "replayers", "-t", "replay", "--to-latest", "-b", addr)
        await producer.send(Message("replay", b"marker"))
        await wait_until(lambda: b"marker" in got, 30, "a message sent after it arrives")
        assert len(got) == 21, got[20:]
        # the committed offsets are the queue ends (the old ones were not committed back)
        async with AsyncAdminClient(addr) as admin:

            async def at_end() -> bool:
                stats = await admin.consume_stats("replayers", "replay")
                lag = sum(int(s["lag"]) for s in stats)
                return lag == 0 and sum(int(s["consumerOffset"]) for s in stats) == 9

            await wait_until(at_end, 30, "the group's offsets are the queue ends")
    finally:
        await consumer.shutdown()
        await producer.shutdown()


async def test_reset_offset_without_live_consumers_commits(broker: BrokerController) -> None:
    addr = broker.address
    async with AsyncProducer("p", addr) as producer:
        for i in range(3):
            await producer.send(Message("quiet", b"q%d" % i), queue_id=0)
    async with AsyncAdminClient(addr) as admin:
        assert await admin.reset_offset("nobody-online", "quiet", offset=2) == {
            0: 2,
            1: 0,
            2: 0,
            3: 0,
        }
    assert broker.ctx.offsets.query("nobody-online", "quiet", 0) == 2
    bad = await cli("group", "reset-offset", "g", "-t", "quiet", "-b", addr, ok=False)
    assert "exactly one of" in bad


async def test_topic_update_and_delete_through_the_cli(broker: BrokerController) -> None:
    addr = broker.address
    await cli("topic", "create", "tidy", "-q", "4", "-b", addr)
    doc = json.loads(
        await cli("topic", "update", "tidy", "--perm", "r", "--write-queues", "2", "-o", "json",
                  "-b", addr)
    )  # fmt: skip
    assert (doc["perm"], doc["readQueueNums"], doc["writeQueueNums"]) == (4, 4, 2)
    tc = broker.ctx.topics.get("tidy")
    assert tc is not None and (tc.perm, tc.read_queue_nums, tc.write_queue_nums) == (4, 4, 2)
    # read-only now: a send is refused
    async with AsyncProducer("p", addr, retry_times_when_send_failed=0) as producer:
        with pytest.raises(NoPermissionError, match="not writable"):
            await producer.send(Message("tidy", b"x"))
    await cli("topic", "update", "tidy", "--perm", "rw", "-b", addr)
    assert (broker.ctx.topics.get("tidy") or tc).perm == 6
    assert "no-such" in await cli("topic", "update", "no-such", "--perm", "r", "-b", addr, ok=False)

    listed = json.loads(await cli("topic", "list", "-o", "json", "-b", addr))
    assert listed["tidy"]["perm"] == 6
    assert json.loads(await cli("topic", "list", "--json", "-b", addr)) == listed  # the alias

    # delete asks first; "no" keeps the topic
    out = await cli("topic", "delete", "tidy", "-b", addr, input="n\n", ok=False)
    assert "Aborted" in out and broker.ctx.topics.get("tidy") is not None
    assert "deleted" in await cli("topic", "delete", "tidy", "-b", addr, input="y\n")
    assert broker.ctx.topics.get("tidy") is None
    assert "tidy" not in json.loads(await cli("topic", "list", "-o", "json", "-b", addr))
    out = await cli("topic", "delete", "RMQ_SYS_TRANS_HALF_TOPIC", "--yes", "-b", addr, ok=False)
    assert "system topic" in out


async def _dead_letter(c: RawClient, topic: str, body: bytes, group: str, **props: str) -> str:
    """Send a message and have ``group`` give up on it (CONSUMER_SEND_MSG_BACK, delay level -1:
    straight to the dead-letter queue); its message id."""
    uniq = uuid.uuid4().hex.upper()
    sent = RawClient.send_header(
        await c.send(topic, body, props={MessageConst.UNIQ_KEY: uniq, **props})
    )
    _host, offset = decode_offset_msg_id(sent.msg_id)  # the answer's msgId: the offsetMsgId
    resp = await c.call(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {"group": group, "offset": offset, "delayLevel": -1, "originTopic": topic},
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return uniq


async def test_dlq_list_and_resend(broker: BrokerController) -> None:
    addr = broker.address
    async with connected(broker.address) as c:
        await c.create_topic("payments", 1)
        first = await _dead_letter(
            c, "payments", b"pay-1", "settlers",
            **{MessageConst.TAGS: "card", MessageConst.KEYS: "order-1", "tenant": "acme"},
        )  # fmt: skip
        second = await _dead_letter(c, "payments", b"pay-2", "settlers")
        listed = json.loads(await cli("dlq", "list", "settlers", "-o", "json", "-b", addr))
        assert [(d["msgId"], d["originalTopic"], d["body"]) for d in listed] == [
            (first, "payments", "pay-1"),
            (second, "payments", "pay-2"),
        ]
        assert listed[0]["reconsumeTimes"] >= 1 and listed[0]["storeTimestamp"] > 0
        assert "pay-2" in await cli("dlq", "list", "settlers", "-b", addr)
        assert json.loads(await cli("dlq", "list", "no-dlq", "-o", "json", "-b", addr)) == []

        # resend one: a new message in the original topic, the same body, tags, keys, props
        out = await cli(
            "dlq", "resend", "settlers", "--id", first, "--yes", "-o", "json", "-b", addr
        )
        (row,) = json.loads(out)
        assert (row["dlqMsgId"], row["topic"], row["status"]) == (first, "payments", "SEND_OK")
        assert row["msgId"] != first
        msgs = await c.pull_all("payments", queues=1)
        resent = [m for m in msgs if m.msg_id == row["msgId"]]
        assert len(resent) == 1 and len(msgs) == 3
        (m,) = resent
        assert (m.body, m.tags, m.keys, m.properties.get("tenant")) == (
            b"pay-1", "card", "order-1", "acme",
        )  # fmt: skip
        assert MessageConst.RETRY_TOPIC not in m.properties

        # the same command again (a retried script): the duplicate window answers it, no copy
        again = json.loads(
            await cli("dlq", "resend", "settlers", "--id", first, "--yes", "-o", "json", "-b", addr)
        )
        assert again[0]["msgId"] == row["msgId"]
        assert len(await c.pull_all("payments", queues=1)) == 3

        # --all asks first; the unknown id is refused, naming it
        out = await cli("dlq", "resend", "settlers", "--all", "-b", addr, input="n\n", ok=False)
        assert "Aborted" in out
        assert len(await c.pull_all("payments", queues=1)) == 3
        out = await cli("dlq", "resend", "settlers", "--id", "NOPE", "--yes", "-b", addr, ok=False)
        assert "NOPE" in out
        out = await cli("dlq", "resend", "settlers", "--all", "--yes", "-b", addr)
        assert "payments" in out
        bodies = sorted(m.body for m in await c.pull_all("payments", queues=1))
        assert bodies == [b"pay-1", b"pay-1", b"pay-2", b"pay-2"]


def test_output_option_and_shell_completion() -> None:
    runner = CliRunner()
    # every command that prints data takes -o table|json (and the old --json where it had it)
    for path in (
        ["status"], ["cluster", "status"], ["topic", "list"], ["topic", "stats"],
        ["topic", "update"], ["group", "list"], ["group", "show"], ["group", "reset-offset"],
        ["connections"], ["config", "get"], ["txn", "list"], ["txn", "show"],
        ["message", "show"], ["message", "find"], ["dlq", "list"], ["dlq", "resend"],
        ["send"], ["consume"],
    ):  # fmt: skip
        res = runner.invoke(main, [*path, "--help"])
        assert res.exit_code == 0 and "--output [table|json]" in res.output, (path, res.output)
    res = runner.invoke(main, ["status", "--help"])
    assert "--json" not in res.output  # the alias is hidden

    # bash completion: the script click makes, and completing a command name
    res = runner.invoke(main, [], prog_name="txmq", env={"_TXMQ_COMPLETE": "bash_source"})
    assert res.exit_code == 0 and "_txmq_completion" in res.output
    assert "complete -o nosort -F _txmq_completion txmq" in res.output
    env: dict[str, Any] = {
        "_TXMQ_COMPLETE": "bash_complete",
        "COMP_WORDS": "txmq dl",
        "COMP_CWORD": "1",
    }
    res = runner.invoke(main, [], prog_name="txmq", env=env)
    assert res.exit_code == 0 and "plain,dlq" in res.output.splitlines()


async def test_a_deleted_topic_stays_deleted_after_a_restart(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    config = make_broker_config()
    async with started(config, stop_within=30) as first:
        async with AsyncProducer("p", first.address) as producer:
            for i in range(6):
                await producer.send(Message("gone", b"g%d" % i))
            await producer.send(Message("stays", b"s"))
        first.ctx.offsets.commit("g", "gone", 0, 1)
        async with AsyncAdminClient(first.address) as admin:
            await admin.delete_topic("gone")
        end = first.store.max_phy_offset
    async with started(config, stop_within=30) as second:
        assert second.ctx.topics.get("gone") is None
        assert second.store.queue_ids("gone") == []
        assert second.ctx.offsets.offsets("g", "gone") == {}
        assert second.store.max_phy_offset == end  # the messages stay until retention
        assert second.store.queue_ids("stays") != []
        async with connected(second.address) as c:
            assert len(await c.pull_all("stays")) == 1


async def test_reset_offset_of_a_live_orderly_consumer(broker: BrokerController) -> None:
    addr = broker.address
    got: list[tuple[int, bytes]] = []
    consumer = AsyncOrderlyPushConsumer(
        "in-order", addr, consume_from="first", lock_interval=0.5, suspend_interval=0.05
    )
    consumer.subscribe("sequence", "*", lambda m: got.append((m.queue_id, m.body)))
    async with AsyncProducer("p", addr) as producer:
        for i in range(6):
            await producer.send(Message("sequence", b"%d" % i), queue_id=i % 2)
        await consumer.start()
        try:
            await wait_until(lambda: len(got) == 6, 30, "the consumer gets all 6 messages")
            async with AsyncAdminClient(addr) as admin:
                assert await admin.reset_offset("in-order", "sequence", timestamp=0) == {
                    q: 0 for q in range(4)
                }
            await wait_until(lambda: len(got) == 12, 30, "every message is delivered again")
            again = got[6:]
            for q in (0, 1):  # in order within each queue, the second time too
                assert [b for qid, b in again if qid == q] == [b"%d" % i for i in range(q, 6, 2)]
        finally:
            await consumer.shutdown()


async def test_send_and_consume_print_either_form(broker: BrokerController) -> None:
    addr = broker.address
    sent = json.loads(await cli("send", "forms", "hello", "-t", "greet", "-o", "json", "-b", addr))
    assert sent["status"] == "SEND_OK" and sent["queueOffset"] == 0
    assert "msgId=" in await cli("send", "forms", "again", "-b", addr)
    line = await cli("consume", "forms", "-n", "1", "--timeout", "20", "-b", addr)
    doc = json.loads(line)  # the default: one JSON line per message
    assert doc["topic"] == "forms" and doc["body"] in ("hello", "again")
    table = await cli("consume", "forms", "-n", "2", "--timeout", "20", "-o", "table", "-b", addr)
    assert sent["msgId"] in table and "tags=greet hello" in table


async def test_topic_route_and_cluster_list_through_the_cli(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        await c.create_topic("routed", 3)
    route = json.loads(await cli("topic", "route", "routed", "-b", broker.address, "-o", "json"))
    assert route == [
        {
            "group": broker.config.broker_name,
            "readQueues": 3,
            "writeQueues": 3,
            "perm": 6,
            "leader": broker.advertised_address,
        }
    ]
    missing = await cli("topic", "route", "nowhere", "-b", broker.address, ok=False)
    assert "no topic 'nowhere'" in missing
    single = await cli("cluster", "list", "-b", broker.address, ok=False)
    assert "runs as a single node" in single

"""Message trace on a real broker: a stock client's trace record is stored and read back, the
broker's own record of a transaction's life is what ``txmq trace`` prints (a commit decided by
check-back, a rollback by an operator), nothing is written with tracing off, and records of
acknowledged requests survive a SIGKILL."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import BrokerThread
from tests.support.brokers import started
from tests.support.grpc_probes import change_invisible_request
from tests.support.listeners import CheckBack
from tests.support.process import running
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until, wait_until_sync
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.cli import main as cli
from txmq.cli.trace import collect
from txmq.client import (
    AsyncProducer,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
)
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.message import MessageConst
from txmq.protocol.trace import TRACE_TOPIC, TraceRecord, TraceType, decode

S, F = "\x01", "\x02"


def stock_pub(msg_id: str, keys: str) -> str:
    """A Pub record as RocketMQ's Java client (and the C++ client) writes it."""
    fields = ["Pub", "1700000000123", "DefaultRegion", "PID_shop", "orders", msg_id, "TagA"]
    fields += [keys, "127.0.0.1:10911", "11", "4", "0", "7F00000100002A9F0000000000000C5E"]
    return S.join([*fields, "true"]) + F


async def test_a_stock_clients_trace_record_is_stored_and_read_back(
    broker: BrokerController,
) -> None:
    """Tracing off on the broker: a client's trace message is still accepted (the topic is
    auto-created) and found by its message id."""
    async with connected(broker.address) as c:
        body = stock_pub("C0A8000100002A9F0000000000AA", "order-7") + (
            S.join(["SubBefore", "1700000000200", "DefaultRegion", "CID_x", "r1"])
            + S
            + S.join(["C0A8000100002A9F0000000000AA", "0", "order-7"])
            + F
        )
        resp = await c.send(
            TRACE_TOPIC,
            body.encode(),
            group="_INNER_TRACE_PRODUCER-DEFAULT",
            props={MessageConst.KEYS: "C0A8000100002A9F0000000000AA order-7"},
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    async with AsyncAdminClient(broker.address) as admin:
        records = await wait_until(
            lambda: collect(admin, "C0A8000100002A9F0000000000AA"), 30, "the trace indexed"
        )
        by_key = await collect(admin, "order-7")
    assert [r.type for r in records] == [TraceType.PUB, TraceType.SUB_BEFORE]
    assert (records[0].group, records[0].topic, records[0].keys) == (
        "PID_shop",
        "orders",
        "order-7",
    )
    assert records[1].request_id == "r1"
    assert by_key == records
    # the broker did not trace the client's trace message, nor anything else
    assert broker.core.trace is None


def _cli(address: str, *args: str) -> Any:
    res = CliRunner().invoke(cli, ["trace", "-b", address, *args])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.external
def test_txmq_trace_shows_a_transactions_life(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    bt = broker_thread_factory(trace_topic_enable=True)
    addr = bt.address
    listener = CheckBack()

    async def scenario() -> tuple[str, str, str]:
        async with connected(addr) as c:
            # The producer stays online until the commit its check answer sends is in: closed
            # as soon as the check came, a loaded machine may close it first.
            async with AsyncTransactionProducer("shop", listener, addr) as tx:
                checked = await tx.send_message_in_transaction(Message("orders", b"by-check"))
                await wait_until(lambda: listener.bodies == ["by-check"], 30, "the check-back")
                got = await wait_until(
                    lambda: c.pull_all("orders", group="billing"), 30, "the committed message"
                )
            assert [m.body for m in got] == [b"by-check"]
            half = await c.send("orders", b"by-operator", group="ops-shop", transactional=True)
            operator_txid = str(RawClient.send_header(half).transaction_id)
        async with AsyncAdminClient(addr) as admin:
            await admin.force_decide(operator_txid, False, "ticket 42")
        return checked.msg_id, str(checked.transaction_id), operator_txid

    by_check, txid, operator_txid = asyncio.run(scenario())
    assert bt.controller is not None
    assert bt.controller.transactions.records[txid].state.value == "COMMITTED"

    def steps(*args: str) -> list[tuple[str, str]]:
        rows = json.loads(_cli(addr, *args, "-o", "json"))
        return [(r["step"], r["what"]) for r in rows]

    want = [
        ("stored", "half message"),
        ("end-transaction", "producer decision: UNKNOW"),
        ("check-sent", "check 1"),
        ("end-transaction", "check answer: COMMIT_MESSAGE"),
        ("committed", "check"),
        ("delivered", "pulled (retry 0)"),
    ]

    def has_all() -> list[tuple[str, str]]:
        got = steps(by_check)
        return got if len(got) >= len(want) else []

    got = wait_until_sync(has_all, 30, "the check-back's whole timeline")
    assert [s for s, _ in got] == [s for s, _ in want], got
    for (step, what), (want_step, want_what) in zip(got, want, strict=True):
        assert step == want_step and want_what in what, (got, want)
    # the same timeline by the transaction id; the table names every step
    assert steps("--key", txid) == got
    table = _cli(addr, by_check)
    for step, _ in want:
        assert step in table

    # the operator's rollback, found through the transaction id
    def rolled_back() -> list[tuple[str, str]]:
        got = steps("--key", operator_txid)
        return got if ("rolled-back", "operator: ticket 42") in got else []

    got = wait_until_sync(rolled_back, 30, "the operator's rollback in the trace")
    assert [s for s, _ in got] == ["stored", "rolled-back"], got


async def test_tracing_off_writes_nothing(broker: BrokerController) -> None:
    assert not broker.config.trace_topic_enable
    async with AsyncProducer("p", broker.address) as producer:
        for i in range(20):
            await producer.send(Message("plain", f"m{i}".encode()))
    async with connected(broker.address) as c:
        half = await c.send("plain", b"half", transactional=True)
        done = await c.end_transaction("raw-producer", half, 0x8)
        assert done.code == ResponseCode.SUCCESS, done.remark
        # a marker after everything: once it is readable, anything traced before would be too
        assert (await c.send("plain", b"marker")).code == ResponseCode.SUCCESS
        msgs = await wait_until(lambda: c.pull_all("plain"), 30, "the marker")
        assert b"marker" in [m.body for m in msgs]
    assert broker.topics.get(TRACE_TOPIC) is None
    assert broker.store.get_max_offset_in_queue(TRACE_TOPIC, 0) == 0


@pytest.mark.external
async def test_acknowledged_sends_keep_their_trace_across_a_sigkill(tmp_path: Path) -> None:
    # SYNC_FLUSH: an acknowledged send's trace record is fsynced with it, before its answer
    with running(
        str(tmp_path / "store"), flush="SYNC_FLUSH", settings={"traceTopicEnable": "true"}
    ) as bp:
        ids = []
        async with AsyncProducer("p", bp.address) as producer:
            for i in range(50):
                ids.append((await producer.send(Message("kept", f"m{i}".encode()))).msg_id)
        bp.kill()  # right after the last answer
        bp.start()

        async def traced() -> list[str]:
            async with AsyncAdminClient(bp.address) as admin:
                found = await admin.query_messages(TRACE_TOPIC, ids[-1], max_num=64)
                out = []
                for m in found.messages:
                    out += [r.msg_id for r in decode(m.body) if r.type is TraceType.PUB]
                return out if ids[-1] in out else []

        await wait_until(traced, 30, "the last send's trace indexed after the restart")
        async with AsyncAdminClient(bp.address) as admin:
            for msg_id in ids:
                records = await collect(admin, msg_id)
                assert [r.type for r in records] == [TraceType.PUB], (msg_id, records)
                assert records[0].topic == "kept"
                assert abs(records[0].timestamp - time.time() * 1000) < 600_000  # stored lately


async def test_a_transaction_out_of_check_budget_is_traced_as_timed_out(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    async with started(
        make_broker_config(trace_topic_enable=True, transaction_check_max=2)
    ) as controller:
        listener = CheckBack(LocalTransactionState.UNKNOWN)
        async with AsyncTransactionProducer("undecided", listener, controller.address) as tx:
            sent = await tx.send_message_in_transaction(Message("orders", b"never"))
            txid = str(sent.transaction_id)
            await wait_until(
                lambda: controller.transactions.records[txid].state.value == "DISCARDED",
                30,
                "the transaction parked after two checks",
            )
        async with AsyncAdminClient(controller.address) as admin:

            async def steps() -> list[tuple[str, str]]:
                records = await collect(admin, sent.msg_id)
                return [(r.type.value, r.event or r.transaction_state) for r in records]

            want = [
                ("Pub", ""),
                ("EndTransaction", "UNKNOW"),
                ("TxEvent", "check-sent"),
                ("EndTransaction", "UNKNOW"),
                ("TxEvent", "check-sent"),
                ("EndTransaction", "UNKNOW"),
                ("TxEvent", "timed-out"),
            ]
            got = await wait_until(
                lambda: _when(steps(), lambda s: len(s) >= len(want)), 30, "the time-out traced"
            )
        assert got == want
        assert listener.checks == 2


async def _when(probe: Any, ok: Callable[[Any], bool]) -> Any:
    value = await probe
    return value if ok(value) else None


async def test_a_batch_decision_is_traced_as_the_batchs(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    from txmq.spark_connector.session import BrokerSession

    async with started(make_broker_config(trace_topic_enable=True)) as controller:
        async with connected(controller.address) as c:
            for name in ("a", "b"):
                resp = await c.send(
                    "sink",
                    name.encode(),
                    group="spark",
                    transactional=True,
                    props={
                        MessageConst.TRANSACTION_ID: f"batch9-{name}",
                        MessageConst.TXMQ_BATCH_KEY: "9",
                    },
                )
                assert resp.code == ResponseCode.SUCCESS, resp.remark
        async with BrokerSession(controller.address, 10.0) as session:
            await session.decide_batch("spark", "9", ["batch9-a"])
        async with AsyncAdminClient(controller.address) as admin:

            async def events(txid: str) -> list[tuple[str, str]]:
                return [(r.event, r.detail) for r in await collect(admin, txid) if r.event]

            assert await wait_until(
                lambda: events("batch9-a"), 30, "the batch's commit traced"
            ) == [("committed", "batch")]
            assert await wait_until(
                lambda: events("batch9-b"), 30, "the batch's rollback traced"
            ) == [("rolled-back", "batch")]


async def test_a_send_back_is_traced(make_broker_config: Callable[..., BrokerConfig]) -> None:
    from txmq.protocol.message import decode_offset_msg_id

    async with started(make_broker_config(trace_topic_enable=True)) as controller:
        async with connected(controller.address) as c:
            sent = RawClient.send_header(
                await c.send("pay", b"p", props={MessageConst.UNIQ_KEY: "PAY-1", "KEYS": "o-1"})
            )
            _host, offset = decode_offset_msg_id(sent.msg_id)
            for delay in (0, -1):  # once to retry, then straight to the dead letters
                resp = await c.call(
                    RequestCode.CONSUMER_SEND_MSG_BACK,
                    {"group": "settlers", "offset": offset, "delayLevel": delay},
                )
                assert resp.code == ResponseCode.SUCCESS, resp.remark
        async with AsyncAdminClient(controller.address) as admin:

            async def backs() -> list[tuple[str, str, bool]]:
                records = await collect(admin, "o-1")
                return [
                    (r.group, r.request_id, r.success)
                    for r in records
                    if r.type is TraceType.SUB_AFTER
                ]

            got = await wait_until(
                lambda: _when(backs(), lambda b: len(b) == 2), 30, "both send-backs traced"
            )
        assert got == [("settlers", "retry", False), ("settlers", "dlq", False)]


async def test_the_sdks_producer_traces_its_sends(broker: BrokerController) -> None:
    """``enable_trace``: Pub records in RocketMQ's encoding, sent to the trace topic (the broker
    itself traces nothing here)."""
    async with AsyncProducer("shop", broker.address, enable_trace=True) as producer:
        one = await producer.send(Message("orders", b"one", tags="TagA", keys="order-1"))
        two = await producer.send(Message("orders", b"two!"))
    assert broker.core.trace is None
    async with AsyncAdminClient(broker.address) as admin:
        first = await wait_until(lambda: collect(admin, one.msg_id), 30, "the first send traced")
        by_key = await collect(admin, "order-1")
        second = await collect(admin, two.msg_id)
    assert by_key == first
    (pub,) = first
    assert (pub.type, pub.group, pub.topic, pub.tags, pub.keys, pub.body_length) == (
        TraceType.PUB,
        "shop",
        "orders",
        "TagA",
        "order-1",
        3,
    )
    assert pub.offset_msg_id == one.offset_msg_id and pub.success
    assert [r.body_length for r in second] == [4]


async def test_the_brokers_pub_records_of_single_and_batched_sends(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    async with started(make_broker_config(trace_topic_enable=True)) as controller:
        async with AsyncProducer("shop", controller.address) as producer:
            one = await producer.send(Message("orders", b"one", tags="TagA", keys="order-1"))
            batch = await producer.send_batch([Message("orders", b"b1"), Message("orders", b"b2")])
        async with AsyncAdminClient(controller.address) as admin:
            single = await wait_until(lambda: collect(admin, "order-1"), 30, "the send traced")
            batched = []
            for msg_id in batch.msg_ids:

                async def traced(msg_id: str = msg_id) -> list[TraceRecord]:
                    return await collect(admin, msg_id)

                batched.append(await wait_until(traced, 30, "the batch traced"))
        (pub,) = single
        assert (pub.type, pub.topic, pub.msg_id, pub.tags, pub.keys, pub.body_length) == (
            TraceType.PUB,
            "orders",
            one.msg_id,
            "TagA",
            "order-1",
            3,
        )
        assert pub.offset_msg_id == one.offset_msg_id
        assert pub.store_host.endswith(":" + controller.address.rpartition(":")[2])
        assert abs(pub.timestamp - time.time() * 1000) < 600_000
        for (rec,), msg_id, offset_id in zip(
            batched, batch.msg_ids, batch.offset_msg_ids, strict=True
        ):
            assert (rec.type, rec.topic, rec.msg_id, rec.offset_msg_id, rec.tags) == (
                TraceType.PUB,
                "orders",
                msg_id,
                offset_id,
                "",
            )


def test_a_grpc_receive_is_traced_as_a_delivery(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    """Deliveries over the RocketMQ 5 front end are recorded as a remoting pull's are."""
    import grpc

    from tests.compat.test_grpc_frontend import MD, message, receive
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

    bt = broker_thread_factory(trace_topic_enable=True, grpc_server_enable=True, grpc_server_port=0)
    assert bt.controller is not None
    with grpc.insecure_channel(f"127.0.0.1:{bt.controller.grpc_port}") as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        sent = stub.SendMessage(
            spb.SendMessageRequest(messages=[message("grpc-orders", b"g1", "grpc-traced-1")]),
            metadata=MD,
            timeout=10,
        )
        msg_id = sent.entries[0].message_id
        _status, msgs = wait_until_sync(
            lambda: (r := receive(stub, "grpc-orders", "grpc-billing"))[1] and r,
            30,
            "the message received over gRPC",
        )
        assert [m.body for m in msgs] == [b"g1"]

    def delivered() -> list[dict[str, Any]]:
        rows = json.loads(_cli(bt.address, msg_id, "-o", "json"))
        return [r for r in rows if r["step"] == "delivered"]

    rows = wait_until_sync(delivered, 30, "the gRPC delivery in the trace")
    assert any("grpc-billing" in json.dumps(r) for r in rows), rows


def test_grpc_acks_nacks_and_dead_letters_are_traced(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    """A RocketMQ 5 client's AckMessage, ChangeInvisibleDuration and
    ForwardMessageToDeadLetterQueue are in the trace as a remoting consumer's send-back is:
    SubAfter records of the group (``ack`` success, ``invisible`` and ``dlq`` not)."""
    import grpc

    from tests.compat.test_grpc_frontend import MD, ack, message, receive
    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

    bt = broker_thread_factory(trace_topic_enable=True, grpc_server_enable=True, grpc_server_port=0)
    assert bt.controller is not None
    topic, group = "grpc-settled", "grpc-settlers"
    with grpc.insecure_channel(f"127.0.0.1:{bt.controller.grpc_port}") as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        sent = stub.SendMessage(
            spb.SendMessageRequest(
                messages=[message(topic, b"a", "grpc-acked"), message(topic, b"d", "grpc-dead")]
            ),
            metadata=MD,
            timeout=10,
        )
        assert [e.status.code for e in sent.entries] == [pb.OK, pb.OK]
        got: list[Any] = []

        def received() -> bool:
            got.extend(receive(stub, topic, group)[1])
            return len(got) == 2

        wait_until_sync(received, 30, "both messages received over gRPC")
        msgs = got
        by_id = {m.system_properties.message_id: m for m in msgs}
        acked, dead = by_id["grpc-acked"], by_id["grpc-dead"]
        cid = stub.ChangeInvisibleDuration(
            change_invisible_request(
                group, topic, acked.system_properties.receipt_handle, "grpc-acked"
            ),
            metadata=MD,
            timeout=10,
        )
        assert cid.status.code == pb.OK, cid.status
        acked.system_properties.receipt_handle = cid.receipt_handle
        assert ack(stub, topic, group, acked).status.code == pb.OK
        fwd = stub.ForwardMessageToDeadLetterQueue(
            spb.ForwardMessageToDeadLetterQueueRequest(
                group=pb.Resource(name=group),
                topic=pb.Resource(name=topic),
                receipt_handle=dead.system_properties.receipt_handle,
                message_id="grpc-dead",
                delivery_attempt=dead.system_properties.delivery_attempt,
                max_delivery_attempts=1,
            ),
            metadata=MD,
            timeout=10,
        )
        assert fwd.status.code == pb.OK, fwd.status

    def settled(msg_id: str, n: int) -> Callable[[], list[tuple[str, str, bool]]]:
        def get() -> list[tuple[str, str, bool]]:
            rows = json.loads(_cli(bt.address, msg_id, "-o", "json"))
            got = [
                (r["step"], r["requestId"], r["success"])
                for r in rows
                if r["type"] == "SubAfter" and r["groupName"] == group
            ]
            return got if len(got) >= n else []

        return get

    assert wait_until_sync(settled("grpc-acked", 2), 30, "the nack and the ack traced") == [
        ("invisible", "invisible", False),
        ("consumed", "ack", True),
    ]
    assert wait_until_sync(settled("grpc-dead", 1), 30, "the dead letter traced") == [
        ("sent-back", "dlq", False)
    ]

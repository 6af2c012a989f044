"""Idempotent sends: a resend of a stored message (same topic and UNIQ_KEY) within the duplicate
window is answered with the first send's result and not stored again -- for plain sends, batches
and halves, after a lost connection and after a restart."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tests.support.brokers import raw_broker
from tests.support.fastpath import batch_body, batch_header
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import EndTransactionRequestHeader, SendMessageRequestHeader
from txmq.protocol.message import MessageConst, properties_to_string

C = MessageConst
COMMIT = 8


def _send_header(topic: str, uniq: str, **extra: str) -> dict[str, Any]:
    return SendMessageRequestHeader(
        producer_group="dedup-g",
        topic=topic,
        queue_id=0,
        born_timestamp=1,
        properties=properties_to_string({C.UNIQ_KEY: uniq, **extra}),
    ).to_v2_ext_fields()


async def _send(c: RawClient, topic: str, uniq: str, body: bytes) -> RemotingCommand:
    """SEND_MESSAGE_V2 of ``body`` to ``topic`` under the UNIQ_KEY ``uniq`` (a resend when
    that key was sent before)."""
    return await c.call(RequestCode.SEND_MESSAGE_V2, _send_header(topic, uniq), body)


def _answer(resp: Any) -> tuple[Any, ...]:
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    f = resp.ext_fields
    return (f["msgId"], f["queueId"], f["queueOffset"], f.get("transactionId"))


async def _bodies(client: RawClient, topic: str) -> list[bytes]:
    return [m.body for m in await client.pull_all(topic)]


async def test_a_resend_is_answered_with_the_first_result_and_stored_once(
    broker: BrokerController,
) -> None:
    async with connected(broker.address) as c:
        first = await _send(c, "dd", "U1", b"one")
        # A resend may go to another queue (the SDK picks anew): still the first result.
        ext = _send_header("dd", "U1")
        ext["e"] = "2"  # queueId in the V2 header
        again = await c.call(RequestCode.SEND_MESSAGE_V2, ext, b"one")
        other = await _send(c, "dd", "U2", b"two")
        assert _answer(again) == _answer(first)
        assert _answer(other) != _answer(first)
        assert sorted(await _bodies(c, "dd")) == [b"one", b"two"]
        snap = broker.metrics.snapshot()
        assert snap["txmq_dedup_hits_total"] == 1
        # The same UNIQ_KEY to another topic is another message.
        elsewhere = await _send(c, "dd2", "U1", b"one")
        assert elsewhere.code == ResponseCode.SUCCESS
        assert await _bodies(c, "dd2") == [b"one"]


async def test_a_resent_batch_is_stored_once_on_both_paths(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    for fast in (True, False):
        async with raw_broker(make_broker_config(fast_path_enable=fast)) as (b, c):
            rows = [
                (f"m{i}".encode(), 0, properties_to_string({C.UNIQ_KEY: f"B{i}"}).encode())
                for i in range(5)
            ]
            body = batch_body(rows)
            first = await c.call(
                RequestCode.SEND_BATCH_MESSAGE, batch_header("g", "bt", 0, 0), body
            )
            again = await c.call(
                RequestCode.SEND_BATCH_MESSAGE, batch_header("g", "bt", 1, 0), body
            )
            assert _answer(again)[0] == _answer(first)[0], f"fast path {fast}"
            # A batch with old and new messages stores the new ones only.
            mixed = batch_body(
                rows[3:] + [(b"m5", 0, properties_to_string({C.UNIQ_KEY: "B5"}).encode())]
            )
            third = await c.call(
                RequestCode.SEND_BATCH_MESSAGE, batch_header("g", "bt", 0, 0), mixed
            )
            ids = _answer(third)[0].split(",")
            assert ids[:2] == _answer(first)[0].split(",")[3:]
            got = sorted(await _bodies(c, "bt"))
            assert got == [f"m{i}".encode() for i in range(6)], f"fast path {fast}: {got}"


async def test_a_resent_half_joins_its_transaction_once(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        props = {C.UNIQ_KEY: "H1", C.TRAN_MSG: "true", C.PGROUP: "tx-g"}
        h = SendMessageRequestHeader(
            producer_group="tx-g",
            topic="dh",
            queue_id=0,
            sys_flag=0x4,
            born_timestamp=1,
            properties=properties_to_string(props),
        ).to_v2_ext_fields()
        first = await c.call(RequestCode.SEND_MESSAGE_V2, h, b"half")
        again = await c.call(RequestCode.SEND_MESSAGE_V2, h, b"half")
        assert _answer(again) == _answer(first)
        rec = broker.transactions.records["H1"]
        assert len(rec.halves) == 1
        sent = RawClient.send_header(first)
        end = EndTransactionRequestHeader(
            producer_group="tx-g",
            tran_state_table_offset=sent.queue_offset,
            commit_log_offset=int(sent.msg_id[-16:], 16),
            commit_or_rollback=COMMIT,
            msg_id=sent.msg_id,
            transaction_id="H1",
        )
        resp = await c.call(RequestCode.END_TRANSACTION, end.to_ext_fields())
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        # After the commit, a late resend of the half is still the first answer, nothing more.
        late = await c.call(RequestCode.SEND_MESSAGE_V2, h, b"half")
        assert _answer(late) == _answer(first)
        assert await _bodies(c, "dh") == [b"half"]


async def test_a_resend_on_a_new_connection_after_a_cut_is_stored_once(
    broker: BrokerController,
) -> None:
    c = await RawClient.connect(broker.address)
    # The request is written, then the connection is cut before the answer is read.
    cmd = RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2, _send_header("dc", "C1"), body=b"cut"
    )
    c.conn.write(cmd)
    await c.close()
    # The broker stored it (the write reached it before the close).
    await wait_until(
        lambda: broker.store.get_max_offset_in_queue("dc", 0) == 1, 10, "the cut send stored"
    )
    async with connected(broker.address) as c2:
        again = await _send(c2, "dc", "C1", b"cut")
        assert again.code == ResponseCode.SUCCESS
        assert await _bodies(c2, "dc") == [b"cut"]


async def test_the_window_survives_a_restart_and_ends(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    now = [1_800_000_000.0]
    cfg = make_broker_config(duplicate_window_seconds=60)
    b = BrokerController(cfg, clock=lambda: now[0])
    await b.start()
    c = await RawClient.connect(b.address)
    first = _answer(await _send(c, "dr", "R1", b"r"))
    await c.close()
    await b.shutdown()

    now[0] += 30  # within the window; the same port, as a restarted broker has
    b = BrokerController(dataclasses.replace(cfg, listen_port=b.port), clock=lambda: now[0])
    await b.start()
    assert b.recovery["dedup_keys"] == 1
    c = await RawClient.connect(b.address)
    try:
        again = await _send(c, "dr", "R1", b"r")
        assert _answer(again) == first
        assert await _bodies(c, "dr") == [b"r"]
        now[0] += 31  # the window is over: the same id is a new message
        late = await _send(c, "dr", "R1", b"r")
        assert _answer(late) != first
        assert await _bodies(c, "dr") == [b"r", b"r"]
    finally:
        await c.close()
        await b.shutdown()


async def test_off_when_the_window_is_zero(make_broker_config: Callable[..., BrokerConfig]) -> None:
    async with raw_broker(make_broker_config(duplicate_window_seconds=0)) as (b, c):
        for _ in range(2):
            await _send(c, "do", "O1", b"o")
        assert await _bodies(c, "do") == [b"o", b"o"]


async def test_retry_and_dead_letter_copies_are_not_deduplicated(broker: BrokerController) -> None:
    # The broker's own copies carry the original's UNIQ_KEY: two retries of one message
    # (two CONSUMER_SEND_MSG_BACKs) are two messages in %RETRY%<group>.
    async with connected(broker.address) as c:
        sent = RawClient.send_header(await _send(c, "drt", "T1", b"t"))
        offset = int(sent.msg_id[-16:], 16)
        for _ in range(2):
            resp = await c.call(
                RequestCode.CONSUMER_SEND_MSG_BACK,
                {"offset": offset, "group": "cg", "delayLevel": -1, "originMsgId": sent.msg_id},
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert await _bodies(c, "%DLQ%cg") == [b"t", b"t"]


async def test_a_message_twice_in_one_batch_is_stored_once(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    for fast in (True, False):
        async with raw_broker(make_broker_config(fast_path_enable=fast)) as (b, c):
            row = (b"twice", 0, properties_to_string({C.UNIQ_KEY: "W1"}).encode())
            other = (b"other", 0, properties_to_string({C.UNIQ_KEY: "W2"}).encode())
            resp = await c.call(
                RequestCode.SEND_BATCH_MESSAGE,
                batch_header("g", "bw", 0, 0),
                batch_body([row, other, row]),
            )
            ids = _answer(resp)[0].split(",")
            assert len(ids) == 3 and ids[0] == ids[2] != ids[1], f"fast path {fast}: {ids}"
            assert sorted(await _bodies(c, "bw")) == [b"other", b"twice"], f"fast path {fast}"


def test_the_window_is_bounded_and_says_when_it_is_cut_short() -> None:
    from txmq.broker.messaging.dedup import DedupIndex
    from txmq.broker.metrics import BrokerMetrics

    metrics = BrokerMetrics()
    index = DedupIndex(window_ms=60_000, max_entries=3, metrics=metrics)
    for i in range(7):  # seven sends within the window, three ids a generation at most
        index.add(("t", f"u{i}"), i * 100, 1_000 + i)
    # Each id is remembered until at least three newer ones came; then its generation goes.
    assert len(index) == 4
    assert not index.any_known("t", ["u0", "u1", "u2"])
    assert all(index.known("t", f"u{i}") for i in range(3, 7))
    assert metrics.snapshot()["txmq_dedup_evicted_early_total"] == 3
    # Past the window, ids are forgotten whatever the bound (a generation a window).
    index.add(("t", "u7"), 700, 70_000)
    index.add(("t", "u8"), 800, 130_001)
    assert len(index) == 2 and not index.any_known("t", ["u6"])
    assert index.known("t", "u7") and index.known("t", "u8")

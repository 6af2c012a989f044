"""A SEND_MESSAGE / SEND_MESSAGE_V2 of one plain message is stored straight from its header
(no header object, no properties parsed and written back, no message object).  Two real brokers
get the same requests over sockets, one with ``fastPathEnable`` off (the generic path), and
must answer the same and store the same bytes; requests the direct path must leave (a
transaction, a delay, a timer, non-canonical properties, no UNIQ_KEY, a header field as text,
a resend, a body over the limit) go to the generic path and are answered as before."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.fastpath import (
    BrokerPair,
    broker_pair,
    comparable,
    same_record,
    send_to_both,
    sent_by_path,
    single_header,
)
from txmq.broker.messaging.core import SendOutcome, SendReceipt, StoredBatch
from txmq.broker.processors.send import SendMessageProcessor
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import FlushDiskTimeoutError
from txmq.protocol.headers import SendMessageResponseHeader
from txmq.protocol.message import (
    MessageConst,
    decode_offset_msg_id,
    properties_to_string,
)
from txmq.protocol.trace import TRACE_TOPIC, TraceType, decode

C = MessageConst
MAX_BODY = 300


@pytest.fixture
async def pair(make_broker_config: Any) -> AsyncIterator[BrokerPair]:
    async with broker_pair(make_broker_config, max_message_size=MAX_BODY) as p:
        yield p


def direct(b: BrokerController) -> int:
    """Plain messages ``b`` stored through the direct path (``txmq_send_path_total``)."""
    return sent_by_path(b, "one_plain")


def header(
    v2: bool, topic: str, props: str | None, qid: int = 1, sys_flag: int = 0, **more: Any
) -> dict[str, Any]:
    return single_header("direct-g", v2, topic, props, qid, sys_flag, **more)


async def same_answers(
    pair: BrokerPair, v2: bool, ext: dict[str, Any], body: bytes, *, same_clock: bool = True
) -> bool:
    """Send to both, compare answers and stored records; whether the direct path took it.
    ``same_clock`` False: a timer's delivery time is each broker's clock ahead, not compared."""
    _, took, off, fields = await send_to_both(pair, v2, ext, body, direct)
    if off is not None:
        if took:  # a plain message's answer
            assert set(fields) == {"queueId", "queueOffset"}
        if same_clock:
            same_record(pair, off)
    return took


def sdk_props(i: int, *extra: tuple[str, str]) -> str:
    return properties_to_string(
        dict([(C.UNIQ_KEY, f"{i:032X}"), (C.WAIT_STORE_MSG_OK, "true"), *extra])
    )


@pytest.mark.parametrize("v2", [True, False], ids=["V2", "V1"])
async def test_the_sdks_plain_send_is_stored_directly_with_the_same_bytes(
    pair: BrokerPair, v2: bool
) -> None:
    variants = [
        lambda u: sdk_props(u),
        lambda u: sdk_props(u, (C.TAGS, "TagA"), (C.KEYS, "k1 k2")),
        lambda u: properties_to_string(
            {"région": "Zürich ✓", C.UNIQ_KEY: f"{u}", "empty": "", C.TAGS: "é"}
        ),
        lambda u: properties_to_string({C.UNIQ_KEY: f"only-{u}"}),
    ]
    for i, make in enumerate(variants):
        for r in range(2):  # the second send of a shape reuses its stored form
            props = make(100 + 2 * i + r)
            ext = header(v2, "direct-t", props)
            assert await same_answers(pair, v2, ext, f"body-{i}-{r}".encode() * 3), props
    # A consumer reads the same messages from both, the consume queues agree (tag codes too).
    got_a = await pair.clients[0].pull_all("direct-t")
    got_b = await pair.clients[1].pull_all("direct-t")
    assert len(got_a) == len(got_b) == 8
    assert [comparable(m) for m in got_a] == [comparable(m) for m in got_b]
    cq_a = pair.fast.store._cqs[("direct-t", 1)]
    cq_b = pair.generic.store._cqs[("direct-t", 1)]
    assert [cq_a.entry(i) for i in range(8)] == [cq_b.entry(i) for i in range(8)]


def _left_to_the_generic_path() -> dict[str, tuple[dict[str, Any], bytes]]:
    good = sdk_props(77)
    v2 = True
    return {
        "no UNIQ_KEY": (header(v2, "direct-l", properties_to_string({"k": "v"})), b"a"),
        "an empty UNIQ_KEY": (header(v2, "direct-l", properties_to_string({C.UNIQ_KEY: ""})), b"a"),
        "no properties": (header(v2, "direct-l", None), b"a"),
        "a second UNIQ_KEY": (header(v2, "direct-l", good + "UNIQ_KEY\x01other\x02"), b"a"),
        "not canonical": (header(v2, "direct-l", "k\x01v\x02\x02" + good), b"a"),
        "no final separator": (header(v2, "direct-l", "UNIQ_KEY\x01A1\x02k\x01v"), b"a"),
        "a delay": (header(v2, "direct-l", sdk_props(78, (C.DELAY, "3"))), b"a"),
        "a timer": (header(v2, "direct-l", sdk_props(79, ("TIMER_DELAY_SEC", "30"))), b"a"),
        "a half": (
            header(
                v2,
                "direct-l",
                sdk_props(80, (C.TRAN_MSG, "true"), (C.PGROUP, "direct-g")),
                sys_flag=4,
            ),
            b"a",
        ),
        "a transaction flag without TRAN_MSG": (
            header(v2, "direct-l", sdk_props(81), sys_flag=4),
            b"a",
        ),
        "a body over maxMessageSize": (
            header(v2, "direct-l", sdk_props(82)),
            b"x" * (MAX_BODY + 1),
        ),
        "a queue that does not exist": (header(v2, "direct-l", sdk_props(83), qid=99), b"a"),
        "a header field as text": ({**header(v2, "direct-l", sdk_props(84)), "e": "1"}, b"a"),
        "a key of the other header form": (
            {**header(v2, "direct-l", sdk_props(85)), "queueId": 2},
            b"a",
        ),
        "a separator in a value": (header(v2, "direct-l", sdk_props(86) + "k\x01a\x01b\x02"), b"a"),
    }


@pytest.mark.parametrize("case", list(_left_to_the_generic_path()))
async def test_sends_the_direct_path_leaves_are_answered_as_before(
    pair: BrokerPair, case: str
) -> None:
    ext, body = _left_to_the_generic_path()[case]
    took = await same_answers(pair, True, ext, body, same_clock=case != "a timer")
    if case != "a queue that does not exist":  # checked after the header is read
        assert not took, f"{case}: the direct path took it"


async def test_a_resend_is_answered_with_the_first_send_by_both(pair: BrokerPair) -> None:
    ext = header(True, "direct-r", sdk_props(5))
    assert await same_answers(pair, True, ext, b"first")
    assert not await same_answers(pair, True, ext, b"first"), "a resend was stored directly"
    first = await pair.clients[0].call(RequestCode.SEND_MESSAGE_V2, ext, b"first")
    again = await pair.clients[0].call(RequestCode.SEND_MESSAGE_V2, ext, b"first")
    assert first.ext_fields == again.ext_fields
    assert pair.fast.store._cqs[("direct-r", 1)].max_offset == 1
    assert pair.generic.store._cqs[("direct-r", 1)].max_offset == 1


async def test_sends_to_a_topic_without_the_window_are_stored_each_time(pair: BrokerPair) -> None:
    ext = header(True, "%RETRY%direct-g", sdk_props(6), qid=0)
    for n in range(2):
        assert await same_answers(pair, True, ext, b"again"), "not stored directly"
        assert pair.fast.store._cqs[("%RETRY%direct-g", 0)].max_offset == n + 1


async def test_random_sends_are_answered_and_stored_alike(pair: BrokerPair) -> None:
    rng = random.Random(20261126)
    sent: list[tuple[bool, dict[str, Any], bytes]] = []
    took = 0
    for i in range(160):
        if sent and rng.random() < 0.1:
            v2, ext, body = rng.choice(sent)  # a resend
        else:
            v2 = rng.random() < 0.7
            props: dict[str, str] = {}
            for _ in range(rng.randint(0, 2)):
                props[rng.choice(["a", "b", "zé"])] = rng.choice(["", "1", "✓", "x y"])
            if rng.random() < 0.9:
                props[C.UNIQ_KEY] = f"{i:X}".rjust(rng.choice([5, 32]), "0")
            for _ in range(rng.randint(0, 2)):
                k, v = rng.choice(
                    [
                        (C.TAGS, "t"),
                        (C.KEYS, "k"),
                        (C.WAIT_STORE_MSG_OK, "true"),
                        (C.DELAY, "18"),  # two hours: nothing fires during the test
                        ("TIMER_DELAY_MS", "3600000"),
                        (C.TRAN_MSG, "false"),
                    ]
                )
                props[k] = v
            text = properties_to_string(props)
            if rng.random() < 0.05:
                text = "x\x01y\x02\x02" + text
            more: dict[str, Any] = {}
            if rng.random() < 0.3:
                more["reconsume_times"] = rng.randint(0, 3)
            if rng.random() < 0.2:
                more["batch"] = False
            if rng.random() < 0.2:
                more["unit_mode"] = rng.random() < 0.5
            ext = header(
                v2,
                rng.choice(["direct-a", "direct-b"]),
                text,
                qid=rng.choice([0, 1, 2, 3, 3, 7]),
                sys_flag=rng.choice([0, 0, 0, 2, 1]),
                flag=rng.randint(0, 5),
                **more,
            )
            body = rng.randbytes(rng.choice([0, 1, 64, 256, MAX_BODY, MAX_BODY + 1]))
            sent.append((v2, ext, body))
        timer = "TIMER_DELAY_MS" in str(ext)
        took += await same_answers(pair, v2, ext, body, same_clock=not timer)
    assert took > 40, f"the direct path took only {took} of 160 sends"
    for topic in ("direct-a", "direct-b"):
        got_a = await pair.clients[0].pull_all(topic)
        got_b = await pair.clients[1].pull_all(topic)
        assert [comparable(m) for m in got_a] == [comparable(m) for m in got_b]


async def test_the_switch_turns_the_direct_path_off(pair: BrokerPair) -> None:
    ext = header(True, "direct-s", sdk_props(9))
    await pair.clients[1].call(RequestCode.SEND_MESSAGE_V2, ext, b"x")
    assert direct(pair.generic) == 0
    cmd = await pair.clients[0].call(RequestCode.SEND_MESSAGE_V2, ext, b"x")
    assert isinstance(cmd, RemotingCommand) and cmd.code == ResponseCode.SUCCESS
    assert direct(pair.fast) == 1


@pytest.mark.parametrize("txid", [None, "tx-1"])
def test_the_answer_holds_the_response_headers_fields(txid: str | None) -> None:
    receipt = SendReceipt("AB" * 16, "U", 2, 41, txid, 500, 400)
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2)
    cmd.opaque = 9
    for error in (None, FlushDiskTimeoutError("slow disk")):
        ans = SendMessageProcessor._answer(cmd, SendOutcome([receipt], error))
        want = SendMessageResponseHeader(
            msg_id="AB" * 16, queue_id=2, queue_offset=41, transaction_id=txid
        ).to_ext_fields()
        assert list(ans.ext_fields.items()) == list(want.items())
        assert ans.code == (
            ResponseCode.SUCCESS if error is None else ResponseCode.FLUSH_DISK_TIMEOUT
        )
        assert ans.opaque == 9


async def test_under_sync_flush_the_answer_waits_for_the_fsync(make_broker_config: Any) -> None:
    async with broker_pair(make_broker_config, flush_disk_type="SYNC_FLUSH") as sync_pair:
        ext = header(True, "direct-sync", sdk_props(11))
        assert await same_answers(sync_pair, True, ext, b"durable"), "not stored directly"
        b = sync_pair.fast
        assert not b.core.durable_at_once()
        # Answered only once the commit log was fsynced past the record.
        assert b.store.flushed_offset >= b.store.max_phy_offset


def test_the_message_id_of_one_record_is_formatted_as_of_several() -> None:
    one = StoredBatch("7F%01", [(255, 10, 0)], ["u"], 0, None, 300)
    two = StoredBatch("7F%01", [(255, 10, 0), (4096, 10, 1)], ["u", "v"], 0, None, 300)
    assert one.msg_ids() == "7F%0100000000000000FF"
    assert two.msg_ids() == "7F%0100000000000000FF,7F%010000000000001000"


async def test_with_the_trace_on_sends_are_stored_directly_and_traced_alike(
    make_broker_config: Any,
) -> None:
    """``traceTopicEnable``: the direct path still takes a plain send, and its Pub record is the
    generic path's (the fields two brokers cannot share, times and hosts, set aside)."""
    async with broker_pair(
        make_broker_config, max_message_size=MAX_BODY, trace_topic_enable=True
    ) as pair:
        shapes = [
            sdk_props(700),
            sdk_props(701, (C.TAGS, "TagA"), (C.KEYS, "k1 k2")),
            sdk_props(702, (C.TAGS, "TagA"), (C.KEYS, "k1 k2")),  # the form's fields reused
            properties_to_string({C.UNIQ_KEY: "703", C.PGROUP: "pg", C.KEYS: "k3"}),
        ]
        for i, props in enumerate(shapes):
            assert await same_answers(pair, True, header(True, "direct-tr", props), b"x" * i), (
                f"send {i} left the direct path with the trace on"
            )
            for b in (pair.fast, pair.generic):  # one trace message per send on both, so the
                assert b.core.trace is not None  # next sends' offsets agree too
                b.core.trace.flush()
        records = []
        for b, c in zip((pair.fast, pair.generic), pair.clients, strict=True):
            assert b.core.trace is not None
            b.core.trace.flush()
            got = [
                r
                for m in await c.pull_all(TRACE_TOPIC, queues=1)
                for r in decode(m.body)
                if r.type is TraceType.PUB
            ]
            for r in got:
                r.timestamp, r.store_host = 0, ""
                r.offset_msg_id = str(decode_offset_msg_id(r.offset_msg_id)[1])
            records.append(sorted(got, key=lambda r: r.msg_id))
        fast, generic = records
        assert [r.msg_id for r in fast] == [f"{700 + i:032X}" for i in range(3)] + ["703"]
        assert fast == generic
        assert (fast[1].tags, fast[1].keys, fast[3].group) == ("TagA", "k1 k2", "pg")

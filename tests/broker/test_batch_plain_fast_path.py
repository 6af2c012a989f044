"""A SEND_BATCH_MESSAGE of plain messages whose properties around their UNIQ_KEY repeat (what
producers send in bulk) is stored straight from the request body.  Every record must be what
the generic path writes: two brokers get the same requests, one with the fast path turned off,
and their answers, stored records (byte for byte, but for the fields that differ between two
brokers) and what a consumer pulls are compared; batches the fast path leaves are answered as
before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.fastpath import (
    BrokerPair,
    batch_body,
    batch_header,
    broker_pair,
    comparable,
)
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.message import (
    MessageConst,
    decode_message,
    decode_offset_msg_id,
    properties_to_string,
)

C = MessageConst
TOPIC = "plain-t"
#: The bytes of a stored record that differ between two brokers (BORNHOST, STORETIMESTAMP,
#: STOREHOST).
_PER_BROKER_BYTES = slice(48, 72)


@pytest.fixture
async def pair(make_broker_config: Any) -> AsyncIterator[BrokerPair]:
    """``fast`` as shipped, ``generic`` without the plain-batch fast path."""
    async with broker_pair(make_broker_config) as p:
        yield p


def _header(qid: int = 1, sys_flag: int = 0) -> Any:
    return batch_header("plain-g", TOPIC, qid, sys_flag)


def _raw(b: BrokerController, offset: int) -> bytes:
    raw = bytearray(b.store.read_message_bytes(offset))
    raw[_PER_BROKER_BYTES] = bytes(24)
    return bytes(raw)


def _wire(*items: tuple[str, str]) -> bytes:
    return properties_to_string(dict(items)).encode()


def _uniq(i: int, width: int = 32) -> str:
    return f"{i:0{width}X}"


#: Properties per entry (i: the entry's index), in wire form.
VARIANTS: dict[str, Any] = {
    "the SDK's plain send": lambda i: _wire((C.UNIQ_KEY, _uniq(i)), (C.WAIT_STORE_MSG_OK, "true")),
    "tags and keys before the UNIQ_KEY": lambda i: _wire(
        (C.TAGS, "created"),
        (C.KEYS, f"order-{i % 2}"),
        (C.UNIQ_KEY, _uniq(i)),
        (C.WAIT_STORE_MSG_OK, "true"),
    ),
    "user properties around it, not ASCII, ids of two lengths": lambda i: _wire(
        ("région", "Zürich ✓"),
        ("empty", ""),
        (C.UNIQ_KEY, _uniq(i, 32 if i % 2 else 7)),
        (C.TAGS, f"t{i % 3}"),
        ("n", "1"),
    ),
    "only a UNIQ_KEY": lambda i: _wire((C.UNIQ_KEY, _uniq(i))),
    "a Java client's order": lambda i: _wire(
        (C.WAIT_STORE_MSG_OK, "true"), (C.KEYS, "k"), (C.UNIQ_KEY, _uniq(i)), (C.TAGS, "TagA")
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_fast_path_stores_what_the_generic_path_does(pair: BrokerPair, variant: str) -> None:
    make = VARIANTS[variant]
    answers = []
    for r in range(3):
        # Each round's messages are new ones (their own UNIQ_KEYs): a resend would be answered
        # from the duplicate window instead.
        rows = [
            (f"{r}-{i}".encode().ljust(50 + i, b"x"), i % 3, make(r * 16 + i)) for i in range(7)
        ]
        a, b = await pair.call(RequestCode.SEND_BATCH_MESSAGE, _header(qid=r % 4), batch_body(rows))
        assert (a.code, a.remark) == (b.code, b.remark) == (ResponseCode.SUCCESS, None)
        assert a.ext_fields.get("transactionId") is None
        answers.append((a, b))
    assert pair.used == [True, True, True], "the fast path did not take these batches"

    for a, b in answers:
        assert (a.ext_fields["queueId"], a.ext_fields["queueOffset"]) == (
            b.ext_fields["queueId"],
            b.ext_fields["queueOffset"],
        )
        ids_a, ids_b = a.ext_fields["msgId"].split(","), b.ext_fields["msgId"].split(",")
        assert len(ids_a) == len(ids_b) == 7
        for ia, ib in zip(ids_a, ids_b, strict=True):
            (_, off_a), (_, off_b) = decode_offset_msg_id(ia), decode_offset_msg_id(ib)
            assert off_a == off_b
            assert _raw(pair.fast, off_a) == _raw(pair.generic, off_b)
            ma = decode_message(pair.fast.store.read_message_bytes(off_a))
            assert comparable(ma) == comparable(
                decode_message(pair.generic.store.read_message_bytes(off_b))
            )

    got_a = await pair.clients[0].pull_all(TOPIC)
    got_b = await pair.clients[1].pull_all(TOPIC)
    assert len(got_a) == len(got_b) == 21
    assert [comparable(m) for m in got_a] == [comparable(m) for m in got_b]
    # The consume queues (tag codes included): what a tag filter sees.
    for qid in range(3):
        cq_a = pair.fast.store._cqs[(TOPIC, qid)]
        cq_b = pair.generic.store._cqs[(TOPIC, qid)]
        assert cq_a.max_offset == cq_b.max_offset == 7
        assert [cq_a.entry(i) for i in range(7)] == [cq_b.entry(i) for i in range(7)]


def _left_to_the_generic_path() -> dict[str, list[tuple[bytes, int, bytes]]]:
    good = _wire((C.UNIQ_KEY, _uniq(1)), (C.WAIT_STORE_MSG_OK, "true"))
    return {
        "no UNIQ_KEY": [(b"a", 0, _wire(("k", "v")))],
        "a second UNIQ_KEY": [(b"a", 0, good + b"UNIQ_KEY\x01other\x02")],
        "a separator in the UNIQ_KEY": [(b"a", 0, b"UNIQ_KEY\x017F\x0100\x02WAIT\x01true\x02")],
        "a UNIQ_KEY that is not UTF-8": [(b"a", 0, b"UNIQ_KEY\x01\xff\xfe\x02")],
        "properties not in canonical form": [
            (b"a", 0, b"k\x01v\x02\x02UNIQ_KEY\x011\x02"),
            (b"b", 0, b"k\x01v\x02k\x01w\x02UNIQ_KEY\x012\x02"),
        ],
        "no final separator": [(b"a", 0, b"UNIQ_KEY\x011\x02k\x01v")],
        "a delay": [(b"a", 0, good + _wire((C.DELAY, "3")))],
        "TRAN_MSG false": [(b"a", 0, good + _wire((C.TRAN_MSG, "false")))],
        "a body over maxMessageSize": [(b"x" * (4 * 1024 * 1024 + 1), 0, good)],
    }


@pytest.mark.parametrize("case", list(_left_to_the_generic_path()))
async def test_batches_the_fast_path_leaves_are_answered_as_before(
    pair: BrokerPair, case: str
) -> None:
    rows = _left_to_the_generic_path()[case]
    a, b = await pair.call(RequestCode.SEND_BATCH_MESSAGE, _header(), batch_body(rows))
    assert (a.code, a.remark) == (b.code, b.remark)
    assert pair.used == [False]
    if a.code == ResponseCode.SUCCESS:  # taken by the generic path, the same way
        for ia, ib in zip(
            a.ext_fields["msgId"].split(","), b.ext_fields["msgId"].split(","), strict=True
        ):
            (_, oa), (_, ob) = decode_offset_msg_id(ia), decode_offset_msg_id(ib)
            assert _raw(pair.fast, oa) == _raw(pair.generic, ob)


async def test_a_truncated_batch_is_refused_by_both(pair: BrokerPair) -> None:
    body = batch_body([(b"abc", 0, _wire((C.UNIQ_KEY, _uniq(1))))])
    a, b = await pair.call(RequestCode.SEND_BATCH_MESSAGE, _header(), body[:-3])
    assert (a.code, a.remark) == (b.code, b.remark)
    assert a.code != ResponseCode.SUCCESS and "batch" in (a.remark or "")
    assert pair.used == [False]

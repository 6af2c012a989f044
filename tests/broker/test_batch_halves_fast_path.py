"""The halves of a SEND_BATCH_MESSAGE whose properties differ only in their leading UNIQ_KEY
(the Spark sink's) are stored straight from the request body, and a commit appends the copies
kept encoded since.  Every record must be what the generic path writes: two brokers get the
same requests, one with the fast path turned off, and their halves, transaction tables,
answers and committed messages are compared; the committed messages are also compared byte for
byte with the generic commit of the same halves (each read back from the store)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
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
from txmq.protocol.headers import SendMessageResponseHeader
from txmq.protocol.message import (
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_message,
    decode_offset_msg_id,
    encode_message,
    properties_to_string,
)

C = MessageConst
GROUP = "sink-g"
TOPIC = "sink-t"


@pytest.fixture
async def pair(make_broker_config: Any) -> AsyncIterator[BrokerPair]:
    """``fast`` as shipped, ``generic`` without the batch-halves fast path."""
    async with broker_pair(make_broker_config, transaction_check_interval=60_000) as p:
        yield p


def _props(uniq: str, rest: dict[str, str]) -> bytes:
    return (properties_to_string({C.UNIQ_KEY: uniq, **rest})).encode()


def _header(sys_flag: int = MessageSysFlag.TRANSACTION_PREPARED_TYPE, qid: int = 1) -> Any:
    return batch_header(GROUP, TOPIC, qid, sys_flag)


def _stored(b: BrokerController, offset: int) -> MessageExt:
    return decode_message(b.store.read_message_bytes(offset))


def _sink_rest(txid: str, key: str) -> dict[str, str]:
    return {C.TRAN_MSG: "true", C.PGROUP: GROUP, C.TRANSACTION_ID: txid, C.TXMQ_BATCH_KEY: key}


#: Properties after the UNIQ_KEY, per entry (i: the entry's index).
VARIANTS: dict[str, Any] = {
    "spark sink": lambda i, txid, key: _sink_rest(txid, key),
    "tags, keys, user and check properties": lambda i, txid, key: {
        C.TAGS: "created",
        C.KEYS: "order-1 order-2",
        "région": "Zürich ✓",
        "empty": "",
        C.CHECK_IMMUNITY_TIME_IN_SECONDS: "30",
        **_sink_rest(txid, key),
    },
    "no PGROUP, REAL_TOPIC sent by the client": lambda i, txid, key: {
        C.TRAN_MSG: "TRUE",
        C.REAL_TOPIC: "not-this-one",
        C.TRANSACTION_ID: txid,
        C.TXMQ_BATCH_KEY: key,
    },
    "two kinds of entries": lambda i, txid, key: {
        **_sink_rest(txid, key),
        **({C.TAGS: f"t{i % 2}"} if i % 3 else {}),
    },
}


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_fast_path_stores_and_commits_what_the_generic_path_does(
    pair: BrokerPair, variant: str
) -> None:
    key = f"batch-{variant.replace(' ', '-')}"
    txids = [f"{key}-0", f"{key}-1"]
    make = VARIANTS[variant]
    sent: dict[str, list[SendMessageResponseHeader]] = {"fast": [], "generic": []}
    for p, txid in enumerate(txids):
        for r in range(3):  # several requests per transaction, as the sink sends
            rows = [
                (
                    f"{p}-{r}-{i}".encode().ljust(100 + i, b"x"),
                    i % 3,
                    _props(f"7F000001{p:04X}{r:04X}{i:016X}", make(i, txid, key)),
                )
                for i in range(6)
            ]
            sys_flag = MessageSysFlag.TRANSACTION_PREPARED_TYPE | (p * MessageSysFlag.MULTI_TAGS)
            a, b = await pair.call(
                RequestCode.SEND_BATCH_MESSAGE, _header(sys_flag, qid=r % 4), batch_body(rows)
            )
            assert (a.code, a.remark) == (b.code, b.remark) == (ResponseCode.SUCCESS, None)
            sent["fast"].append(SendMessageResponseHeader.from_ext_fields(a.ext_fields))
            sent["generic"].append(SendMessageResponseHeader.from_ext_fields(b.ext_fields))
    assert pair.used and all(pair.used), "the fast path did not take these batches"

    # The answers, the half records and the transaction tables.
    fast, generic = pair.fast, pair.generic
    for ha, hb in zip(sent["fast"], sent["generic"], strict=True):
        assert (ha.queue_id, ha.queue_offset, ha.transaction_id) == (
            hb.queue_id,
            hb.queue_offset,
            hb.transaction_id,
        )
        ids_a, ids_b = ha.msg_id.split(","), hb.msg_id.split(",")
        assert len(ids_a) == len(ids_b) == 6
        for ia, ib in zip(ids_a, ids_b, strict=True):
            (_, off_a), (_, off_b) = decode_offset_msg_id(ia), decode_offset_msg_id(ib)
            assert off_a == off_b
            assert comparable(_stored(fast, off_a)) == comparable(_stored(generic, off_b))
    for txid in txids:
        ra, rb = fast.transactions.records[txid], generic.transactions.records[txid]
        assert (ra.producer_group, ra.batch_key, ra.state) == (
            rb.producer_group,
            rb.batch_key,
            rb.state,
        )
        assert len(ra.halves) == len(rb.halves) == 18
        for half_a, half_b in zip(ra.halves, rb.halves, strict=True):
            assert replace(half_a, offset_msg_id="", store_timestamp=0) == replace(
                half_b, offset_msg_id="", store_timestamp=0
            )
    assert fast.transactions.machine.batch_members == generic.transactions.machine.batch_members
    assert [len(m[4]) for m in fast.transactions._recent_halves.values()] == [
        len(m[4]) for m in generic.transactions._recent_halves.values()
    ]

    # The batch decision: the committed messages.
    hdr = {"producerGroup": GROUP, "batchKey": key}
    a, b = await pair.call(
        RequestCode.TXMQ_DECIDE_BATCH, hdr, json.dumps({"commit": txids}).encode()
    )
    assert json.loads(a.body) == json.loads(b.body)
    assert json.loads(a.body)["committed"] == txids
    assert not fast.transactions._recent_halves
    got_a = await pair.clients[0].pull_all(TOPIC)
    got_b = await pair.clients[1].pull_all(TOPIC)
    assert len(got_a) == len(got_b) == 36
    assert [comparable(m) for m in got_a] == [comparable(m) for m in got_b]
    for m in got_a:
        assert C.TRAN_MSG not in m.properties and C.TXMQ_BATCH_KEY not in m.properties
        assert (
            m.sys_flag & MessageSysFlag.TRANSACTION_MASK == MessageSysFlag.TRANSACTION_COMMIT_TYPE
        )

    # Byte for byte: the generic commit of each half (read back from the store), stored where
    # and when the fast path stored its copy.
    tx = fast.transactions
    for m in got_a:
        half = tx.machine.half_at(m.prepared_transaction_offset)
        assert half is not None
        ref = tx._real_message(half)
        ref.queue_offset, ref.commit_log_offset = m.queue_offset, m.commit_log_offset
        ref.store_timestamp, ref.store_host = m.store_timestamp, m.store_host
        assert encode_message(ref) == fast.store.read_message_bytes(m.commit_log_offset)


def _refusals(txid: str) -> dict[str, list[tuple[bytes, int, bytes]]]:
    rest = _sink_rest(txid, "refused")
    good = _props("7F0000010000000000000001", rest)
    return {
        "two transactions": [
            (b"a", 0, good),
            (b"b", 0, _props("7F0000010000000000000002", _sink_rest(txid + "x", "refused"))),
        ],
        "a plain message among halves": [
            (b"a", 0, good),
            (b"b", 0, _props("7F0000010000000000000002", {C.TAGS: "x"})),
        ],
        "a separator in the UNIQ_KEY": [
            (b"a", 0, b"UNIQ_KEY\x017F00\x0100\x02" + properties_to_string(rest).encode())
        ],
        "a UNIQ_KEY that is not UTF-8": [
            (b"a", 0, b"UNIQ_KEY\x01\xff\xfe\x02" + properties_to_string(rest).encode())
        ],
        "a second UNIQ_KEY": [(b"a", 0, good + b"UNIQ_KEY\x01other\x02")],
        "a separator in a value": [
            (b"a", 0, good + b"odd\x01a\x01b\x02"),
        ],
        "no transaction id": [
            (b"a", 0, _props("7F0000010000000000000001", {C.TRAN_MSG: "true"})),
            (b"b", 0, _props("7F0000010000000000000002", {C.TRAN_MSG: "true"})),
        ],
        "a body over maxMessageSize": [(b"x" * (4 * 1024 * 1024 + 1), 0, good)],
    }


@pytest.mark.parametrize("case", list(_refusals("t")))
async def test_batches_the_fast_path_leaves_are_answered_as_before(
    pair: BrokerPair, case: str
) -> None:
    rows = _refusals(f"refused-{case.replace(' ', '-')}")[case]
    a, b = await pair.call(RequestCode.SEND_BATCH_MESSAGE, _header(), batch_body(rows))
    assert (a.code, a.remark) == (b.code, b.remark)
    assert pair.used == [False]
    if a.code == ResponseCode.SUCCESS:  # taken by the generic path, the same way
        for ia, ib in zip(
            a.ext_fields["msgId"].split(","), b.ext_fields["msgId"].split(","), strict=True
        ):
            (_, oa), (_, ob) = decode_offset_msg_id(ia), decode_offset_msg_id(ib)
            assert comparable(_stored(pair.fast, oa)) == comparable(_stored(pair.generic, ob))


async def test_a_zombie_batch_into_a_decided_batch_is_refused_the_same_way(
    pair: BrokerPair,
) -> None:
    rest = _sink_rest("z-0", "z")
    rows = [(b"a", 0, _props("7F0000010000000000000001", rest))]
    a, b = await pair.call(RequestCode.SEND_BATCH_MESSAGE, _header(), batch_body(rows))
    assert a.code == b.code == ResponseCode.SUCCESS
    hdr = {"producerGroup": GROUP, "batchKey": "z"}
    await pair.call(RequestCode.TXMQ_DECIDE_BATCH, hdr, json.dumps({"commit": ["z-0"]}).encode())
    late = [(b"b", 0, _props("7F0000010000000000000002", _sink_rest("z-1", "z")))]
    a, b = await pair.call(RequestCode.SEND_BATCH_MESSAGE, _header(), batch_body(late))
    assert (a.code, a.remark) == (b.code, b.remark)
    assert a.code == ResponseCode.ILLEGAL_OPERATION
    assert pair.used == [True, False]

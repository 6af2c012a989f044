"""A half message sent alone (SEND_MESSAGE_V2 / SEND_MESSAGE, what ``producer.transaction()``
with one message sends) is stored straight from its header (``broker/messaging/fastpath.py``).
Two real brokers get the same requests over sockets, one with ``fastPathEnable`` off (the
generic path): they must answer the same, store the same half bytes, hold the same transaction
table, and, once END_TRANSACTION commits or rolls back, store the same committed messages.
Halves the direct path must leave (no transaction id, a batch key, a delay, a timer, the
UNIQ_KEY not first, a resend, a decided transaction, ...) are answered as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.fastpath import (
    BrokerPair,
    broker_pair,
    comparable,
    record_bytes,
    same_record,
    send_to_both,
    sent_by_path,
    single_header,
)
from tests.support.raw import end_header
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.message import (
    MessageConst,
    decode_offset_msg_id,
    properties_to_string,
)

C = MessageConst
MAX_BODY = 300
GROUP = "half-g"


@pytest.fixture
async def pair(make_broker_config: Any) -> AsyncIterator[BrokerPair]:
    async with broker_pair(make_broker_config, max_message_size=MAX_BODY) as p:
        yield p


def stored_directly(b: BrokerController) -> int:
    """Halves ``b`` stored through the direct path (``txmq_send_path_total``)."""
    return sent_by_path(b, "one_half")


def header(
    v2: bool, topic: str, props: str | None, qid: int = 1, sys_flag: int = 4, **more: Any
) -> dict[str, Any]:
    return single_header(GROUP, v2, topic, props, qid, sys_flag, **more)


def half_props(uniq: str, txid: str | None, *extra: tuple[str, str], lead: bool = True) -> str:
    """What the SDK sends for a half: UNIQ_KEY, WAIT, TRAN_MSG, PGROUP, the transaction id."""
    items = [(C.WAIT_STORE_MSG_OK, "true"), (C.TRAN_MSG, "true"), (C.PGROUP, GROUP), *extra]
    if txid is not None:
        items.append((C.TRANSACTION_ID, txid))
    if lead:
        items.insert(0, (C.UNIQ_KEY, uniq))
    else:
        items.append((C.UNIQ_KEY, uniq))
    return properties_to_string(dict(items))


async def send_both(
    pair: BrokerPair, v2: bool, ext: dict[str, Any], body: bytes
) -> tuple[RemotingCommand, bool]:
    """Send to both, compare answers and stored halves; (the fast broker's answer, whether the
    direct path took it)."""
    a, took, off, _ = await send_to_both(pair, v2, ext, body, stored_directly)
    if off is not None:
        same_record(pair, off)
    return a, took


async def end_both(pair: BrokerPair, resp: RemotingCommand, decision: int) -> None:
    eh = end_header(GROUP, resp, decision)
    a, b = await pair.call(RequestCode.END_TRANSACTION, eh.to_ext_fields(), b"")
    assert (a.code, a.remark) == (b.code, b.remark)
    assert a.code == ResponseCode.SUCCESS, a.remark


def table(b: BrokerController) -> dict[str, Any]:
    """The transaction table without what differs between two brokers."""
    return {
        txid: (
            rec.producer_group,
            rec.state,
            rec.batch_key,
            [
                (
                    h.commit_log_offset,
                    h.queue_offset,
                    h.real_topic,
                    h.real_queue_id,
                    h.uniq_key,
                    decode_offset_msg_id(h.offset_msg_id)[1],
                    h.immunity_ms,
                )
                for h in rec.halves
            ],
        )
        for txid, rec in b.core.tx.records.items()
    }


@pytest.mark.parametrize("v2", [True, False], ids=["V2", "V1"])
async def test_the_sdks_half_is_stored_directly_and_commits_the_same(
    pair: BrokerPair, v2: bool
) -> None:
    topic = "half-t"
    variants = [
        lambda u, t: half_props(u, t),
        lambda u, t: half_props(u, t, (C.TAGS, "TagA"), (C.KEYS, "k1 k2")),
        lambda u, t: half_props(u, t, (C.CHECK_IMMUNITY_TIME_IN_SECONDS, "60"), ("é", "Zürich ✓")),
        # the transaction id right after the UNIQ_KEY
        lambda u, t: properties_to_string(
            {C.UNIQ_KEY: u, C.TRANSACTION_ID: t, C.TRAN_MSG: "true", C.PGROUP: GROUP}
        ),
    ]
    answers: list[tuple[RemotingCommand, int]] = []
    n = 0
    for i, make in enumerate(variants):
        for r in range(3):  # later sends of a shape reuse its forms
            n += 1
            txid = f"tx-{v2}-{i}-{r}"
            ext = header(v2, topic, make(f"{n:032X}", txid), qid=n % 4)
            resp, took = await send_both(pair, v2, ext, f"body-{i}-{r}".encode() * 3)
            assert took, make(f"{n:032X}", txid)
            answers.append((resp, 8 if r != 1 else 12))
    # a second half of a pending transaction, sent alone, joins it
    n += 1
    resp, took = await send_both(
        pair, v2, header(v2, topic, half_props(f"{n:032X}", f"tx-{v2}-0-0"), qid=2), b"second"
    )
    assert took
    assert table(pair.fast) == table(pair.generic)
    assert len(pair.fast.core.tx.records[f"tx-{v2}-0-0"].halves) == 2
    for resp, decision in answers:
        await end_both(pair, resp, decision)
    assert table(pair.fast) == table(pair.generic)
    for b in (pair.fast, pair.generic):  # counted in plain integers, folded when read
        snap = b.metrics.snapshot()
        assert snap["txmq_transaction_halves_total"] == 13
        assert snap["txmq_transaction_commits_total"] == 8
        assert snap["txmq_transaction_rollbacks_total"] == 4
    # A consumer reads the same committed messages from both, byte for byte.
    got_a = await pair.clients[0].pull_all(topic)
    got_b = await pair.clients[1].pull_all(topic)
    assert len(got_a) == len(got_b) == 4 * 2 + 1
    assert [comparable(m) for m in got_a] == [comparable(m) for m in got_b]
    for m in got_a:
        assert record_bytes(pair.fast, m.commit_log_offset) == record_bytes(
            pair.generic, m.commit_log_offset
        )
    for q in range(4):
        cq_a, cq_b = pair.fast.store._cqs[(topic, q)], pair.generic.store._cqs[(topic, q)]
        assert [cq_a.entry(i) for i in range(cq_a.max_offset)] == [
            cq_b.entry(i) for i in range(cq_b.max_offset)
        ]


def _left_to_the_generic_path() -> dict[str, tuple[dict[str, Any], bytes]]:
    t = "half-l"
    return {
        "no transaction id": (header(True, t, half_props("A1", None)), b"a"),
        "an empty transaction id": (header(True, t, half_props("A2", "")), b"a"),
        "the UNIQ_KEY not first": (header(True, t, half_props("A3", "tx-3", lead=False)), b"a"),
        "a batch key": (header(True, t, half_props("A4", "tx-4", (C.TXMQ_BATCH_KEY, "b"))), b"a"),
        "a delay": (header(True, t, half_props("A5", "tx-5", (C.DELAY, "3"))), b"a"),
        "a second transaction id": (
            header(True, t, half_props("A6", "tx-6") + f"{C.TRANSACTION_ID}\x01tx-66\x02"),
            b"a",
        ),
        "no TRAN_MSG": (
            header(True, t, properties_to_string({C.UNIQ_KEY: "A7", C.TRANSACTION_ID: "tx-7"})),
            b"a",
        ),
        "TRAN_MSG without the flag": (header(True, t, half_props("A8", "tx-8"), sys_flag=0), b"a"),
        "no PGROUP nor header group": (
            {
                **header(True, t, half_props("A9", "tx-9").replace(GROUP, "")),
                "a": "",
            },
            b"a",
        ),
        "a body over maxMessageSize": (
            header(True, t, half_props("A10", "tx-10")),
            b"x" * (MAX_BODY + 1),
        ),
        "a header field as text": ({**header(True, t, half_props("A11", "tx-11")), "e": "1"}, b"a"),
        "a separator in the transaction id": (
            header(True, t, half_props("A12", "tx-12").replace("tx-12", "tx\x0112")),
            b"a",
        ),
        "a queue that does not exist": (header(True, t, half_props("A13", "tx-13"), qid=99), b"a"),
    }


@pytest.mark.parametrize("case", list(_left_to_the_generic_path()))
async def test_halves_the_direct_path_leaves_are_answered_as_before(
    pair: BrokerPair, case: str
) -> None:
    ext, body = _left_to_the_generic_path()[case]
    _resp, took = await send_both(pair, True, ext, body)
    assert not took, f"{case}: the direct path took it"
    assert table(pair.fast) == table(pair.generic)


async def test_a_resent_half_and_a_half_of_a_decided_transaction_are_answered_as_before(
    pair: BrokerPair,
) -> None:
    ext = header(True, "half-r", half_props("B1", "tx-r"))
    first, took = await send_both(pair, True, ext, b"first")
    assert took
    again, took = await send_both(pair, True, ext, b"first")
    assert not took, "a resend was stored directly"
    assert first.ext_fields == again.ext_fields
    assert pair.fast.store._cqs[(pair.fast.core.tx.half_topic, 0)].max_offset == 1
    await end_both(pair, first, 8)
    late, took = await send_both(pair, True, header(True, "half-r", half_props("B2", "tx-r")), b"x")
    assert not took
    assert late.code == ResponseCode.ILLEGAL_OPERATION, late.remark
    assert table(pair.fast) == table(pair.generic)


async def test_transactions_refused_on_the_broker_are_refused_alike(
    make_broker_config: Any,
) -> None:
    async with broker_pair(make_broker_config, reject_transaction_message=True) as pair:
        resp, took = await send_both(
            pair, True, header(True, "half-n", half_props("C1", "tx")), b"a"
        )
        assert not took
        assert resp.code == ResponseCode.NO_PERMISSION, resp.remark


async def test_transactions_refused_at_run_time_are_refused_alike(
    pair: BrokerPair,
) -> None:
    """``rejectTransactionMessage`` changes while the broker runs: a half of a shape the direct
    path knows already is refused from then on, as the generic path refuses it."""
    resp, took = await send_both(
        pair, True, header(True, "half-r", half_props("R1", "tx-r1")), b"a"
    )
    assert took and resp.code == ResponseCode.SUCCESS, resp.remark
    for b in (pair.fast, pair.generic):
        await b.update_config({"rejectTransactionMessage": "true"})
    resp, took = await send_both(
        pair, True, header(True, "half-r", half_props("R2", "tx-r2")), b"b"
    )
    assert not took
    assert resp.code == ResponseCode.NO_PERMISSION, resp.remark

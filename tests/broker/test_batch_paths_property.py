"""The batch fast paths against the generic path, on batches hypothesis makes: plain messages
and transactions' halves with properties in any order, shared or varying around the UNIQ_KEY,
non-ASCII, non-canonical, with a delay, mixed kinds or transactions, bodies over the limit.
Two brokers (``fastPathEnable`` on and off, the same clock) get each batch through the
messaging core -- no socket -- and must answer the same (the same receipts, or the same error)
and store the same bytes; a transaction's commit must store the same messages too."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import BrokerThread
from tests.support.fastpath import batch_body
from txmq.broker.config import BrokerConfig
from txmq.broker.transaction.state import Decision
from txmq.protocol.errors import TxmqError
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    MessageConst,
    MessageSysFlag,
    decode_message,
    properties_to_string,
)

C = MessageConst
#: The bytes of a stored record that differ between two brokers (BORNHOST, STORETIMESTAMP,
#: STOREHOST); the born host and clock are the same here, the store host is not.
_PER_BROKER_BYTES = slice(48, 72)
PEER = ("10.1.2.3", 4567)
MAX_BODY = 256
_ids = itertools.count()


@pytest.fixture
def pair(make_broker_config: Callable[..., BrokerConfig]) -> Iterator[dict[str, BrokerThread]]:
    """``fast`` as shipped and ``generic`` (``fastPathEnable`` off), on one clock."""
    out: dict[str, BrokerThread] = {}
    try:
        for name, fast in (("fast", True), ("generic", False)):
            bt = BrokerThread(
                make_broker_config(
                    fast_path_enable=fast,
                    max_message_size=MAX_BODY,
                    transaction_check_interval=600_000,
                ),
                clock=lambda: 1_800_000_000.0,  # one instant: equal store timestamps
            )
            bt.start()
            out[name] = bt
        yield out
    finally:
        for bt in out.values():
            bt.stop()


# -- what hypothesis makes --------------------------------------------------------------------

_text = st.text(alphabet=st.sampled_from("abcXYZ09-_ é✓"), min_size=0, max_size=6)
_key = st.text(alphabet=st.sampled_from("abcdxyz_"), min_size=1, max_size=5)
_user_props = st.lists(st.tuples(_key, _text), max_size=3)


@st.composite
def batches(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["plain", "plain", "halves", "halves", "mixed"]))
    n = draw(st.integers(1, 6))
    # One or two property shapes shared by the entries (what makes a fast path worth it).
    shapes = []
    for _ in range(draw(st.integers(1, 2))):
        before = draw(_user_props)
        after = draw(_user_props)
        if draw(st.booleans()):
            after.append((C.TAGS, draw(st.sampled_from(["created", "paid", "é"]))))
        if draw(st.booleans()):
            before.append((C.KEYS, "k1 k2"))
        if draw(st.integers(0, 9)) == 0:
            after.append((C.DELAY, "2"))
        shapes.append((before, after))
    txids = [f"tx-{next(_ids)}"]
    if kind != "plain" and draw(st.integers(0, 5)) == 0:
        txids.append(f"tx-{next(_ids)}")  # halves of two transactions: refused
    entries = []
    for i in range(n):
        before, after = shapes[draw(st.integers(0, len(shapes) - 1))]
        half = kind == "halves" or (kind == "mixed" and i % 2 == 1)
        props: list[tuple[str, str]] = []
        uniq = f"{next(_ids):X}".rjust(draw(st.sampled_from([7, 32])), "0")
        if half:
            lead = draw(st.integers(0, 4)) != 0  # the sink's and SDK's order: UNIQ_KEY first
            rest = [
                *after,
                (C.TRAN_MSG, "true"),
                (C.PGROUP, "pg"),
                (C.TRANSACTION_ID, txids[i % len(txids)]),
            ]
            props = (
                [(C.UNIQ_KEY, uniq), *before, *rest]
                if lead
                else [*before, (C.UNIQ_KEY, uniq), *rest]
            )
        else:
            props = [*before, (C.UNIQ_KEY, uniq), *after]
        wire = properties_to_string(dict(props)).encode()
        if draw(st.integers(0, 12)) == 0:
            wire = b"x\x01y\x02\x02" + wire  # not canonical: an empty entry
        body = draw(st.binary(min_size=0, max_size=MAX_BODY + (8 if i == 0 else 0)))
        entries.append((body, draw(st.integers(0, 3)), wire))
    transactional = kind == "halves" or (kind == "mixed" and n > 1 and draw(st.booleans()))
    return {"entries": entries, "transactional": transactional, "qid": draw(st.integers(0, 3))}


# -- the comparison ---------------------------------------------------------------------------

_topics = itertools.count()


def _send(bt: BrokerThread, topic: str, batch: dict[str, Any]) -> Any:
    assert bt.controller is not None
    core = bt.controller.core
    h = SendMessageRequestHeader(
        producer_group="pg",
        topic=topic,
        queue_id=batch["qid"],
        sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE if batch["transactional"] else 0,
        born_timestamp=1_700_000_000_000,
        properties="",
        batch=True,
    )

    async def go() -> Any:
        try:
            await core.topic_for_send(topic, 4)
            return await core.send_batch(h, batch["qid"], batch_body(batch["entries"]), PEER)
        except TxmqError as exc:
            return (type(exc).__name__, str(exc))

    return bt.call(go())


def _stored(bt: BrokerThread, offset: int) -> bytes:
    assert bt.controller is not None
    store = bt.controller.store
    raw = bytearray(bt.run(lambda: store.read_message_bytes(offset)))
    raw[_PER_BROKER_BYTES] = bytes(24)
    return bytes(raw)


def _queue(bt: BrokerThread, topic: str, qid: int) -> list[Any]:
    """The consume-queue entries (commit-log offset, size, tag code) of a queue."""
    assert bt.controller is not None
    store = bt.controller.store

    def read() -> list[Any]:
        cq = store._cqs.get((topic, qid))
        return [] if cq is None else [cq.entry(i) for i in range(cq.max_offset)]

    return list(bt.run(read))


def _commit(bt: BrokerThread, txid: str) -> list[Any]:
    """Commit ``txid``; its committed records (masked) and their consume queues."""
    assert bt.controller is not None
    b = bt.controller

    async def go() -> tuple[list[int], list[tuple[str, int]]]:
        rec = b.transactions.records[txid]
        await b.core.decide(rec, Decision.COMMIT, "producer")
        real = {(h.real_topic, h.real_queue_id) for h in rec.halves}
        offsets = []
        for topic, qid in sorted(real):
            r = b.store.get_messages(topic, qid, 0, 64)
            offsets += [m.commit_log_offset for m in _decode(r.messages)]
        return offsets, sorted(real)

    offsets, queues = bt.call(go())
    return [_stored(bt, o) for o in offsets] + [_queue(bt, *q) for q in queues]


def _decode(raws: list[bytes]) -> list[Any]:
    return [decode_message(r) for r in raws]


def _receipts(outcome: Any) -> Any:
    if isinstance(outcome, tuple):
        return outcome
    return [
        (r.uniq_key, r.queue_id, r.queue_offset, r.transaction_id, r.commit_log_offset)
        for r in outcome.receipts
    ]


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=batches())
def test_both_paths_answer_and_store_the_same(
    pair: dict[str, BrokerThread], batch: dict[str, Any]
) -> None:
    topic = f"prop-{next(_topics)}"
    fast, generic = pair["fast"], pair["generic"]
    a, b = _send(fast, topic, batch), _send(generic, topic, batch)
    assert _receipts(a) == _receipts(b)
    if isinstance(a, tuple):
        return  # refused by both, with the same error
    for ra, rb in zip(a.receipts, b.receipts, strict=True):
        assert _stored(fast, ra.commit_log_offset) == _stored(generic, rb.commit_log_offset)
    stored_in = "RMQ_SYS_TRANS_HALF_TOPIC" if a.receipts[0].transaction_id else topic
    qid = 0 if a.receipts[0].transaction_id else batch["qid"]
    assert _queue(fast, stored_in, qid) == _queue(generic, stored_in, qid)
    txid = a.receipts[0].transaction_id
    if txid is not None:
        assert _commit(fast, txid) == _commit(generic, txid)


def test_the_property_reaches_both_fast_paths(pair: dict[str, BrokerThread]) -> None:
    """The generated batches above are worth something only if the fast paths take some:
    one plain batch and one transaction's halves, as the generator makes them, do."""
    for transactional in (False, True):
        txid = f"tx-{next(_ids)}"
        rest = [(C.TRAN_MSG, "true"), (C.PGROUP, "pg"), (C.TRANSACTION_ID, txid)]
        entries = [
            (
                b"body",
                0,
                properties_to_string(
                    dict([(C.UNIQ_KEY, f"{next(_ids):032X}"), *(rest if transactional else [])])
                ).encode(),
            )
            for _ in range(3)
        ]
        batch = {"entries": entries, "transactional": transactional, "qid": 0}
        _send(pair["fast"], f"prop-{next(_topics)}", batch)
    assert pair["fast"].controller is not None
    snap = pair["fast"].controller.metrics.snapshot()
    assert snap.get("txmq_send_path_total{path=plain}") == 1
    assert snap.get("txmq_send_path_total{path=halves}") == 1

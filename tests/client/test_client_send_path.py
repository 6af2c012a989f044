"""The producer's per-send shortcuts put the same bytes on the wire, and read the same answer,
as the typed headers they stand in for."""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.client.helpers import FAST_CLIENT, create_topic
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncProducer,
    AsyncPullConsumer,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    MessageExt,
    SendStatus,
    TransactionListener,
)
from txmq.client.producer import SendResult, _answer_fields, _result
from txmq.client.route import TopicRoute
from txmq.client.transaction import end_transaction_fields
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError
from txmq.protocol.frame import encode_frame
from txmq.protocol.headers import EndTransactionRequestHeader, SendMessageResponseHeader
from txmq.protocol.message import create_offset_msg_id

_names = st.text(string.ascii_letters + string.digits + "_-%|", min_size=1, max_size=40)
_props = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), max_size=60
)


def _plain_fields(
    p: AsyncProducer, topic: str, qid: int, props: str, sys_flag: int, flag: int, batch: bool
) -> tuple[dict[str, Any], int]:
    """The fields the typed header gives, with the born timestamp to put in them."""
    header = p._header(
        Message(topic, b"x", flag=flag), TopicRoute(topic, 1, 1), qid, props, sys_flag
    )
    header.batch = batch
    return header.to_v2_ext_fields(), header.born_timestamp


@settings(max_examples=300, deadline=None)
@given(
    group=_names,
    topics=st.lists(_names, min_size=1, max_size=3),
    qid=st.integers(-1, 1 << 20),
    props=_props,
    sys_flag=st.integers(0, (1 << 31) - 1),
    flag=st.integers(-(1 << 31), (1 << 31) - 1),
    batch=st.booleans(),
    serialize=st.sampled_from(list(SerializeType)),
)
def test_send_fields_from_the_template_encode_as_the_typed_header(
    group: str,
    topics: list[str],
    qid: int,
    props: str,
    sys_flag: int,
    flag: int,
    batch: bool,
    serialize: SerializeType,
) -> None:
    p = AsyncProducer(group, config=FAST_CLIENT)
    for topic in topics * 2:  # the second round reads the cached templates
        fast = p._v2_fields(topic, qid, props, sys_flag, flag, batch)
        plain, _ = _plain_fields(p, topic, qid, props, sys_flag, flag, batch)
        plain["g"] = fast["g"]  # the born timestamp: read from the clock by each
        assert list(fast.items()) == list(plain.items())
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        a = RemotingCommand(code, 7, ext_fields=fast, body=b"body", serialize_type=serialize)
        b = RemotingCommand.request(code, plain, b"body", serialize_type=serialize)
        b.opaque = 7
        assert encode_frame(a) == encode_frame(b)


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 40), 1 << 40),
    st.text(max_size=8),
    st.sampled_from(["", "12", "-3", "true", "0A0B"]),
)


@settings(max_examples=500, deadline=None)
@given(
    ext=st.dictionaries(
        st.sampled_from(["msgId", "queueId", "queueOffset", "transactionId", "batchUniqId"]),
        _values,
    )
)
def test_send_answer_read_without_the_header_matches_the_header(ext: dict[str, Any]) -> None:
    fast = _answer_fields(ext)
    try:
        h = SendMessageResponseHeader.from_ext_fields(ext)
    except InvalidParameterError:
        assert fast is None
        return
    if fast is not None:
        assert fast == (h.msg_id, h.queue_id, h.queue_offset, h.transaction_id)


def _result_by_header(resp: RemotingCommand, topic: str, ids: list[str], broker: str) -> SendResult:
    """What the answer reads as through the typed header (the plain path)."""
    h = SendMessageResponseHeader.from_ext_fields(resp.ext_fields)
    return SendResult(
        status=SendStatus.SEND_OK,
        msg_id=",".join(ids),
        offset_msg_id=h.msg_id,
        topic=topic,
        queue_id=h.queue_id,
        queue_offset=h.queue_offset,
        transaction_id=h.transaction_id,
        msg_ids=list(ids),
        offset_msg_ids=[i for i in h.msg_id.split(",") if i] if h.msg_id else [],
        broker_name=broker,
    )


async def test_broker_stores_and_answers_the_shortcut_as_the_typed_header(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    """A send built from the template and one built from the typed header, to a real broker:
    the same stored message, and each answer reads the same either way."""
    topic = unique("send-path")
    await create_topic(broker.address, topic, queues=2)
    async with (
        AsyncProducer(unique("g"), broker.address, config=FAST_CLIENT) as p,
        AsyncPullConsumer(unique("c"), broker.address, config=FAST_CLIENT) as c,
    ):
        route = await p._route_for(topic)
        for i, (msg, sys_flag) in enumerate(
            [
                (Message(topic, b"plain"), 0),
                (Message(topic, b"tagged", tags="t", keys="k1 k2", flag=5), 0),
                (Message(topic, b"props", properties={"a": "1", "b": "2"}), 0),
            ]
        ):
            # Each its own UNIQ_KEY: the broker's duplicate window would answer the second
            # send of one id without storing it.
            for path, uniq in (("fast", f"{2 * i:032X}"), ("plain", f"{2 * i + 1:032X}")):
                props = p._wire_string(msg, uniq, None)
                if path == "fast":
                    cmd = p._send_command(msg, route, 0, props, sys_flag=sys_flag)
                else:
                    header = p._header(msg, route, 0, props, sys_flag)
                    cmd = RemotingCommand.request(
                        RequestCode.SEND_MESSAGE_V2, header.to_v2_ext_fields(), msg.payload
                    )
                resp = await p.connection.request(cmd, 3.0)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                ids = [uniq]
                assert _result(resp, topic, ids, SendStatus.SEND_OK, "b") == _result_by_header(
                    resp, topic, ids, "b"
                )
        stored: list[Any] = []
        for _ in range(50):  # bounded: six messages, read a few at a time
            pr = await c.pull(topic, 0, len(stored), max_nums=6)
            stored += pr.messages
            if len(stored) >= 6:
                break
        assert len(stored) == 6, f"queue 0 holds {len(stored)} of the 6 messages sent"
        pulled = [stored[k : k + 2] for k in range(0, 6, 2)]
        for a, b in pulled:
            pa, pb = dict(a.properties), dict(b.properties)
            assert int(pa.pop("UNIQ_KEY"), 16) + 1 == int(pb.pop("UNIQ_KEY"), 16)
            assert (a.body, a.flag, a.sys_flag, pa) == (b.body, b.flag, b.sys_flag, pb)
            assert a.queue_offset + 1 == b.queue_offset


async def test_round_robin_sends_and_batches_through_the_shortcuts(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("send-rr")
    await create_topic(broker.address, topic, queues=4)
    async with AsyncProducer(unique("g"), broker.address, config=FAST_CLIENT) as p:
        results = [await p.send(Message(topic, b"m%d" % i)) for i in range(8)]
        batch = await p.send_batch([Message(topic, b"b%d" % i) for i in range(3)], queue_id=1)
    assert sorted(r.queue_id for r in results) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(r.status is SendStatus.SEND_OK and r.msg_ids == [r.msg_id] for r in results)
    assert all(r.offset_msg_ids == [r.offset_msg_id] for r in results)
    assert batch.queue_id == 1 and len(batch.offset_msg_ids) == 3 and len(batch.msg_ids) == 3
    assert batch.msg_id == ",".join(batch.msg_ids)


_prop_text = st.text(
    st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12
)  # separators included: both ways must refuse them alike
_extra_keys = st.one_of(
    st.sampled_from(
        ["TRAN_MSG", "PGROUP", "__transactionId__", "UNIQ_KEY", "WAIT", "TAGS", "KEYS", "DELAY"]
    ),
    _prop_text,
)


@settings(max_examples=500, deadline=None)
@given(
    tags=st.one_of(st.none(), st.just(""), _prop_text),
    keys=st.one_of(st.none(), _prop_text),
    user=st.dictionaries(_prop_text, _prop_text, max_size=2),
    delay=st.sampled_from([0, 0, 3]),
    extra=st.one_of(st.none(), st.dictionaries(_extra_keys, _prop_text, max_size=4)),
)
def test_wire_properties_shortcuts_match_the_general_writer(
    tags: str | None,
    keys: str | None,
    user: dict[str, str],
    delay: int,
    extra: dict[str, str] | None,
) -> None:
    from txmq.protocol.message import properties_to_string

    p = AsyncProducer("g", config=FAST_CLIENT)
    msg = Message("t", b"x", tags=tags, keys=keys, properties=user, delay_level=delay)
    uniq = "0A0B0C0D0E0F00000000000000000001"

    def outcome(f: Callable[[], str]) -> object:
        try:
            return f()
        except Exception as exc:  # noqa: BLE001 - compared, not swallowed
            return ("error", str(exc))

    fast = outcome(lambda: p._wire_string(msg, uniq, extra))
    plain = outcome(lambda: properties_to_string(p._wire_properties(msg, uniq, extra)))
    if isinstance(plain, tuple):  # refused: the shortcut refuses too (tags/keys: in its words)
        assert isinstance(fast, tuple)
    else:
        assert fast == plain


@settings(max_examples=200, deadline=None)
@given(
    group=_names,
    queue_offset=st.integers(0, 1 << 40),
    commit_log_offset=st.integers(0, 1 << 50),
    state=st.sampled_from(list(LocalTransactionState)),
    from_check=st.booleans(),
    txid=st.one_of(st.none(), st.just(""), _names),
    half_txid=st.one_of(st.none(), _names),
)
def test_end_transaction_fields_match_the_typed_header(
    group: str,
    queue_offset: int,
    commit_log_offset: int,
    state: LocalTransactionState,
    from_check: bool,
    txid: str | None,
    half_txid: str | None,
) -> None:
    offset_id = create_offset_msg_id(("10.1.2.3", 10911), commit_log_offset)
    half = SendResult(
        SendStatus.SEND_OK, "A" * 32, offset_id, "t", 1, queue_offset, half_txid, ["A" * 32]
    )
    fast = end_transaction_fields(group, half, state, from_check, txid)
    plain = EndTransactionRequestHeader(
        producer_group=group,
        tran_state_table_offset=queue_offset,
        commit_log_offset=commit_log_offset,
        commit_or_rollback=state.wire_value,
        from_transaction_check=from_check,
        msg_id=half.msg_id,
        transaction_id=txid or half_txid or half.msg_id,
    ).to_ext_fields()
    assert list(fast.items()) == list(plain.items())
    for st_ in SerializeType:
        a = RemotingCommand(
            int(RequestCode.END_TRANSACTION), 3, ext_fields=fast, serialize_type=st_
        )
        b = RemotingCommand.request(RequestCode.END_TRANSACTION, plain, serialize_type=st_)
        b.opaque = 3
        assert encode_frame(a) == encode_frame(b)


async def test_transactions_commit_and_roll_back_through_the_shortcuts(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("send-tx")
    await create_topic(broker.address, topic, queues=2)

    class Listener(TransactionListener):
        def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
            return LocalTransactionState(arg)

        def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.ROLLBACK_MESSAGE

    async with (
        AsyncTransactionProducer(unique("tx"), Listener(), broker.address, config=FAST_CLIENT) as p,
        AsyncPullConsumer(unique("c"), broker.address, config=FAST_CLIENT) as c,
    ):
        for i in range(4):
            async with p.transaction() as txn:
                await txn.send(Message(topic, b"c%d" % i, tags="t" if i % 2 else None))
        with pytest.raises(RuntimeError):
            async with p.transaction() as txn:
                await txn.send(Message(topic, b"rolled back"))
                raise RuntimeError("local failure")
        one = await p.send_message_in_transaction(
            Message(topic, b"one"), LocalTransactionState.COMMIT_MESSAGE
        )
        assert one.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
        bodies: list[bytes] = []
        for q in range(2):  # a commit is answered once its messages are stored
            bodies += [m.body for m in (await c.pull(topic, q, 0, max_nums=32)).messages]
    assert sorted(bodies) == sorted([b"c0", b"c1", b"c2", b"c3", b"one"])


class _Checked(Message):
    """A Message the shortcut of validate_message does not take: the full checks run."""


@settings(max_examples=400, deadline=None)
@given(
    topic=st.one_of(_names, st.just(""), st.just("bad topic"), st.text(max_size=5)),
    body=st.one_of(st.binary(max_size=20), st.text(max_size=5), st.just(b"x" * 40)),
    tags=st.one_of(st.none(), _prop_text),
    msg_id=st.one_of(st.none(), st.just(""), _names),
    props=st.dictionaries(_prop_text, _prop_text, max_size=1),
    delay=st.integers(-2, 3),
)
def test_validation_shortcut_accepts_only_what_the_full_checks_accept(
    topic: str,
    body: bytes | str,
    tags: str | None,
    msg_id: str | None,
    props: dict[str, str],
    delay: int,
) -> None:
    from txmq.client._validation import validate_message

    def outcome(m: Message) -> object:
        try:
            validate_message(m, 32)
        except Exception as exc:  # noqa: BLE001 - compared, not swallowed
            return (type(exc), str(exc))
        return None

    fields = dict(tags=tags, msg_id=msg_id, properties=props, delay_level=delay)
    full = outcome(_Checked(topic, body, **fields))  # type: ignore[arg-type]
    for _ in range(2):  # the second time the topic is known valid (if it is)
        assert outcome(Message(topic, body, **fields)) == full  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    msgs=st.lists(
        st.builds(
            Message,
            topic=st.just("t"),
            body=st.binary(min_size=1, max_size=8),
            tags=st.one_of(st.none(), _prop_text),
            properties=st.dictionaries(_prop_text, _prop_text, max_size=1),
            flag=st.integers(0, 9),
            delay_level=st.sampled_from([0, 0, 0, 2]),
        ),
        min_size=1,
        max_size=5,
    ),
    extra=st.one_of(st.none(), st.dictionaries(_extra_keys, _prop_text, max_size=3)),
)
def test_batch_entries_carry_the_properties_the_general_writer_gives(
    msgs: list[Message], extra: dict[str, str] | None
) -> None:
    from txmq.client._validation import validate_message
    from txmq.protocol.message import BatchBody

    p = AsyncProducer("g", config=FAST_CLIENT)
    ids = [f"{i:032X}" for i in range(len(msgs))]

    def plain() -> bytes:
        batch = BatchBody()
        for m, uniq in zip(msgs, ids, strict=True):
            validate_message(m, p.config.max_message_size)
            props = p._wire_string(m, uniq, extra)  # per message, as batches were written
            batch.add(m.payload, props.encode("utf-8"), m.flag)
        return batch.encode()

    def outcome(f: Callable[[], bytes]) -> object:
        try:
            return f()
        except Exception as exc:  # noqa: BLE001 - compared, not swallowed
            return ("error", type(exc))

    fast = outcome(lambda: p._batch_body(msgs, ids, extra, allow_delay=True).encode())
    assert fast == outcome(plain)

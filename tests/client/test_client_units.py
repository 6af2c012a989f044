"""Pure parts of the SDK: allocation, offsets bookkeeping, validation, configuration, layering."""

from __future__ import annotations

import ast
import pathlib
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

import txmq.client as client
from txmq.client import ClientConfig, ConsumeFrom, InvalidMessageError, Message
from txmq.client._validation import validate_message, validate_topic
from txmq.client.config import parse_address
from txmq.client.consumer import ProcessQueue, allocate_averagely, parse_consume_from
from txmq.client.producer import _plain_properties
from txmq.protocol.errors import ProtocolError
from txmq.protocol.message import MessageConst, MessageExt, properties_to_string

CLIENT_DIR = pathlib.Path(client.__file__).parent


def test_public_names() -> None:
    for name in (
        "Producer",
        "AsyncProducer",
        "PushConsumer",
        "AsyncPushConsumer",
        "PullConsumer",
        "AsyncPullConsumer",
        "Message",
        "MessageExt",
        "SendResult",
        "SendStatus",
        "ConsumeFrom",
    ):
        assert name in client.__all__ and hasattr(client, name), name
    assert client.Message is Message and client.MessageExt is MessageExt


def test_the_client_never_imports_the_broker() -> None:
    offenders = []
    for path in CLIENT_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}"
                for n in names
                if n.startswith(("txmq.broker", "txmq.spark_connector", "broker"))
            ]
    assert offenders == []


# --- allocation ---------------------------------------------------------------------------------


def test_allocate_averagely_matches_rocketmq_examples() -> None:
    queues = list(range(8))
    ids = ["a", "b", "c"]
    assert allocate_averagely(queues, ids, "a") == [0, 1, 2]
    assert allocate_averagely(queues, ids, "b") == [3, 4, 5]
    assert allocate_averagely(queues, ids, "c") == [6, 7]
    assert allocate_averagely([0, 1], ids, "c") == []
    assert allocate_averagely([0, 1], ids, "b") == [1]
    assert allocate_averagely(queues, ids, "stranger") == []


@given(st.integers(0, 40), st.integers(1, 12), st.data())
def test_allocate_averagely_partitions_every_queue_once(
    n_queues: int, n_ids: int, data: st.DataObject
) -> None:
    queues = list(range(n_queues))
    ids = sorted(f"c{i}" for i in range(n_ids))
    shares = [allocate_averagely(queues, ids, cid) for cid in ids]
    flat = [q for share in shares for q in share]
    assert sorted(flat) == queues  # each queue exactly once
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    who = data.draw(st.sampled_from(ids))
    share = allocate_averagely(queues, ids, who)
    assert share == sorted(share)  # consecutive blocks


# --- process queue -------------------------------------------------------------------------------


def _msg(offset: int) -> MessageExt:
    return MessageExt(topic="t", body=b"x", queue_offset=offset)


async def test_process_queue_commits_the_smallest_offset_in_flight() -> None:
    pq = ProcessQueue("t", 0, 10)
    assert pq.offset_to_commit() == 10
    pq.add([_msg(10), _msg(11), _msg(12)])
    pq.next_offset = 13
    assert pq.offset_to_commit() == 10
    pq.remove(11, 1000)
    assert pq.offset_to_commit() == 10  # 10 is still being processed
    pq.remove(10, 1000)
    assert pq.offset_to_commit() == 12
    pq.remove(12, 1000)
    assert pq.offset_to_commit() == 13  # empty: the next offset to pull


async def test_process_queue_after_an_offset_jump_backwards() -> None:
    pq = ProcessQueue("t", 0, 50)
    pq.add([_msg(50), _msg(51)])
    pq.offset_moved(5)
    pq.add([_msg(5)])
    assert pq.offset_to_commit() == 5


async def test_process_queue_idle_tracking() -> None:
    pq = ProcessQueue("t", 0, 0)
    assert pq.idle.is_set()
    pq.begin(2)
    assert not pq.idle.is_set()
    pq.end()
    assert not pq.idle.is_set()
    pq.end()
    assert pq.idle.is_set()


# --- consume_from ---------------------------------------------------------------------------------


def test_parse_consume_from() -> None:
    assert parse_consume_from("last") == (ConsumeFrom.LAST, None)
    assert parse_consume_from("FIRST") == (ConsumeFrom.FIRST, None)
    assert parse_consume_from(ConsumeFrom.FIRST) == (ConsumeFrom.FIRST, None)
    assert parse_consume_from(1_700_000_000_000) == (ConsumeFrom.TIMESTAMP, 1_700_000_000_000)
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_consume_from(when) == (ConsumeFrom.TIMESTAMP, int(when.timestamp() * 1000))
    for bad in ("middle", ConsumeFrom.TIMESTAMP, "timestamp", -5, True, None):
        with pytest.raises(ValueError):
            parse_consume_from(bad)  # type: ignore[arg-type]


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["orders", "a-b_c", "%RETRY%g", "x|y", "A1" * 60])
def test_valid_topics(topic: str) -> None:
    validate_topic(topic)


@pytest.mark.parametrize("topic", ["", "has space", "dot.ted", "slash/", "ü", "x" * 128])
def test_invalid_topics(topic: str) -> None:
    with pytest.raises(InvalidMessageError):
        validate_topic(topic)


def test_message_validation_errors_say_what_is_wrong() -> None:
    limit = 1024
    with pytest.raises(InvalidMessageError, match="empty"):
        validate_message(Message("t", b""), limit)
    with pytest.raises(InvalidMessageError, match="1025 bytes, over the limit of 1024"):
        validate_message(Message("t", b"x" * 1025), limit)
    with pytest.raises(InvalidMessageError, match="reserved for the system"):
        validate_message(Message("t", b"x", properties={"UNIQ_KEY": "mine"}), limit)
    with pytest.raises(InvalidMessageError, match="strings"):
        validate_message(Message("t", b"x", properties={"n": 1}), limit)  # type: ignore[dict-item]
    with pytest.raises(InvalidMessageError, match="control character"):
        validate_message(Message("t", b"x", properties={"a": "b\x01c"}), limit)
    validate_message(Message("t", "text body", tags="a", keys="k1 k2"), limit)
    assert issubclass(InvalidMessageError, ValueError)


# --- configuration --------------------------------------------------------------------------------


def test_client_config_defaults_and_checks() -> None:
    cfg = ClientConfig()
    assert (cfg.request_timeout, cfg.heartbeat_interval, cfg.retry_times_when_send_failed) == (
        3.0,
        30.0,
        2,
    )
    assert (cfg.reconnect_backoff_initial, cfg.reconnect_backoff_max) == (0.1, 5.0)
    assert (cfg.long_poll_timeout, cfg.rebalance_interval, cfg.persist_offset_interval) == (
        15.0,
        20.0,
        5.0,
    )
    assert cfg.replace(pull_batch_size=64).pull_batch_size == 64
    with pytest.raises(ValueError, match="request_timeout"):
        ClientConfig(request_timeout=0)
    with pytest.raises(ValueError, match="pull_batch_size"):
        ClientConfig(pull_batch_size=0)
    with pytest.raises(TypeError):
        client.AsyncProducer("g", no_such_setting=1)


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:10911") == ("127.0.0.1", 10911)
    assert parse_address("[::1]:9876") == ("::1", 9876)
    for bad in ("localhost", ":10911", "host:port", "host:0", "host:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)


@given(
    tags=st.one_of(st.none(), st.text(max_size=8)),
    keys=st.one_of(st.none(), st.text(max_size=8)),
)
def test_plain_properties_match_the_general_encoding(tags: str | None, keys: str | None) -> None:
    """The shortcut for messages without user properties writes exactly what
    ``properties_to_string`` writes for them, and refuses the same separators."""
    msg = Message("t", b"x", tags=tags, keys=keys)
    props = msg.wire_properties()
    props.update({MessageConst.UNIQ_KEY: "ID1", MessageConst.WAIT_STORE_MSG_OK: "true"})
    try:
        general: str | Exception = properties_to_string(props)
    except ProtocolError as exc:
        general = exc
    try:
        plain: str | Exception = _plain_properties(msg, "ID1")
    except InvalidMessageError as exc:
        plain = exc
    if isinstance(general, Exception):
        assert isinstance(plain, InvalidMessageError)
    else:
        assert plain == general

"""FIFO consumer groups with the official RocketMQ 5 Python client (``build/clients/py5``, see
test_grpc_python5.py): the group is made orderly through the broker's admin request
(mqadmin updateSubGroup's UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, here from the txmq admin client);
the client learns it from the broker's settings answer and consumes FIFO; the order of each
message group is kept across redelivery and other message groups are not held up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.compat.test_grpc_fifo import two_message_groups
from tests.compat.test_grpc_python5 import endpoint, py5, run
from tests.conftest import BrokerThread
from tests.support.waiting import wait_until_sync
from txmq.client import AdminClient

pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

__all__ = ["py5"]  # the fixture, imported for this module's tests

QUEUES = 4


@pytest.fixture
def fifo_broker(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, default_topic_queue_nums=QUEUES
    )


def send_groups(py5: Path, bt: BrokerThread, topic: str) -> tuple[str, str]:
    """a1..a4 of message group A and b1..b3 of B (in another queue), interleaved, sent FIFO by
    the stock producer; the two group names."""
    a, b = two_message_groups(QUEUES)
    specs = [("a1", a), ("b1", b), ("a2", a), ("b2", b), ("a3", a), ("b3", b), ("a4", a)]
    sent = run(
        py5,
        op="send",
        endpoint=endpoint(bt),
        topic=topic,
        messages=[{"body": body, "group": group} for body, group in specs],
    )
    assert len(sent["ids"]) == len(specs)
    return a, b


def make_orderly(bt: BrokerThread, group: str) -> None:
    with AdminClient(bt.address) as admin:
        admin.update_group_config(group, orderly=True)
        assert admin.group_config(group)["consumeMessageOrderly"] is True


def of(group_name: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["group"] == group_name]


def consume_seven(
    py5: Path, bt: BrokerThread, topic: str, group: str, op: str, *, orderly: bool, **args: Any
) -> tuple[dict[str, Any], str, str]:
    """The two message groups of :func:`send_groups` sent to ``topic`` (``group`` made orderly
    when ``orderly``), then the client's ``op`` consuming the 7 messages as ``group`` (``args``:
    the op's other arguments): its result and the two message groups."""
    a, b = send_groups(py5, bt, topic)
    if orderly:
        make_orderly(bt, group)
    out = run(
        py5, op=op, endpoint=endpoint(bt), topic=topic, group=group, count=7, timeout=45, **args
    )
    return out, a, b


def test_simple_consumer_keeps_each_message_group_in_order_across_redelivery(
    fifo_broker: BrokerThread, py5: Path
) -> None:
    topic, group = "py5-fifo-simple", "py5-fifo-simple-g"
    # one message per receive; a2's first delivery is not acked (invisible 4 s)
    out, a, b = consume_seven(
        py5,
        fifo_broker,
        topic,
        group,
        "fifo_receive",
        orderly=True,
        batch=1,
        skip_once=["a2"],
        invisible_s=4,
    )
    log = out["deliveries"]
    first_a2 = log.index({"body": "a2", "group": a, "attempt": 1, "acked": False})
    again_a2 = log.index({"body": "a2", "group": a, "attempt": 2, "acked": True})
    # nothing of group A between a2's first delivery and its redelivery
    assert of(a, log[first_a2 + 1 : again_a2]) == [], log
    # group A handled in send order, a2 on its second delivery
    assert [(r["body"], r["attempt"]) for r in of(a, log) if r["acked"]] == [
        ("a1", 1),
        ("a2", 2),
        ("a3", 1),
        ("a4", 1),
    ], log
    # group B not held up: all of it handled in order, before a2 came back
    b_rows = of(b, log)
    assert [(r["body"], r["acked"]) for r in b_rows] == [
        ("b1", True),
        ("b2", True),
        ("b3", True),
    ], log
    assert max(log.index(r) for r in b_rows) < again_a2, log


def test_push_consumer_of_an_orderly_group_consumes_fifo(
    fifo_broker: BrokerThread, py5: Path
) -> None:
    topic, group = "py5-fifo-push", "py5-fifo-push-g"
    out, a, b = consume_seven(
        py5, fifo_broker, topic, group, "push", orderly=True, fail_once=["a2"]
    )
    assert out["fifo"] is True  # told by the broker: the client's settings did not ask
    handled = out["handled"]
    # a2 failed once and was handled again before a3: the order of group A is kept
    assert [(r["body"], r["failed"]) for r in of(a, handled)] == [
        ("a1", False),
        ("a2", True),
        ("a2", False),
        ("a3", False),
        ("a4", False),
    ], handled
    assert [(r["body"], r["failed"]) for r in of(b, handled)] == [
        ("b1", False),
        ("b2", False),
        ("b3", False),
    ], handled

    def committed() -> int:
        assert fifo_broker.controller is not None
        return sum(fifo_broker.controller.offsets.offsets(group, topic).values())

    # every message acked: the group's committed offsets cover all 7
    wait_until_sync(lambda: fifo_broker.run(committed) == 7, 10, "all 7 messages acked")


def test_push_consumer_of_a_group_that_is_not_orderly_is_told_fifo_false(
    fifo_broker: BrokerThread, py5: Path
) -> None:
    topic, group = "py5-fifo-plain", "py5-plain-g"
    out, _, _ = consume_seven(py5, fifo_broker, topic, group, "push", orderly=False)
    assert out["fifo"] is False
    assert sorted(m["body"] for m in out["messages"]) == [
        "a1",
        "a2",
        "a3",
        "a4",
        "b1",
        "b2",
        "b3",
    ]

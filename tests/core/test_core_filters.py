"""The read side's filters, as every front end's reads apply them: a tag expression keeps the
messages of its tags, a SQL92 expression the messages whose properties match, SQL92 is refused
(not read as a tag) when property filtering is off, and a POP receive skips what its filter
leaves out as consumed."""

from __future__ import annotations

import pytest

from tests.support.core import CoreHarness, message
from txmq.broker.messaging.read import (
    EVERYTHING,
    FilterNotServedError,
    FilterSyntaxError,
    ReadFilter,
    read_filter,
)
from txmq.protocol.message import decode_messages

TOPIC = "Events"
GROUP = "readers"


async def _pulled(h: CoreHarness, f: ReadFilter) -> list[bytes]:
    r = await h.core.reads.pull(GROUP, TOPIC, 0, 0, 32, f)
    return [m.body for m in decode_messages(r.joined)]


async def _tagged(h: CoreHarness) -> None:
    await h.send(
        message(TOPIC, b"created", tags="created", amount="3", region="eu"),
        message(TOPIC, b"paid", tags="paid", amount="12", region="eu"),
        message(TOPIC, b"shipped", tags="shipped", amount="40", region="us"),
        message(TOPIC, b"untagged", amount="7"),
    )


async def test_a_tag_expression_keeps_its_tags(harness: CoreHarness) -> None:
    await _tagged(harness)

    assert await _pulled(harness, read_filter("TAG", "paid || shipped", True)) == [
        b"paid",
        b"shipped",
    ]
    assert await _pulled(harness, read_filter("TAG", "created", True)) == [b"created"]
    assert await _pulled(harness, read_filter(None, "*", True)) == [
        b"created",
        b"paid",
        b"shipped",
        b"untagged",
    ]
    assert read_filter("TAG", "*", True) is EVERYTHING


async def test_a_sql92_expression_keeps_the_matching_properties(harness: CoreHarness) -> None:
    await _tagged(harness)

    f = read_filter("SQL92", "amount > 5 AND region = 'eu'", True)

    assert await _pulled(harness, f) == [b"paid"]
    assert await _pulled(harness, read_filter("SQL92", "amount BETWEEN 1 AND 10", True)) == [
        b"created",
        b"untagged",
    ]


def test_sql92_is_refused_when_property_filtering_is_off() -> None:
    with pytest.raises(FilterNotServedError, match="enablePropertyFilter"):
        read_filter("SQL92", "amount > 5", False)
    with pytest.raises(FilterNotServedError):
        read_filter("REGEX", "a.*", True)


def test_a_sql92_expression_that_does_not_compile_is_refused() -> None:
    with pytest.raises(FilterSyntaxError):
        read_filter("SQL92", "amount >", True)


async def test_a_pop_receive_skips_what_its_filter_leaves_out(harness: CoreHarness) -> None:
    await _tagged(harness)

    got = await harness.core.pop.receive(
        GROUP,
        TOPIC,
        batch=10,
        invisible_ms=30_000,
        poll_s=0,
        filter=read_filter("TAG", "shipped", True),
        stopping=lambda: False,
    )

    assert [d.message.body for d in got] == [b"shipped"]
    # the two before it were filtered out: consumed as far as the group's offset goes
    assert harness.offsets.query(GROUP, TOPIC, 0) == 2
    harness.core.pop.ack(GROUP, TOPIC, [got[0].handle], [""])
    assert harness.offsets.query(GROUP, TOPIC, 0) == 4

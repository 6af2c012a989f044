"""Listings too large for one answer: transactions, topics, consumer groups, key queries and
dead-lettered messages are listed a page at a time with a cursor, and an answer that would pass
the frame limit is refused with an error naming the limit, the connection kept."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.broker.test_admin_commands import _dead_letter
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.broker.store import TopicConfig
from txmq.broker.store.subscription_group import SubscriptionGroupConfig
from txmq.client.admin import AsyncAdminClient
from txmq.client.dlq import iter_dlq, read_dlq, read_dlq_page
from txmq.protocol.aio import ANSWER_BODY_LIMIT
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import InvalidParameterError, TxmqError
from txmq.protocol.fastjson import loads
from txmq.protocol.message import MessageConst

#: How long one command may take (a loaded machine, a cold interpreter).
CLI_TIMEOUT = 60.0


async def cli(*args: str) -> tuple[str, str]:
    """``txmq ARGS`` in a process of its own; what it printed on stdout and on stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "txmq", *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=CLI_TIMEOUT)
    assert proc.returncode == 0, (args, out.decode(), err.decode())
    return out.decode(), err.decode()


async def _pending(c: RawClient, n: int, group: str) -> None:
    """``n`` transactions of one half each, left undecided."""
    for _ in range(n):
        half = await c.send("orders", b"x" * 100, group=group, transactional=True)
        assert half.code == ResponseCode.SUCCESS, half.remark


async def test_transactions_are_listed_page_by_page_each_once_oldest_first(
    broker: BrokerController,
) -> None:
    async with connected(broker.address) as c:
        await _pending(c, 230, "shop")
        await _pending(c, 7, "other")
    async with AsyncAdminClient(broker.address) as admin:
        pages: list[list[str]] = []
        after = None
        while True:
            page, after = await admin.list_transactions_page(group="shop", limit=50, after=after)
            pages.append([t["transactionId"] for t in page])
            if after is None:
                break
        assert [len(p) for p in pages] == [50, 50, 50, 50, 30]
        listed = [t for p in pages for t in p]
        assert len(set(listed)) == 230, "a transaction listed twice or missed"
        every = await admin.list_transactions(group="shop", limit=10_000)
        assert [t["transactionId"] for t in every] == listed
        offsets = [t["halves"][0]["commitLogOffset"] for t in every]
        assert offsets == sorted(offsets), "not oldest first"
        assert len(await admin.list_transactions(limit=100_000)) == 237
        assert len(await admin.list_transactions(group="shop", limit=120)) == 120
        # A transaction decided between two pages moves no other across the cursor.
        first, cursor = await admin.list_transactions_page(group="shop", limit=10)
        await admin.force_decide(first[3]["transactionId"], False, "test")
        rest, _ = await admin.list_transactions_page(group="shop", limit=1000, after=cursor)
        assert [t["transactionId"] for t in rest] == listed[10:]
        with pytest.raises(InvalidParameterError, match="cursor"):
            await admin.list_transactions_page(after="not-a-cursor")


async def test_an_answer_past_the_frame_limit_is_an_error_naming_it(
    broker: BrokerController,
) -> None:
    """Sixteen 1 MiB messages under one key: the query's answer would be 16 MiB."""
    async with connected(broker.address) as c:
        body = b"m" * (1024 * 1024)
        for _ in range(16):
            r = await c.send("big", body, props={MessageConst.KEYS: "same-key"})
            assert r.code == ResponseCode.SUCCESS, r.remark
    async with AsyncAdminClient(broker.address, timeout=30.0) as admin:

        async def all_indexed() -> bool:
            try:
                found = await admin.query_messages("big", "same-key", max_num=1)
            except TxmqError:  # busy: the index is not there yet
                return False
            return found.index_last_update_phy_offset >= broker.store.max_phy_offset

        await wait_until(all_indexed, 30, "the key indexed")
        with pytest.raises(TxmqError, match=f"more than the {ANSWER_BODY_LIMIT} bytes"):
            await admin.query_messages("big", "same-key", max_num=64)
        # The connection stays and answers the next request.
        assert len((await admin.query_messages("big", "same-key", max_num=4)).messages) == 4


# --- topics, groups, key queries and dead-lettered messages page too --------------------------


def _many_topics(broker: BrokerController, n: int, prefix: str = "t") -> list[str]:
    """``n`` topics put straight into the broker's table (creating them one request at a time
    would write the table ``n`` times)."""
    names = [f"{prefix}{i:06d}" for i in range(n)]
    for name in names:
        broker.ctx.topics.table.put(TopicConfig(name))
    return names


async def test_topics_are_listed_page_by_page_each_once(broker: BrokerController) -> None:
    names = set(_many_topics(broker, 5000))
    every = set(broker.ctx.topics.all())
    async with AsyncAdminClient(broker.address) as admin:
        listed: list[str] = []
        sizes = []
        after = None
        while True:
            page, after = await admin.list_topics_page(limit=700, after=after)
            listed += page
            sizes.append(len(page))
            if after is None:
                break
        assert len(listed) == len(set(listed)) == len(every), "a topic listed twice or missed"
        assert set(listed) == every and names <= every
        assert listed == sorted(listed), "not by name"
        assert sizes[:-1] == [700] * (len(sizes) - 1) and 0 < sizes[-1] <= 700
        assert set(await admin.list_topics()) == every
        assert [n async for n, _ in admin.iter_topics(page=999)] == listed
        # a cursor is a position: topics created or deleted between pages move no other
        first, cursor = await admin.list_topics_page(limit=10, after="t000000")
        assert list(first) == [f"t{i:06d}" for i in range(1, 11)] and cursor == "t000010"
        await admin.delete_topic("t000004")
        await admin.create_topic("a-new-topic-before-the-cursor")
        rest, _ = await admin.list_topics_page(limit=10_000, after=cursor)
        assert list(rest) == listed[listed.index("t000010") + 1 :]
        with pytest.raises(InvalidParameterError, match="limit"):
            await admin.list_topics_page(limit=0)


async def test_a_topic_listing_past_the_frame_limit_pages_or_is_refused(
    broker: BrokerController,
) -> None:
    """A stock client asks for every topic in one answer: past the frame limit it gets an error
    naming the limit (the connection stays); the SDK pages and gets them all."""
    _many_topics(broker, 45_000, prefix="long-" * 22)  # 116 characters: about 370 bytes each
    c = await RawClient.connect(broker.address)
    try:
        whole = await c.call(RequestCode.GET_ALL_TOPIC_CONFIG, {})
        assert whole.code == ResponseCode.SYSTEM_ERROR
        assert f"more than the {ANSWER_BODY_LIMIT} bytes" in (whole.remark or "")
        small = await c.call(RequestCode.GET_ALL_TOPIC_CONFIG, {"after": "", "limit": 3})
        assert small.code == ResponseCode.SUCCESS and small.ext_fields["nextCursor"]
    finally:
        await c.close()
    async with AsyncAdminClient(broker.address, timeout=30.0) as admin:
        assert len(await admin.list_topics()) == len(broker.ctx.topics.all())


async def test_groups_are_listed_page_by_page_each_once(broker: BrokerController) -> None:
    for i in range(5000):
        broker.ctx.groups.put(SubscriptionGroupConfig(f"g{i:05d}"))
    broker.ctx.offsets.commit("offsets-only", "orders", 0, 1)  # a group known by its offsets
    async with AsyncAdminClient(broker.address) as admin:
        listed: list[str] = []
        after = None
        while True:
            page, after = await admin.list_groups_page(limit=600, after=after)
            listed += page
            assert all(cfg["groupName"] == name for name, cfg in page.items())
            if after is None:
                break
        assert len(listed) == len(set(listed)) == 5001
        assert listed == sorted(listed) and "offsets-only" in listed
        assert await admin.consumer_groups() == listed
        assert [n async for n, _ in admin.iter_groups(page=1234)] == listed
    # a stock client's request (no cursor) is answered whole, as before
    c = await RawClient.connect(broker.address)
    try:
        whole = await c.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {})
        assert whole.code == ResponseCode.SUCCESS and "nextCursor" not in whole.ext_fields
        assert len(loads(whole.body)["subscriptionGroupTable"]) == 5001
    finally:
        await c.close()


async def _indexed(admin: AsyncAdminClient, broker: BrokerController, topic: str, key: str) -> None:
    async def caught_up() -> bool:
        try:
            found = await admin.query_messages(topic, key, max_num=1)
        except TxmqError:  # busy: the index is not there yet
            return False
        return found.index_last_update_phy_offset >= broker.store.max_phy_offset

    await wait_until(caught_up, what=f"key {key} indexed", timeout=60)


async def test_a_key_query_pages_through_every_match_newest_first(
    broker: BrokerController,
) -> None:
    c = await RawClient.connect(broker.address)
    try:
        ids = []
        for i in range(5000):
            props = {MessageConst.KEYS: "customer-7" if i % 5 else "customer-7 other"}
            sent = await c.send("orders", f"m{i}".encode(), props=props, queue_id=i % 4)
            assert sent.code == ResponseCode.SUCCESS, sent.remark
            ids.append(sent.ext_fields["msgId"])
        await c.send("orders", b"not this one", props={MessageConst.KEYS: "customer-8"})
    finally:
        await c.close()
    async with AsyncAdminClient(broker.address, timeout=30.0) as admin:
        await _indexed(admin, broker, "orders", "customer-7")
        bodies: list[bytes] = []
        after = None
        pages = 0
        while True:
            result, after = await admin.query_messages_page(
                "orders", "customer-7", limit=64, after=after
            )
            bodies += [m.body for m in result.messages]
            pages += 1
            if after is None:
                break
        assert pages == -(-5000 // 64)
        assert bodies == [f"m{i}".encode() for i in reversed(range(5000))], "newest first, once"
        every = [m.body async for m in admin.iter_messages("orders", "customer-7", page=50)]
        assert every == bodies
        assert len([m async for m in admin.iter_messages("orders", "other")]) == 1000
        # a stock client's query: the maxNum newest in one answer, no cursor
        plain = await admin.query_messages("orders", "customer-7", max_num=64)
        assert [m.body for m in plain.messages] == bodies[:64]
        with pytest.raises(InvalidParameterError, match="cursor"):
            await admin.query_messages_page("orders", "customer-7", after="x")


async def test_a_key_query_page_stops_at_about_four_mebibytes(broker: BrokerController) -> None:
    c = await RawClient.connect(broker.address)
    try:
        for i in range(12):
            body = bytes([i]) * (1024 * 1024)
            r = await c.send("big", body, props={MessageConst.KEYS: "same-key"})
            assert r.code == ResponseCode.SUCCESS, r.remark
    finally:
        await c.close()
    async with AsyncAdminClient(broker.address, timeout=30.0) as admin:
        await _indexed(admin, broker, "big", "same-key")
        firsts: list[int] = []
        sizes = []
        after = None
        while True:
            result, after = await admin.query_messages_page("big", "same-key", after=after)
            firsts += [m.body[0] for m in result.messages]
            sizes.append(len(result.messages))
            if after is None:
                break
        assert firsts == list(reversed(range(12)))
        assert max(sizes) == 4, sizes


async def test_dead_lettered_messages_are_listed_page_by_page(broker: BrokerController) -> None:
    c = await RawClient.connect(broker.address)
    try:
        ids = [await _dead_letter(c, "payments", f"p{i}".encode(), "settlers") for i in range(600)]
    finally:
        await c.close()
    listed: list[str] = []
    after = None
    while True:
        page, after = await read_dlq_page("settlers", broker.address, limit=70, after=after)
        listed += [m.msg_id for m in page]
        if after is None:
            break
    assert listed == ids, "every dead-lettered message once, oldest first"
    assert [m.msg_id async for m in iter_dlq("settlers", broker.address, page=250)] == ids
    assert len(await read_dlq("settlers", broker.address, limit=100)) == 100
    assert await read_dlq_page("nobody", broker.address) == ([], None)
    with pytest.raises(ValueError, match="cursor"):
        await read_dlq_page("settlers", broker.address, after="nonsense")


async def test_the_cli_lists_a_page_and_says_where_the_next_starts(
    broker: BrokerController,
) -> None:
    _many_topics(broker, 30, prefix="cli-")
    addr = broker.address
    shown, more = await cli("topic", "list", "--all", "--limit", "10", "-o", "json", "-b", addr)
    first = json.loads(shown)
    assert len(first) == 10 and more.startswith("more: --cursor ")
    cursor = more.split()[-1]
    shown, more = await cli("topic", "list", "--all", "--cursor", cursor, "-o", "json", "-b", addr)
    rest = json.loads(shown)
    assert more == "" and not set(first) & set(rest)
    every, _ = await cli("topic", "list", "--all", "-o", "json", "-b", addr)
    assert sorted(json.loads(every)) == sorted({**first, **rest})
    assert len(json.loads(every)) == len(broker.ctx.topics.all())

    c = await RawClient.connect(addr)
    try:
        ids = [await _dead_letter(c, "payments", f"p{i}".encode(), "settlers") for i in range(5)]
    finally:
        await c.close()
    shown, more = await cli("dlq", "list", "settlers", "--limit", "3", "-o", "json", "-b", addr)
    assert [d["msgId"] for d in json.loads(shown)] == ids[:3]
    cursor = more.split()[-1]
    shown, more = await cli("dlq", "list", "settlers", "--cursor", cursor, "-o", "json", "-b", addr)
    assert [d["msgId"] for d in json.loads(shown)] == ids[3:] and more == ""

"""Listings too large for one answer: transactions are listed a page at a time with a cursor,
and an answer that would pass the frame limit is refused with an error naming the limit, the
connection kept."""

from __future__ import annotations

import pytest

from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.aio import ANSWER_BODY_LIMIT
from txmq.protocol.codes import ResponseCode
from txmq.protocol.errors import InvalidParameterError, TxmqError
from txmq.protocol.message import MessageConst


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

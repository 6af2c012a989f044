"""A batch stored by the fast paths is answered from its append result (:class:`StoredBatch`)
without a receipt per message; what that answer says must be what the receipts say."""

from __future__ import annotations

import pytest

from txmq.broker.messaging.core import SendOutcome, StoredBatch
from txmq.protocol.message import decode_offset_msg_id

PREFIX = "7F00000100002A9F"  # 127.0.0.1:10911


@pytest.mark.parametrize("txid", [None, "tx-1"])
@pytest.mark.parametrize("count", [1, 3, 64])
def test_a_stored_batch_answers_as_its_receipts(txid: str | None, count: int) -> None:
    placed = [(1000 + 300 * i + (i << 40), 300, 17 + i) for i in range(count)]
    uniqs = [f"U{i:04d}" for i in range(count)]
    end = placed[-1][0] + 300 + 12
    lazy = SendOutcome(batch=StoredBatch(PREFIX, placed, uniqs, 2, txid, end))
    receipts = StoredBatch(PREFIX, placed, uniqs, 2, txid, end).receipts()
    eager = SendOutcome(receipts)

    assert lazy.answer() == eager.answer()
    assert lazy.end_offset == eager.end_offset == end
    assert lazy.receipts == receipts
    ids, queue_id, queue_offset, transaction_id = lazy.answer()
    assert (queue_id, queue_offset, transaction_id) == (2, 17, txid)
    assert [decode_offset_msg_id(i)[1] for i in ids.split(",")] == [p[0] for p in placed]


def test_an_outcome_with_nothing_stored_waits_for_nothing() -> None:
    assert SendOutcome([]).end_offset is None
    assert SendOutcome().receipts == []

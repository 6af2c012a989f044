"""The transaction use cases of the core: a half is invisible until committed, a rollback
leaves nothing, the first decision wins and a repeat of it is answered as such, a decision on
a transaction the broker does not know is refused, and all of it holds across a restart."""

from __future__ import annotations

import pytest

from tests.support.core import CoreHarness, half
from txmq.broker.transaction.state import Decision, TxRecord, TxState
from txmq.protocol.errors import BrokerSystemError, IllegalOperationError

TOPIC = "Orders"


async def _prepared(h: CoreHarness, txid: str, body: bytes = b"h") -> TxRecord:
    outcome = await h.send(half(TOPIC, txid, body=body))
    assert outcome.flush_error is None
    assert outcome.receipts[0].transaction_id == txid
    return h.tx.find(txid, None)


def _state(rec: TxRecord) -> TxState:
    return rec.state


async def test_a_half_is_invisible_until_its_commit(harness: CoreHarness) -> None:
    rec = await _prepared(harness, "tx-commit", b"order 1")
    assert _state(rec) is TxState.PENDING
    assert harness.bodies(TOPIC) == [], "a half must not reach its topic before the commit"

    text = await harness.core.end_transaction(rec, Decision.COMMIT, from_check=False)

    assert rec.state is TxState.COMMITTED
    assert "committed" in text.lower() and "already" not in text
    assert harness.bodies(TOPIC) == [b"order 1"]
    assert "tx-commit" not in harness.tx.pending


async def test_a_rollback_leaves_nothing_visible(harness: CoreHarness) -> None:
    rec = await _prepared(harness, "tx-rollback")

    await harness.core.end_transaction(rec, Decision.ROLLBACK, from_check=False)

    assert rec.state is TxState.ROLLED_BACK
    assert harness.bodies(TOPIC) == []
    assert "tx-rollback" not in harness.tx.pending


@pytest.mark.parametrize("decision", [Decision.COMMIT, Decision.ROLLBACK])
async def test_the_same_decision_twice_is_answered_and_applied_once(
    harness: CoreHarness, decision: Decision
) -> None:
    rec = await _prepared(harness, "tx-twice", b"once")
    await harness.core.end_transaction(rec, decision, from_check=False)
    again = await harness.core.end_transaction(rec, decision, from_check=True)

    assert "was already" in again
    expected = [b"once"] if decision is Decision.COMMIT else []
    assert harness.bodies(TOPIC) == expected, "a repeated decision must not store a second copy"


@pytest.mark.parametrize(
    ("first", "second"),
    [(Decision.COMMIT, Decision.ROLLBACK), (Decision.ROLLBACK, Decision.COMMIT)],
)
async def test_the_first_decision_wins_over_the_other(
    harness: CoreHarness, first: Decision, second: Decision
) -> None:
    rec = await _prepared(harness, "tx-contested", b"contested")
    await harness.core.end_transaction(rec, first, from_check=False)
    state = rec.state

    with pytest.raises(IllegalOperationError, match="outcome does not change"):
        await harness.core.end_transaction(rec, second, from_check=False)

    assert rec.state is state
    expected = [b"contested"] if first is Decision.COMMIT else []
    assert harness.bodies(TOPIC) == expected


async def test_unknown_leaves_the_transaction_pending(harness: CoreHarness) -> None:
    rec = await _prepared(harness, "tx-unknown")

    text = await harness.core.end_transaction(rec, Decision.UNKNOWN, from_check=True)

    assert "stays PENDING" in text
    assert rec.state is TxState.PENDING
    assert "tx-unknown" in harness.tx.pending
    assert harness.bodies(TOPIC) == []


async def test_a_decision_on_an_unknown_transaction_is_refused(harness: CoreHarness) -> None:
    rec = await _prepared(harness, "tx-known")
    with pytest.raises(BrokerSystemError, match="Find prepared transaction message failed"):
        harness.tx.find("tx-nobody-sent", None)
    with pytest.raises(BrokerSystemError, match="Find prepared transaction message failed"):
        harness.tx.find(None, harness.store.max_phy_offset + 1_000)
    # the id of another transaction at a real half's offset: not taken for that transaction
    with pytest.raises(BrokerSystemError):
        harness.tx.find("tx-other", rec.halves[0].commit_log_offset)
    assert rec.state is TxState.PENDING


async def test_decisions_and_pending_halves_survive_a_restart(harness: CoreHarness) -> None:
    committed = await _prepared(harness, "tx-a", b"a")
    await _prepared(harness, "tx-b", b"b")
    await harness.core.end_transaction(committed, Decision.COMMIT, from_check=False)

    await harness.reopen()

    assert set(harness.tx.pending) == {"tx-b"}
    assert harness.bodies(TOPIC) == [b"a"]
    rec = harness.tx.find("tx-b", None)
    await harness.core.end_transaction(rec, Decision.COMMIT, from_check=False)
    assert harness.bodies(TOPIC) == [b"a", b"b"]
    again = await harness.core.end_transaction(
        harness.tx.find("tx-a", None), Decision.COMMIT, from_check=False
    )
    assert "was already" in again
    assert harness.bodies(TOPIC) == [b"a", b"b"], "a commit repeated after a restart stores nothing"

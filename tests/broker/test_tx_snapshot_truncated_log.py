"""A transaction snapshot is only used on the commit log it was taken from, and no decision
ever turns a record that is not the transaction's half into a committed message.

The sequence a replica lives through when it cuts its divergent tail (and a single broker when a
torn tail is cut at start and the log grows again before the next snapshot): transaction A's
halves are stored at offset X and a snapshot covers them; the log is cut back to X (the store's
``truncate``, what replication calls) and another transaction B's half is stored at X; the table
is then rebuilt.  A must not come back pending at X (a check-back of A would send B's half, and
a COMMIT answer would store B's message a second time)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest
from structlog.testing import capture_logs

from tests.support.logs import fresh_loggers
from tests.support.raw import RawClient, connected
from txmq.broker.clients import ClientChannel
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController, store_config
from txmq.broker.store import MessageStore
from txmq.broker.transaction import snapshot
from txmq.broker.transaction.persistence import set_aside_snapshot_past
from txmq.broker.transaction.state import TxState
from txmq.protocol.codes import ResponseCode
from txmq.protocol.headers import CheckTransactionStateRequestHeader
from txmq.protocol.message import MessageConst

G = "snap-group"
TOPIC = "snapfix"
COMMIT = 8
TIME_OUT_MS = 1_000
A, B = "txn-A", "txn-B"
B_UNIQ = "B0000000000000000000000000000001"


class Recorder:
    """The check sender: records each check's transaction id, says it was delivered."""

    def __init__(self) -> None:
        self.txids: list[str] = []

    async def __call__(
        self, channel: ClientChannel, header: CheckTransactionStateRequestHeader, body: bytes
    ) -> bool:
        assert header.transaction_id is not None
        self.txids.append(header.transaction_id)
        return True


@dataclasses.dataclass
class Rewritten:
    """A store whose log was cut back under a snapshot and written again."""

    config: BrokerConfig
    #: where A's first half was, and B's half is now
    x: int
    #: A's send answers (for END_TRANSACTION)
    a_sends: list[Any]
    snapshot: Path
    now_ms: list[int]

    def clock(self) -> float:
        return (self.now_ms[0] + 0.5) / 1000.0


@pytest.fixture(autouse=True)
def _fresh_loggers(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh_loggers(monkeypatch)


@pytest.fixture
async def rewritten(make_broker_config: Callable[..., BrokerConfig]) -> AsyncIterator[Rewritten]:
    """A's three halves at X, a snapshot covering them (written at shutdown), the log cut back
    to X and B's half (a larger one: the log ends past the snapshot's offset again) at X."""
    now_ms = [1_800_000_000_000]
    cfg = make_broker_config(
        transaction_time_out=TIME_OUT_MS,
        transaction_check_interval=600_000,
        transaction_snapshot_interval=600_000,
    )
    r = Rewritten(
        cfg, 0, [], Path(cfg.store_path_root_dir, "transaction", "snapshot.msgpack"), now_ms
    )
    b = BrokerController(cfg, clock=r.clock)
    await b.start()
    async with connected(b.address) as c:
        r.x = b.store.max_phy_offset
        for i in range(3):
            resp = await c.send(
                TOPIC,
                f"a{i}".encode(),
                group=G,
                transactional=True,
                props={MessageConst.TRANSACTION_ID: A},
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            r.a_sends.append(resp)
        rec = b.transactions.records[A]
        assert rec.state is TxState.PENDING and rec.halves[0].commit_log_offset == r.x
    await b.shutdown()  # writes the snapshot
    assert r.snapshot.exists()
    clog = snapshot.decode(r.snapshot.read_bytes()).clog_offset

    store = MessageStore(store_config(cfg), ("127.0.0.1", b.port), clock=r.clock)
    store.load()
    try:
        half = store.lookup_message(r.x)
        assert half.properties[MessageConst.TRANSACTION_ID] == A
        assert store.truncate(r.x) > 0
        assert store.max_phy_offset == r.x
        half.properties[MessageConst.UNIQ_KEY] = B_UNIQ
        half.properties[MessageConst.TRANSACTION_ID] = B
        half.body = b"b" * 4096
        put = store.put_message(half)
        assert put.commit_log_offset == r.x
        assert store.max_phy_offset > clog, "the log grew past the snapshot's offset again"
    finally:
        store.close()
    yield r


def _in(
    logs: Sequence[MutableMapping[str, Any]], event: str, **fields: Any
) -> list[MutableMapping[str, Any]]:
    return [
        e for e in logs if e["event"] == event and all(e.get(k) == v for k, v in fields.items())
    ]


async def test_a_snapshot_of_a_cut_log_is_set_aside_and_the_table_rebuilt(
    rewritten: Rewritten,
) -> None:
    r = rewritten
    with capture_logs() as logs:
        b = BrokerController(r.config, clock=r.clock)
        await b.start()
    try:
        tx = b.transactions
        a = tx.records.get(A)
        assert a is None or r.x not in [h.commit_log_offset for h in a.halves], (
            f"transaction A came back from the stale snapshot: {a}"
        )
        assert A not in tx.pending
        rec_b = tx.records[B]
        assert rec_b.state is TxState.PENDING
        assert [h.commit_log_offset for h in rec_b.halves] == [r.x]
        assert b.store.lookup_message(r.x).properties[MessageConst.UNIQ_KEY] == B_UNIQ
        assert b.recovery["transactions"]["snapshot"] == 0
        assert not r.snapshot.exists()
        assert r.snapshot.with_name("snapshot.msgpack.stale").exists()
        assert _in(logs, "transaction_snapshot_stale"), logs
        # A's producer commits late (its END_TRANSACTION names A and offset X): refused, and
        # B, the transaction whose half is at X now, is left as it is.
        async with connected(b.address) as c:
            with capture_logs() as logs:
                resp = await c.end_transaction(G, r.a_sends[0], COMMIT)
            assert resp.code == ResponseCode.SYSTEM_ERROR, resp.remark
            assert _in(logs, "half_message_mismatch", transaction_id=A, offset=r.x)
            assert await c.pull_all(TOPIC) == []
            assert tx.records[B].state is TxState.PENDING
    finally:
        await b.shutdown()


def _strip_tip(path: Path) -> None:
    """The snapshot as a broker without the tip wrote it (so without the checksum either)."""
    data = path.read_bytes()
    assert data.startswith(snapshot.CHECKSUM_MAGIC)
    doc = msgpack.unpackb(data[snapshot.PREFIX_SIZE :], raw=False, strict_map_key=False)
    assert "tip" in doc
    del doc["tip"]
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))


async def test_a_half_offset_holding_another_record_is_never_committed_nor_checked(
    rewritten: Rewritten,
) -> None:
    """The defence behind the snapshot's tip: with a snapshot that has none (written before it
    was recorded), A comes back pending at X while X holds B's half.  Neither a commit nor a
    check-back of A turns B's half into anything."""
    r = rewritten
    _strip_tip(r.snapshot)
    checks = Recorder()
    b = BrokerController(r.config, clock=r.clock, check_sender=checks)
    await b.start()
    assert b.transactions.checks._task is not None
    b.transactions.checks._task.cancel()  # rounds are the test's to run
    c = await RawClient.connect(b.address)
    try:
        tx = b.transactions
        assert b.recovery["transactions"]["snapshot"] == 1
        a = tx.pending[A]
        assert a.halves[0].commit_log_offset == r.x  # the stale entry this test is about
        end = b.store.max_phy_offset

        # A check-back of A: no check is sent for B's half.
        await c.heartbeat(producer_groups=[G])
        r.now_ms[0] += TIME_OUT_MS + 1
        with capture_logs() as logs:
            stats = await tx.check_round()
        assert checks.txids == [], "a check was sent for a record that is not A's half"
        assert stats["sent"] == 0
        [line] = _in(logs, "half_message_mismatch", transaction_id=A, offset=r.x)
        assert line["log_level"] == "error" and B_UNIQ in line["found"]
        assert line["action"] == "no check is sent"

        # A's producer commits: refused as for a half no longer stored, nothing written.
        with capture_logs() as logs:
            resp = await c.end_transaction(G, r.a_sends[0], COMMIT)
        assert resp.code != ResponseCode.SUCCESS
        assert b.store.max_phy_offset == end, "the commit wrote something"
        assert await c.pull_all(TOPIC) == []
        assert tx.pending[A] is a
        [line] = _in(logs, "half_message_mismatch", transaction_id=A, offset=r.x)
        assert line["log_level"] == "error" and B_UNIQ in line["found"]
        assert line["action"] == "no committed copy is written"
    finally:
        await c.close()
        await b.shutdown()


async def _one_half_stored(cfg: BrokerConfig, body: bytes) -> tuple[BrokerController, int, Path]:
    """Start a broker on ``cfg``, store one transactional half, stop it: the stopped broker,
    the commit-log end before the half, and the transaction snapshot its stop wrote."""
    b = BrokerController(cfg)
    await b.start()
    async with connected(b.address) as c:
        before = b.store.max_phy_offset
        assert (await c.send(TOPIC, body, group=G, transactional=True)).code == 0
    await b.shutdown()
    return b, before, Path(cfg.store_path_root_dir, "transaction", "snapshot.msgpack")


async def test_a_snapshot_past_a_replica_cut_is_set_aside_there(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """What replication calls after cutting its log: a snapshot covering the cut part is set
    aside at once; one within the kept part stays."""
    cfg = make_broker_config(transaction_check_interval=600_000)
    _, start, path = await _one_half_stored(cfg, b"x")
    clog = snapshot.decode(path.read_bytes()).clog_offset
    assert clog > start
    assert not set_aside_snapshot_past(cfg.store_path_root_dir, clog)
    assert path.exists()
    with capture_logs() as logs:
        assert set_aside_snapshot_past(cfg.store_path_root_dir, start)
    assert not path.exists() and path.with_name("snapshot.msgpack.stale").exists()
    assert _in(logs, "transaction_snapshot_stale")
    assert not set_aside_snapshot_past(cfg.store_path_root_dir, start)  # none left


async def test_a_snapshot_past_the_recovered_log_is_set_aside_for_good(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """A torn tail cut at start leaves the log short of a snapshot written before (one without a
    tip, as older brokers wrote them): it is set aside, not just ignored, so the log growing
    past it again with other records before the next snapshot cannot revive it."""
    cfg = make_broker_config(transaction_check_interval=600_000)
    b, x, path = await _one_half_stored(cfg, b"a")
    _strip_tip(path)
    store = MessageStore(store_config(cfg), ("127.0.0.1", b.port))
    store.load()
    try:
        assert store.truncate(x) > 0
    finally:
        store.close()
    with capture_logs() as logs:
        b = BrokerController(dataclasses.replace(cfg, listen_port=b.port))
        await b.start()
    try:
        assert b.recovery["transactions"]["snapshot"] == 0
        assert b.transactions.records == {}
        assert not path.exists() and path.with_name("snapshot.msgpack.stale").exists()
        [line] = _in(logs, "transaction_snapshot_stale")
        assert "more than the recovered commit log" in line["reason"]
    finally:
        await b.shutdown()

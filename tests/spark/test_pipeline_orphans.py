"""No orphan outlives its run: the pending halves a killed pipeline run leaves behind are rolled
back by the next run, when it announces itself or at its first decision, durably, and a zombie
of the old run that tries to commit them is refused.

A real broker process, SIGKILLed between the steps; no Spark here: the sink's engine writes
the halves and the decisions as a driver would (``test_spark_pipeline_orphans.py`` does it
with Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.support.process import BrokerProcess, running
from txmq.client.sync import AdminClient
from txmq.protocol.errors import TxmqError
from txmq.spark_connector.options import offsets_text, parse_sink_options
from txmq.spark_connector.pipeline import pipeline_batch_key
from txmq.spark_connector.session import BrokerSession, run
from txmq.spark_connector.sink import (
    PartitionResult,
    decide_batch,
    new_transaction_id,
    stream_batch_key,
    write_partition,
)

GROUP, PIPE, TOPIC = "txmq-spark-orders-billing", "orders-billing", "pipe-orphans"
OLD, NEW = "a1b2c3d4e5f6", "0f9e8d7c6b5a"
ROOT = Path(__file__).resolve().parents[2]
E0, E1 = offsets_text({"orders": {"0": 10}}), offsets_text({"orders": {"0": 20}})


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running(str(tmp_path / "store")) as bp:
        yield bp


def _write(
    address: str, key: str, attempt: int, group: str = GROUP, run: str | None = None
) -> PartitionResult:
    """One task attempt's rows, as the halves of a new transaction of batch ``key`` (with
    ``run``: as a task of that run of the pipeline writes them)."""
    options = parse_sink_options({"broker": address, "topic": TOPIC, "pipeline": PIPE})
    rows = pa.RecordBatch.from_pydict({"body": [f"{key}-{attempt}-{i}" for i in range(3)]})
    return write_partition(
        [rows],
        options,
        group=group,
        batch_key=key,
        transaction_id=new_transaction_id(key, 0, attempt),
        run_id=run,
    )


def _id(result: PartitionResult) -> str:
    assert result.transaction_id is not None
    return result.transaction_id


def _decide(
    address: str, key: str, results: list[PartitionResult], start: str, end: str
) -> dict[str, Any]:
    return decide_batch(address, GROUP, key, results, 10.0, position=(PIPE, start, end))


def _announce(address: str, key: str) -> None:
    """What each task of run NEW asks before it writes halves of batch ``key``: whether the
    batch is decided, naming its pipeline and run."""

    async def go() -> dict[str, Any]:
        async with BrokerSession(address, 10.0) as s:
            return await s.decide_batch(GROUP, key, query_only=True, pipeline=PIPE, run=NEW)

    assert not run(go)["decided"]


def _open(address: str, group: str = GROUP) -> list[dict[str, Any]]:
    """The group's pending and parked transactions."""
    with AdminClient(address) as admin:
        return admin.list_transactions(group=group, state="PENDING,DISCARDED")


def _states(address: str, txids: list[str]) -> dict[str, tuple[str, str]]:
    with AdminClient(address) as admin:
        docs = [admin.get_transaction(t) for t in txids]
    return {d["transactionId"]: (d["state"], d["remark"]) for d in docs}


def _restart(broker: BrokerProcess, how: str) -> None:
    if how == "sigkill":
        broker.kill()
    elif how == "clean_stop":
        assert broker.terminate() == 0
    else:
        return
    broker.start()


def _old_run_killed_mid_batch(address: str) -> list[str]:
    """Run OLD decides batch 0, writes batch 1 (two attempts) and dies: their ids."""
    k0 = pipeline_batch_key(PIPE, OLD, 0)
    assert _decide(address, k0, [_write(address, k0, 0)], "", E0)["first"]
    k1 = pipeline_batch_key(PIPE, OLD, 1)
    orphans = [_id(_write(address, k1, a)) for a in (0, 1)]
    assert sorted(t["transactionId"] for t in _open(address)) == sorted(orphans)
    return orphans


def _assert_orphans_rolled_back(address: str, orphans: list[str]) -> None:
    assert _open(address) == []
    for state, remark in _states(address, orphans).values():
        assert state == "ROLLED_BACK"
        assert remark == (
            f"pipeline: orphan of pipeline {PIPE!r} run {OLD}, superseded by run {NEW}"
        )


def _zombie_commit_is_refused(address: str, orphans: list[str]) -> None:
    """The old run, still alive somewhere, decides its batch 1: fenced, nothing committed."""
    k1 = pipeline_batch_key(PIPE, OLD, 1)
    zombie = [
        PartitionResult(producer_group=GROUP, batch_key=k1, transaction_id=t, rows=3)
        for t in orphans
    ]
    with pytest.raises(TxmqError, match=f"fenced: .*orphan of pipeline .* run {OLD}"):
        _decide(address, k1, zombie, E0, E1)
    assert {s for s, _ in _states(address, orphans).values()} == {"ROLLED_BACK"}


@pytest.mark.parametrize("restart", ["none", "sigkill", "clean_stop"])
def test_the_next_runs_decision_rolls_back_the_old_runs_orphans(
    broker: BrokerProcess, restart: str
) -> None:
    address = broker.address
    orphans = _old_run_killed_mid_batch(address)
    _restart(broker, restart)  # the orphans are still pending after it
    assert len(_open(address)) == 2
    # The new run runs batch 1 again (under its own key) and decides it.
    k1 = pipeline_batch_key(PIPE, NEW, 1)
    mine = _write(address, k1, 0)
    answer = _decide(address, k1, [mine], E0, E1)
    assert answer["committed"] == [_id(mine)] and answer["rolledBack"] == []
    _assert_orphans_rolled_back(address, orphans)
    # The rollbacks are in the decision's record: replayed after a SIGKILL right after it,
    # read from the snapshot after a clean stop.
    _restart(broker, restart)
    _assert_orphans_rolled_back(address, orphans)
    _zombie_commit_is_refused(address, orphans)
    # The batch the new run decided is untouched.
    assert _states(address, [_id(mine)])[_id(mine)][0] == "COMMITTED"


@pytest.mark.parametrize("restart", ["none", "sigkill"])
def test_the_next_run_rolls_back_the_old_runs_orphans_as_it_starts(
    broker: BrokerProcess, restart: str
) -> None:
    address = broker.address
    orphans = _old_run_killed_mid_batch(address)
    _restart(broker, restart)
    # The new run's first task announces it before writing anything.
    _announce(address, pipeline_batch_key(PIPE, NEW, 1))
    _assert_orphans_rolled_back(address, orphans)
    _restart(broker, restart)
    _assert_orphans_rolled_back(address, orphans)
    _zombie_commit_is_refused(address, orphans)
    # The new run's own halves are its own: announcing it again leaves them pending, and its
    # decision commits them.
    k1 = pipeline_batch_key(PIPE, NEW, 1)
    mine = _write(address, k1, 0, run=NEW)
    _announce(address, k1)
    assert [t["transactionId"] for t in _open(address)] == [_id(mine)]
    assert _decide(address, k1, [mine], E0, E1)["committed"] == [_id(mine)]
    assert _open(address) == []


def test_other_pipelines_and_plain_batches_are_not_orphans(broker: BrokerProcess) -> None:
    """Only the same group's halves of the same pipeline's other runs are rolled back."""
    address = broker.address
    _old_run_killed_mid_batch(address)
    keep = [
        # another pipeline whose name starts with this one's
        _write(address, pipeline_batch_key(f"{PIPE}-eu", OLD, 1), 0),
        # a query without the option, in the same group
        _write(address, stream_batch_key("8c1e54a0-1f2b-4c3d-9e8f-0a1b2c3d4e5f", 1), 0),
        # the same pipeline's name in another producer group
        _write(address, pipeline_batch_key(PIPE, OLD, 1), 2, group="other-group"),
    ]
    k1 = pipeline_batch_key(PIPE, NEW, 1)
    _decide(address, k1, [_write(address, k1, 0)], E0, E1)
    assert sorted(t["transactionId"] for t in _open(address)) == sorted(_id(r) for r in keep[:2])
    assert [t["transactionId"] for t in _open(address, "other-group")] == [_id(keep[2])]


@pytest.mark.parametrize("restart", ["none", "sigkill"])
def test_a_restarted_query_rolls_back_its_orphans_with_the_decision(
    broker: BrokerProcess, restart: str
) -> None:
    """Without the option: the restarted query (same checkpoint, same query id) decides the
    same batch key, and its decision rolls back what the killed run wrote."""
    address = broker.address
    group, key = "txmq-spark-q", stream_batch_key("8c1e54a0-1f2b-4c3d-9e8f-0a1b2c3d4e5f", 4)
    orphans = [_id(_write(address, key, a, group)) for a in (0, 1)]
    _restart(broker, restart)
    assert len(_open(address, group)) == 2
    mine = _write(address, key, 0, group)
    answer = decide_batch(address, group, key, [mine], 10.0)
    assert answer["committed"] == [_id(mine)]
    assert sorted(answer["rolledBack"]) == sorted(orphans)
    _restart(broker, restart)
    assert _open(address, group) == []


def test_an_operator_aborts_the_batch_of_a_lost_query(broker: BrokerProcess) -> None:
    """A query whose checkpoint is lost never decides its last batch's key: the operator
    aborts it (``txmq txn abort-batch``), and a zombie task of it writes nothing."""
    address = broker.address
    group, key = "txmq-spark-q", stream_batch_key("8c1e54a0-1f2b-4c3d-9e8f-0a1b2c3d4e5f", 7)
    orphans = [_id(_write(address, key, a, group)) for a in (0, 1)]
    done = subprocess.run(
        [sys.executable, "-m", "txmq", "txn", "abort-batch", "-b", address, "-g", group]
        + ["--batch-key", key, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["first"] and answer["committed"] == []
    assert sorted(answer["rolledBack"]) == sorted(orphans)
    with AdminClient(address) as admin:
        assert not admin.abort_batch(group, key)["first"]  # a repeat answers the decision
    assert _open(address, group) == []
    late = _write(address, key, 2, group)  # a zombie task finds the batch decided
    assert late.already_decided and late.transaction_id is None

    async def ask() -> dict[str, Any]:
        async with BrokerSession(address, 10.0) as s:
            return await s.decide_batch(group, key, query_only=True)

    assert run(ask)["decided"]

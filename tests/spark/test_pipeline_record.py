"""A pipeline's batch decisions record the input range each batch consumed, durably: a real
broker process decides batches with positions, refuses one that does not start where the
pipeline is, and after a SIGKILL (the op queue replayed) or a clean stop (the snapshot read)
answers the same position, the same next end for a start, and still refuses the stale start.

No Spark here: the sink's engine writes the halves and the decisions as the driver would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.support.process import BrokerProcess, running
from txmq.protocol.errors import TxmqError
from txmq.spark_connector.options import offsets_text, parse_sink_options
from txmq.spark_connector.pipeline import pipeline_batch_key
from txmq.spark_connector.session import BrokerSession, run
from txmq.spark_connector.sink import decide_batch, new_transaction_id, write_partition

GROUP, PIPE, TOPIC = "txmq-spark-orders-billing", "orders-billing", "pipe-record"
#: The input ranges of three batches, as a source's offsets.
ENDS = [{"orders": {"0": 10, "1": 4}}, {"orders": {"0": 25, "1": 9}}, {"orders": {"0": 30, "1": 9}}]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running(str(tmp_path / "store")) as bp:
        yield bp


def _query(address: str, start: str | None) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with BrokerSession(address, 10.0) as s:
            return await s.decide_batch(
                GROUP, f"{PIPE}-position", query_only=True, pipeline=PIPE, start=start
            )

    answer: dict[str, Any] = run(go)["pipeline"]
    return answer


def _batch(address: str, n: int, start: str, end: str) -> dict[str, Any]:
    """Write one batch's rows as halves and decide it with its input range."""
    options = parse_sink_options({"broker": address, "topic": TOPIC})
    key = pipeline_batch_key(PIPE, "run1", n)
    rows = pa.RecordBatch.from_pydict({"body": [f"b{n}-{i}" for i in range(5)]})
    result = write_partition(
        [rows],
        options,
        group=GROUP,
        batch_key=key,
        transaction_id=new_transaction_id(key, 0, 0),
    )
    return decide_batch(address, GROUP, key, [result], 10.0, position=(PIPE, start, end))


def _check(address: str, texts: list[str]) -> None:
    head = _query(address, None)
    assert (head["end"], head["batchKey"]) == (texts[-1], pipeline_batch_key(PIPE, "run1", 2))
    assert _query(address, "")["next"] == texts[0]  # the first batch's start was not known
    for a, b in zip(texts, texts[1:], strict=False):
        assert _query(address, a)["next"] == b
    assert _query(address, texts[-1])["next"] is None
    # A batch that starts anywhere but where the pipeline is is refused.
    with pytest.raises(TxmqError, match="pipeline 'orders-billing'.*is at"):
        _batch(address, 3, texts[0], offsets_text({"orders": {"0": 99, "1": 99}}))


@pytest.mark.parametrize("restart", ["sigkill", "clean_stop"])
def test_positions_survive_a_restart(broker: BrokerProcess, restart: str) -> None:
    texts = [offsets_text(e) for e in ENDS]
    answers = [_batch(broker.address, 0, "", texts[0])]
    answers += [_batch(broker.address, n, texts[n - 1], texts[n]) for n in (1, 2)]
    assert [a["position"]["end"] for a in answers] == texts
    assert all(a["first"] and len(a["committed"]) == 1 for a in answers)
    _check(broker.address, texts)
    if restart == "sigkill":
        broker.kill()
    else:
        assert broker.terminate() == 0
    broker.start()
    _check(broker.address, texts)
    # Deciding a decided batch again answers its first decision, position included.
    again = _batch(broker.address, 2, texts[1], texts[2])
    assert not again["first"] and again["position"]["end"] == texts[2]

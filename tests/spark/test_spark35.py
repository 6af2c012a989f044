"""The Spark 3.5 path: the documented ``foreachBatch`` helper (``txmq_foreach_batch``) under
pyspark 3.5 delivers every row exactly once, also when a micro-batch is replayed after the sink
committed it (the driver crashed before Spark's commit log).

pyspark 3.5 lives in a virtualenv of its own, ``build/venvs/spark35`` (with pandas and pyarrow
it supports, and txmq installed from the checkout), made once by ``make spark35``, which
``make test`` runs before pytest.  The driver (tests/spark/spark35_driver.py) runs in that venv
as a subprocess with a bounded time; the broker runs in the test process.  Without the venv the
test is skipped with the reason, and fails when the environment variable CI is set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.spark.cluster import clean_env
from tests.spark.helpers import by_state, forget_commit, order_ids, pull_all
from tests.spark.helpers import transactions as txns
from tests.support.unavailable import unavailable

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "build" / "venvs" / "spark35"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".installed"
DRIVER = Path(__file__).with_name("spark35_driver.py")
FILES, ROWS = 3, 200
#: Bound of one driver run (JVM start, three micro-batches, stop).
RUN_TIMEOUT = 180.0


def _unavailable() -> str | None:
    """Why the pyspark 3.5 venv cannot be used, or None."""
    if not STAMP.exists():
        return f"{VENV} was not made: run `make spark35` (`make test` does)"
    probe = subprocess.run(
        [str(PYTHON), "-c", "import pyspark, txmq.spark_connector; print(pyspark.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return f"{PYTHON} cannot import pyspark and txmq: {probe.stderr[-2000:]}"
    if not probe.stdout.startswith("3.5."):
        return f"{VENV} has pyspark {probe.stdout.strip()}, not 3.5"
    return None


@pytest.fixture(scope="module")
def spark35() -> Path:
    reason = _unavailable()
    if reason is not None:
        unavailable(f"pyspark 3.5 unavailable: {reason}")
    return PYTHON


@pytest.fixture(scope="module")
def broker(spark_broker: BrokerThread) -> BrokerThread:
    """The module's broker (``spark_broker``), under the name its tests use."""
    return spark_broker


def _run(python: Path, args: list[str], log: Path) -> dict[str, Any]:
    """One driver run; its JSON summary."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(python), str(DRIVER), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(home=False),  # the venv's pyspark 3.5 finds its own Spark
            start_new_session=True,
        )
        try:
            rc = proc.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(
                    proc.pid, signal.SIGKILL
                )  # whatever is left of the run: its JVM, its workers
            except ProcessLookupError:
                pass
            proc.wait(10)
    output = log.read_text(errors="replace")
    assert rc == 0, (
        f"the pyspark 3.5 driver {'timed out' if rc is None else f'exited {rc}'}:\n{output[-6000:]}"
    )
    summary: dict[str, Any] = json.loads(
        [line for line in output.splitlines() if line.startswith('{"pyspark"')][-1]
    )
    return summary


def test_foreach_batch_helper_under_pyspark_35_is_exactly_once_with_a_replayed_batch(
    spark35: Path, broker: BrokerThread, tmp_path: Path
) -> None:
    folder, checkpoint, topic = tmp_path / "input", tmp_path / "ckpt", "spark35-orders"
    folder.mkdir()
    for f in range(FILES):
        rows = range(f * ROWS, (f + 1) * ROWS)
        lines = [json.dumps({"id": i, "customer": f"c{i % 7}"}) for i in rows]
        (folder / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    args = [broker.address, str(folder), str(checkpoint), topic]

    first = _run(spark35, args, tmp_path / "run-1.log")
    assert first["pyspark"].startswith("3.5."), first
    assert first["batches"] == [[b, ROWS] for b in range(FILES)], first
    assert order_ids(pull_all(broker.address, topic)) == list(range(FILES * ROWS))

    # Replay the last batch, as after a driver crash between the sink's decision and Spark's
    # commit log: the helper finds the batch decided and writes nothing again.
    forget_commit(checkpoint, FILES - 1)
    again = _run(spark35, args, tmp_path / "run-2.log")
    assert again["query_id"] == first["query_id"], again
    # The replay ran batch FILES - 1 again, and the helper wrote nothing: the broker said it was
    # decided (so the batch's input was not even read).
    assert [b for b, _ in again["batches"]] == [FILES - 1], again
    assert "sink_batch_already_decided" in (tmp_path / "run-2.log").read_text(), again
    assert order_ids(pull_all(broker.address, topic)) == list(range(FILES * ROWS))
    states = by_state(txns(broker.address, f"txmq-spark-{first['query_id']}"))
    assert set(states) == {"COMMITTED"}, sorted(states)

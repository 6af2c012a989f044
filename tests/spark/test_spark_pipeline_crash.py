"""A txmq -> txmq pipeline's Spark driver SIGKILLed right after a batch decision, its
checkpoint then losing that batch's offsets and the previous batch's commit: the restarted
driver runs the previous batch again from its logged offsets, plans the killed batch anew
(with larger micro-batches, so it would end elsewhere) and goes on; every input id is in the
output exactly once.

The driver runs as a subprocess (tests/spark/pipeline_driver.py, ``local[2]``) in a process
group of its own, so the kill takes the driver program, its JVM and its Python workers at once,
as a lost driver host would; the broker runs in the test process.  The two tests run in order
on one checkpoint (each one driver run, within the per-test bound)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import by_state, pull_all, transactions
from tests.spark.test_spark_pipeline import _forget_batches, _ids, _publish

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

from txmq.spark_connector.writer import CRASH_AT_ENV  # noqa: E402  (needs pyspark)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DRIVER = Path(__file__).with_name("pipeline_driver.py")
ROOT = Path(__file__).resolve().parents[2]
#: Bound of one driver run (JVM start, a few micro-batches, stop).
RUN_TIMEOUT = 150.0
SOURCE, OUT, PIPELINE = "pipe-in-kill", "pipe-out-kill", "copy-kill"


class Pipeline:
    def __init__(self, address: str, tmp: Path) -> None:
        self.address, self.tmp, self.ckpt = address, tmp, tmp / "ckpt"

    def drive(self, name: str, per_batch: int, crash_at: str | None) -> int:
        """One run of pipeline_driver.py; returns its exit status."""
        env = {k: v for k, v in os.environ.items() if k != CRASH_AT_ENV}
        env["PYTHONPATH"] = str(ROOT)
        if crash_at is not None:
            env[CRASH_AT_ENV] = crash_at
        args = [self.address, SOURCE, OUT, str(self.ckpt), PIPELINE, str(per_batch)]
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(DRIVER), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                status = proc.wait(RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"the driver ran longer than {RUN_TIMEOUT}s\n{log.read_text()[-4000:]}"
                ) from None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # what it left: the JVM, workers
                proc.wait(10)
        self.output = log.read_text(errors="replace")[-4000:]
        return status


@pytest.fixture(scope="module")
def broker(spark_broker: BrokerThread) -> BrokerThread:
    """The module's broker (``spark_broker``), under the name its tests use."""
    return spark_broker


@pytest.fixture(scope="module")
def pipeline(broker: BrokerThread, tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    return Pipeline(broker.address, tmp_path_factory.mktemp("pipeline"))


def test_driver_killed_right_after_deciding_batch_1(pipeline: Pipeline) -> None:
    _publish(pipeline.address, SOURCE, range(0, 300))
    status = pipeline.drive("run0", 100, crash_at="after_decide:1")
    assert status == -signal.SIGKILL, pipeline.output
    assert _ids(pull_all(pipeline.address, OUT)) == list(range(200))


def test_restart_after_losing_batch_1_offsets_and_batch_0_commit(pipeline: Pipeline) -> None:
    if not (pipeline.ckpt / "offsets" / "1").exists():
        pytest.fail("the previous test did not leave batch 1 in the offset log")
    _forget_batches(pipeline.ckpt, offsets=[1], commits=[0])
    _publish(pipeline.address, SOURCE, range(300, 500))
    assert pipeline.drive("run1", 150, crash_at=None) == 0, pipeline.output
    assert _ids(pull_all(pipeline.address, OUT)) == list(range(500))
    assert "PENDING" not in by_state(transactions(pipeline.address, f"txmq-spark-{PIPELINE}"))

"""No orphan outlives its run: a txmq -> txmq pipeline's Spark driver SIGKILLed mid-batch, again
and again, leaves that batch's halves pending under the killed run's batch keys; the next run
rolls them back as it starts (and with its first decision), so once the pipeline has drained,
every input id is in the output exactly once and the sink's producer group has no pending and
no parked transaction left.

Kills: the first one at the sink's commit point of batch 1 (its halves are written, the
decision not sent), then at random moments after the run's first halves reached the broker
(``TXMQ_CRASH_SEED`` replays a schedule).  The driver runs as a subprocess
(tests/spark/pipeline_driver.py, ``local[2]``) in a process group of its own, so a kill takes
its JVM and Python workers too; the broker runs in the test process."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import BROKER_SETTINGS, pull_all, start_broker, transactions
from tests.spark.test_spark_pipeline import _ids, _publish
from tests.support.waiting import wait_until_sync

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

from txmq.spark_connector.writer import CRASH_AT_ENV  # noqa: E402  (needs pyspark)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DRIVER = Path(__file__).with_name("pipeline_driver.py")
ROOT = Path(__file__).resolve().parents[2]
#: Bound of one driver run (JVM start, a few micro-batches, stop).
RUN_TIMEOUT = 150.0
SOURCE, OUT, PIPELINE = "pipe-in-orphans", "pipe-out-orphans", "copy-orphans"
GROUP = f"txmq-spark-{PIPELINE}"
IDS, PER_BATCH = 800, 100
#: One transaction check interval of the test broker, in seconds.
CHECK_INTERVAL = BROKER_SETTINGS["transaction_check_interval"] / 1000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    bt = start_broker(tmp_path / "broker")
    try:
        yield bt
    finally:
        bt.stop()


def _open(address: str) -> list[dict[str, Any]]:
    """The sink group's pending and parked transactions."""
    return transactions(address, GROUP, "PENDING,DISCARDED")


def _run(name: str) -> str:
    """The run token of a pipeline batch key ``<pipeline>-<run>-<batchId>``."""
    return name[len(PIPELINE) + 1 :].split("-", 1)[0]


class Driver:
    """One run of pipeline_driver.py, killed (its process group) at the latest on timeout."""

    def __init__(self, address: str, tmp: Path, name: str, crash_at: str | None) -> None:
        env = {k: v for k, v in os.environ.items() if k != CRASH_AT_ENV}
        env["PYTHONPATH"] = str(ROOT)
        if crash_at is not None:
            env[CRASH_AT_ENV] = crash_at
        args = [address, SOURCE, OUT, str(tmp / "ckpt"), PIPELINE, str(PER_BATCH)]
        self.log = tmp / f"{name}.log"
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.deadline = time.monotonic() + RUN_TIMEOUT

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self) -> int:
        try:
            return self.proc.wait(max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the driver ran longer than {RUN_TIMEOUT}s\n{self.output()}"
            ) from None
        finally:
            self.kill()  # whatever the driver left in its group (the JVM, workers)
            self.proc.wait(10)
            self._out.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _writing(address: str, driver: Driver, before: set[str]) -> Callable[[], bool]:
    """Whether ``driver``'s run has halves on the broker (or ended)."""

    def check() -> bool:
        return driver.proc.poll() is not None or any(
            t["transactionId"] not in before for t in _open(address)
        )

    return check


def test_no_orphan_outlives_its_run(broker: BrokerThread, tmp_path: Path) -> None:
    address = broker.address
    seed = int(os.environ.get("TXMQ_CRASH_SEED", random.randrange(1 << 30)))
    rnd = random.Random(seed)
    _publish(address, SOURCE, range(IDS))
    schedule: list[str] = []
    #: Per kill: the killed run's pending transactions left behind.
    left: list[int] = []
    dead_runs: set[str] = set()
    for i in range(4):
        before = {t["transactionId"] for t in _open(address)}
        if i == 0:
            driver = Driver(address, tmp_path, f"run{i}", crash_at="before_decide:1")
            schedule.append("at before_decide:1")
            assert driver.wait() == -signal.SIGKILL, driver.output()
        else:
            driver = Driver(address, tmp_path, f"run{i}", crash_at=None)
            # Mid-batch: once this run's first halves are on the broker, after a random delay.
            wait_until_sync(
                _writing(address, driver, before),
                timeout=RUN_TIMEOUT,
                what=f"run {i} writing halves (seed {seed})",
            )
            delay = rnd.uniform(0.0, 1.5)
            schedule.append(f"{delay:.2f}s after its first halves")
            time.sleep(delay)  # the kill's moment, not a wait for a condition
            driver.kill()
            driver.wait()
        pending = _open(address)
        left.append(len(pending))
        if i == 0:
            # killed before its decision was sent: these can only be resolved as orphans (a
            # later kill may land while its decision is on its way, which then decides them)
            dead_runs |= {_run(t["batchKey"]) for t in pending}
        # What the runs killed before left is gone: this run rolled it back as it started.
        assert not before & {t["transactionId"] for t in pending}, (seed, schedule)
    # The first kill left its batch 1 behind for sure: the test sees orphans resolved.
    assert left[0] > 0, (seed, schedule, left)
    final = Driver(address, tmp_path, "drain", crash_at=None)
    assert final.wait() == 0, final.output()
    # Within one check interval of the last run's start (long past): nothing open.
    wait_until_sync(
        lambda: not _open(address),
        timeout=CHECK_INTERVAL,
        what=f"no pending or parked transaction of {GROUP} (seed {seed}, kills {schedule})",
    )
    ids = _ids(pull_all(address, OUT))
    duplicates = len(ids) - len(set(ids))
    missing = len(set(range(IDS)) - set(ids))
    assert (duplicates, missing) == (0, 0), (seed, schedule, left)
    assert ids == list(range(IDS))
    # What the first kill left was rolled back as an orphan of its run (what a later kill left
    # is decided all the same: nothing is open above).
    orphans = [
        t
        for t in transactions(address, GROUP, "ROLLED_BACK")
        if t["remark"].startswith(f"pipeline: orphan of pipeline {PIPELINE!r}")
    ]
    assert {_run(t["batchKey"]) for t in orphans} >= dead_runs, (seed, schedule, left)
    assert len(orphans) >= left[0], (seed, schedule, left)
    print(
        f"seed {seed}: kills {schedule}; pending left per kill {left}; "
        f"orphans rolled back {len(orphans)}; duplicates {duplicates}; missing {missing}"
    )

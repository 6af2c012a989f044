"""The Spark driver SIGKILLed and restarted from the same checkpoint, against a real broker:
at the sink's two commit points (before the batch decision, and between the decision and
Spark's commit log) and at random moments.  After every crash nothing is delivered twice and
nothing of an undecided batch is visible; after the last run every row is delivered exactly
once and no transaction is left pending.

The driver runs as a subprocess (tests/spark/crash_driver.py, ``local[2]``) in a process group
of its own, so a kill takes the driver program, its JVM and its Python workers at once, as a
lost driver host would; the broker runs in the test process.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import by_state, order_ids, pull_all, transactions

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

from txmq.spark_connector.writer import CRASH_AT_ENV  # noqa: E402  (needs pyspark)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DRIVER = Path(__file__).with_name("crash_driver.py")
ROOT = Path(__file__).resolve().parents[2]
FILES, ROWS = 6, 100
#: Bound of one driver run (JVM start, up to six micro-batches, stop).
RUN_TIMEOUT = 150.0


@pytest.fixture(scope="module")
def broker(spark_broker: BrokerThread) -> BrokerThread:
    """The module's broker (``spark_broker``), under the name its tests use."""
    return spark_broker


class Driver:
    """One run of crash_driver.py, its output in a file."""

    def __init__(self, args: list[str], log: Path, crash_at: str | None) -> None:
        env = {k: v for k, v in os.environ.items() if k != CRASH_AT_ENV}
        env["PYTHONPATH"] = str(ROOT)
        if crash_at is not None:
            env[CRASH_AT_ENV] = crash_at
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(10)
            raise AssertionError(
                f"the driver ran longer than {timeout}s\n{self.output()}"
            ) from None
        finally:
            self.kill()  # whatever the driver left in its group (the JVM, workers)
            self._out.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


def _inputs(folder: Path) -> None:
    folder.mkdir()
    for f in range(FILES):
        rows = range(f * ROWS, (f + 1) * ROWS)
        lines = [json.dumps({"id": i, "customer": f"c{i % 7}", "amount": 1.0}) for i in rows]
        (folder / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")


def _committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


class Crashes:
    """The shared state of the module's tests, which run in order on one checkpoint (each test
    a few driver runs, so that none runs longer than the per-test bound)."""

    def __init__(self, address: str, tmp: Path) -> None:
        self.address, self.topic, self.tmp = address, "crash-orders", tmp
        self.folder, self.checkpoint = tmp / "input", tmp / "ckpt"
        _inputs(self.folder)
        self.seed = int(os.environ.get("TXMQ_CRASH_SEED", random.randrange(1 << 30)))
        self.rnd = random.Random(self.seed)
        self.history: list[str] = []

    def run(self, name: str, crash_at: str | None = None, kill_after: float | None = None) -> int:
        args = [self.address, str(self.folder), str(self.checkpoint), self.topic]
        driver = Driver(args, self.tmp / f"driver-{len(self.history)}.log", crash_at)
        if kill_after is not None:
            # From the moment the query runs (the JVM start alone takes seconds).
            deadline = time.monotonic() + RUN_TIMEOUT
            while "started" not in driver.output() and driver.proc.poll() is None:
                assert time.monotonic() < deadline, driver.output()
                time.sleep(0.1)
            try:
                driver.proc.wait(kill_after)
            except subprocess.TimeoutExpired:
                driver.kill()
        rc = driver.wait(RUN_TIMEOUT)
        ids = order_ids(pull_all(self.address, self.topic))
        self.history.append(
            f"{name}: rc={rc} batches committed={_committed_batches(self.checkpoint)} "
            f"rows={len(ids)}"
        )
        context = self.context() + f"\n--- driver output\n{driver.output()}"
        # After every run, killed or not: no row twice, and only whole batches visible.
        assert len(ids) == len(set(ids)), context
        assert len(ids) % ROWS == 0 and set(ids) <= set(range(FILES * ROWS)), context
        if crash_at is not None:
            assert rc == -signal.SIGKILL, context
        return rc

    def context(self) -> str:
        return f"seed {self.seed}\n" + "\n".join(self.history)


@pytest.fixture(scope="module")
def crashes(broker: BrokerThread, tmp_path_factory: pytest.TempPathFactory) -> Crashes:
    return Crashes(broker.address, tmp_path_factory.mktemp("crash"))


def test_driver_killed_at_the_sinks_commit_points(crashes: Crashes) -> None:
    # Batch 1 dies before its decision (its halves orphaned), batch 2 between the decision and
    # Spark's commit log (the batch is replayed on restart).
    crashes.run("killed before deciding batch 1", crash_at="before_decide:1")
    assert _committed_batches(crashes.checkpoint) == 1, crashes.context()
    crashes.run("killed after deciding batch 2", crash_at="after_decide:2")
    assert _committed_batches(crashes.checkpoint) == 2, crashes.context()
    # Batch 2 is decided (visible) but not recorded by Spark.
    assert len(pull_all(crashes.address, crashes.topic)) == 3 * ROWS, crashes.context()


def test_driver_killed_at_random_moments(crashes: Crashes) -> None:
    # JVM start, planning, tasks writing halves, commits: wherever the kill lands.
    for i in range(3):
        crashes.run(f"killed at random #{i}", kill_after=crashes.rnd.uniform(0.5, 8.0))


def test_restarted_driver_delivers_every_row_exactly_once(crashes: Crashes) -> None:
    assert crashes.run("final run") == 0, crashes.context()
    address = crashes.address
    ids = order_ids(pull_all(address, crashes.topic))
    assert ids == list(range(FILES * ROWS)), crashes.context()
    query_id = json.loads((crashes.checkpoint / "metadata").read_text())["id"]
    states = by_state(transactions(address, f"txmq-spark-{query_id}"))
    # Every orphan (of the killed attempts) was rolled back by its batch's decision.
    assert "PENDING" not in states, crashes.context()

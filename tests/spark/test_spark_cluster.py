"""A real Spark standalone cluster (a master and a worker on 127.0.0.1, from pyspark's own
distribution): examples/pipeline.py is submitted to the ``spark://`` master exactly as
docs/spark.md says (the ``--py-files`` zip built by the recipe there, workers on a Python that
has pyarrow but no txmq), an executor is SIGKILLed while its tasks write a micro-batch, and the
query still completes with every order billed exactly once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BrokerThread
from tests.spark.cluster import StandaloneCluster, clean_env
from tests.spark.helpers import by_state, pull_all, transactions
from tests.support.waiting import wait_until_sync
from txmq.client import Message, Producer

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
#: Orders: two micro-batches of the example (it reads at most 10,000 messages per trigger).
ORDERS = 20_000
#: Bound of the recipe's build steps and of the submitted job.
BUILD_TIMEOUT, JOB_TIMEOUT = 300.0, 300.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def broker(spark_broker: BrokerThread) -> BrokerThread:
    """The module's broker (``spark_broker``), under the name its tests use."""
    return spark_broker


def worker_python(folder: Path) -> Path:
    """A Python for Spark's workers (and driver) with pyspark's dependencies (pyarrow, pandas,
    ...) but without txmq: a bare venv whose .pth names this venv's site-packages as a plain
    path, so the editable install's finder there is not run."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120
    )
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    (Path(purelib) / "spark-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import pyarrow, pandas\ntry:\n import txmq\nexcept ImportError:\n pass"
            "\nelse:\n raise SystemExit('txmq is importable')",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, f"the workers' Python is not as wanted: {probe.stderr}"
    return python


def recipe() -> tuple[str, str]:
    """The build steps and the ``spark-submit`` command of docs/spark.md's zip recipe."""
    doc = (ROOT / "docs" / "spark.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", doc, re.S) if "--py-files" in b]
    assert len(blocks) == 1, "docs/spark.md should have one bash block with --py-files"
    build, _, submit = blocks[0].partition("\n\n")
    assert "make wheel" in build and "spark-submit" in submit, blocks[0]
    return build, submit


def seed_orders(address: str) -> set[str]:
    """ORDERS orders as examples/pipeline.py's ``seed`` makes them (every tenth with a
    non-positive amount, which the pipeline drops); returns the ids that must be billed."""
    billed: set[str] = set()
    with Producer("cluster-seed", broker=address) as producer:
        for start in range(0, ORDERS, 500):
            batch = []
            for i in range(start, start + 500):
                amount = -5.0 if i % 10 == 0 else 10.0 + i % 200
                order = {"order_id": f"o-{i}", "customer": f"customer-{i % 17}", "amount": amount}
                batch.append(Message("orders", json.dumps(order).encode(), keys=f"o-{i}"))
                if amount > 0:
                    billed.add(f"o-{i}")
            producer.send_batch(batch, queue_id=(start // 500) % 4)
    return billed


def test_pipeline_submitted_to_a_standalone_cluster_survives_an_executor_kill_exactly_once(
    cluster: StandaloneCluster, broker: BrokerThread, tmp_path: Path
) -> None:
    build, submit = recipe()
    env = clean_env(
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(VENV_BIN.parent)
    )
    built = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", build],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert built.returncode == 0, f"the doc's build steps failed:\n{built.stdout}\n{built.stderr}"
    assert (ROOT / "build" / "txmq-pyfiles.zip").is_file()

    python = worker_python(tmp_path / "worker-python")
    checkpoint = tmp_path / "ckpt"
    command = submit
    for doc_value, value in (
        ("spark://spark-master:7077", cluster.url),
        ("spark.pyspark.python=python3", f"spark.pyspark.python={python}"),
        ("broker-host:10911", broker.address),
        ("hdfs:///checkpoints/pipeline", str(checkpoint)),
    ):
        assert doc_value in command, f"docs/spark.md's spark-submit no longer has {doc_value}"
        command = command.replace(doc_value, value)
    command = command.rstrip() + " --available-now\n"

    billed = seed_orders(broker.address)
    log = tmp_path / "submit.log"
    with log.open("wb") as out:
        job = subprocess.Popen(
            ["bash", "-c", command],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def context() -> str:
            return f"{log.read_text(errors='replace')[-6000:]}\n{cluster.logs()}"

        # Kill the executor while it writes the first micro-batch: the broker holds halves of
        # the sink's transactions, the batch is not decided.
        def writing() -> bool:
            if job.poll() is not None:
                raise AssertionError(f"the job ended before it wrote anything\n{context()}")
            metadata = checkpoint / "metadata"
            if not metadata.exists():
                return False
            group = "txmq-spark-" + json.loads(metadata.read_text())["id"]
            return any(r["halves"] for r in transactions(broker.address, group, "PENDING"))

        wait_until_sync(writing, timeout=JOB_TIMEOUT, what="the sink's halves of batch 0")
        executors = cluster.executors()
        assert len(executors) == 1, f"executors: {executors}\n{context()}"
        os.kill(executors[0], signal.SIGKILL)
        killed_at = time.monotonic()

        try:
            rc = job.wait(JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job ran over {JOB_TIMEOUT}s\n{context()}") from None
        assert rc == 0, f"spark-submit exited with {rc}\n{context()}"
        driver_log = log.read_text(errors="replace")
        assert re.search(r"\[batchId = 0\] Lost task .*ExecutorLostFailure", driver_log), context()
        assert re.search(r"Asked to launch executor app-\S+/1 ", cluster.worker_log()), context()
        print(f"job finished {time.monotonic() - killed_at:.1f}s after the executor was killed")
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait(10)

    keys = Counter(m.keys for m in pull_all(broker.address, "billing"))
    twice = [k for k, n in keys.items() if n > 1]
    assert not twice, f"billed twice: {twice[:10]}"
    assert set(keys) == billed, (
        f"missing {len(billed - set(keys))}, unexpected {len(set(keys) - billed)}"
    )
    group = "txmq-spark-" + json.loads((checkpoint / "metadata").read_text())["id"]
    # The killed executor's halves were rolled back by the batch's decision.
    states = by_state(transactions(broker.address, group))
    assert "PENDING" not in states and "ROLLED_BACK" in states, sorted(states)

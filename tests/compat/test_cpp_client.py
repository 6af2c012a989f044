"""Apache rocketmq-client-cpp 1.2 (PyPI ``rocketmq==0.4.4``, JSON headers) against a real
broker: every send mode, push with a tag filter, pull, resuming a group, RECONSUME_LATER,
compressed bodies, a half message and its check-back, and interop with the txmq SDK."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.compat.stock import ClientRun, StockClient, cpp_client, sdk_messages
from tests.conftest import BrokerThread
from tests.support.raw import RawClient
from tests.support.waiting import wait_until_sync
from txmq.client import Message, Producer, PullConsumer
from txmq.protocol.codes import RequestCode, SerializeType
from txmq.protocol.command import RemotingCommand

pytestmark = pytest.mark.slow

COMMIT = 8


@pytest.fixture
def cpp(tmp_path: Path) -> StockClient:
    return cpp_client(tmp_path / "home")


@pytest.fixture
def stock_broker(broker_thread_factory: Callable[..., BrokerThread]) -> Iterator[BrokerThread]:
    # Checks every 200 ms after 300 ms, with a budget that outlasts the tests.
    yield broker_thread_factory(transaction_check_max=10_000)


def sdk_bodies(address: str, topic: str) -> list[bytes]:
    return [m.body for m in sdk_messages(address, topic)]


def group_at_end(address: str, group: str, topics: list[str]) -> bool:
    """Whether ``group``'s committed offset is at the end of every queue of ``topics`` (a
    queue it never stored an offset for counts when it is empty)."""
    with PullConsumer(group, broker=address) as c:
        for topic in topics:
            for q in c.fetch_queues(topic):
                if (c.committed_offset(topic, q) or 0) != c.max_offset(topic, q):
                    return False
    return True


def _collect(stream: IO[str] | None, into: list[str]) -> None:
    if stream is not None:
        into.extend(stream)


def push_until_settled(
    cpp: StockClient,
    broker: BrokerThread,
    topic: str,
    group: str,
    expect: int,
    *args: object,
    topics: list[str] | None = None,
) -> ClientRun:
    """Run the stock push consumer until it has received ``expect`` messages and ``group``'s
    committed offsets are at the end of ``topics`` (default: the topic): every message it
    pulled was consumed, so a duplicate would be in its output by then.  What "room for a
    duplicate" waits on, instead of a fixed linger."""
    stop = Path(cpp.env["HOME"]) / f"stop-{group}-{time.monotonic_ns()}"
    stop.parent.mkdir(parents=True, exist_ok=True)
    proc = cpp.start(
        "push", broker.address, topic, group, "--expect", expect, "--stop-file", stop, *args
    )
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=_collect, args=(f, into), daemon=True)
        for f, into in ((proc.stdout, out), (proc.stderr, err))
    ]
    for r in readers:
        r.start()

    def received() -> int:
        return sum('"event": "received"' in line for line in list(out))

    try:
        wait_until_sync(
            lambda: received() >= expect or proc.poll() is not None,
            90,
            f"{expect} deliveries to {group}",
        )
        if proc.poll() is None:
            wait_until_sync(
                lambda: group_at_end(broker.address, group, topics or [topic]),
                60,
                f"{group}'s committed offsets at the end of {topics or [topic]}",
            )
    finally:
        stop.touch()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        for r in readers:
            r.join(10)
    docs = [json.loads(line) for line in out if line.startswith("{")]
    return ClientRun(proc.returncode, docs, "".join(err))


def test_every_send_mode_reaches_a_push_consumer_filtering_on_tags(
    stock_broker: BrokerThread, cpp: StockClient
) -> None:
    addr, topic = stock_broker.address, "cpp-modes"
    cpp.run(
        "send", addr, topic, "--mode", "sync", "--count", 3, "--tags", "TagA", "--prefix", "s"
    ).check()
    cpp.run(
        "send", addr, topic, "--mode", "oneway", "--count", 2, "--tags", "TagB", "--prefix", "o"
    ).check()
    cpp.run(
        "send", addr, topic, "--mode", "orderly", "--count", 2, "--tags", "TagA", "--prefix", "f"
    ).check()
    batch = cpp.run(
        "send", addr, topic, "--mode", "batch", "--count", 3, "--tags", "TagB", "--prefix", "b"
    ).check()
    assert batch.docs[0]["status"] == 0
    cpp.run(
        "send", addr, topic, "--count", 1, "--tags", "TagB", "--prefix", "big", "--body-size", 6144
    ).check()
    cpp.run("send", addr, topic, "--count", 2, "--tags", "TagC", "--prefix", "c").check()

    run = push_until_settled(
        cpp, stock_broker, topic, "cpp-push", 11, "--expr", "TagA || TagB", "--timeout", 60
    ).check()
    got = run.events("received")
    bodies = sorted(str(d["body"]).rstrip(".") for d in got)
    assert bodies == sorted(
        ["s-0", "s-1", "s-2", "o-0", "o-1", "f-0", "f-1", "b-0", "b-1", "b-2", "big-0"]
    ), "each message exactly once, none tagged TagC"
    # Orderly sends with one sharding key land in one queue, in order.
    ordered = [d for d in got if str(d["body"]).startswith("f-")]
    assert len({d["queue_id"] for d in ordered}) == 1
    assert [d["body"] for d in sorted(ordered, key=lambda d: d["queue_offset"])] == ["f-0", "f-1"]
    # The client compressed the 6 KiB body (sys flag bit 0); its consumer and the SDK's both
    # see it whole.
    [big] = [d for d in got if str(d["body"]).startswith("big-")]
    assert big["body_len"] == 6144
    sdk = [b for b in sdk_bodies(addr, topic) if b.startswith(b"big-")]
    assert sdk == [b"big-0" + b"." * (6144 - 5)]


def test_pull_consumer_reads_what_the_sdk_sent(
    stock_broker: BrokerThread, cpp: StockClient
) -> None:
    addr, topic = stock_broker.address, "cpp-pull"
    with Producer("sdk-producer", broker=addr) as p:
        for i in range(6):
            p.send(Message(topic, f"sdk-{i}".encode(), tags="T", keys=f"k{i}"))
    run = cpp.run("pull", addr, topic, "cpp-puller", "--expect", 6, "--timeout", 60).check()
    got = run.events("received")
    assert sorted(d["body"] for d in got) == [f"sdk-{i}" for i in range(6)]
    assert {d["tags"] for d in got} == {"T"}


def test_a_group_resumes_where_it_stopped_without_repeats_or_gaps(
    stock_broker: BrokerThread, cpp: StockClient
) -> None:
    addr, topic = stock_broker.address, "cpp-resume"
    cpp.run("send", addr, topic, "--count", 4, "--prefix", "first").check()
    first = push_until_settled(cpp, stock_broker, topic, "cpp-resumer", 4).check()
    assert sorted(d["body"] for d in first.events("received")) == [f"first-{i}" for i in range(4)]
    cpp.run("send", addr, topic, "--count", 3, "--prefix", "second").check()
    again = push_until_settled(cpp, stock_broker, topic, "cpp-resumer", 3).check()
    assert sorted(d["body"] for d in again.events("received")) == [f"second-{i}" for i in range(3)]


def test_reconsume_later_is_delivered_again(stock_broker: BrokerThread, cpp: StockClient) -> None:
    addr, topic = stock_broker.address, "cpp-retry"
    cpp.run("send", addr, topic, "--count", 2, "--prefix", "r").check()
    run = push_until_settled(
        cpp,
        stock_broker,
        topic,
        "cpp-retrier",
        2,
        "--fail-first",
        "--timeout",
        60,
        topics=[topic, "%RETRY%cpp-retrier"],
    ).check()
    assert sorted(d["body"] for d in run.events("reconsume_later")) == ["r-0", "r-1"]
    again = run.events("received")
    assert sorted(d["body"] for d in again) == ["r-0", "r-1"]
    assert all(d["reconsume_times"] >= 1 for d in again)


def test_a_half_stays_invisible_and_the_check_back_is_decoded_by_the_client(
    stock_broker: BrokerThread, cpp: StockClient, tmp_path: Path
) -> None:
    addr, topic, group = stock_broker.address, "cpp-half", "cpp-tx"
    proc = cpp.start(
        "send",
        addr,
        topic,
        "--group",
        group,
        "--prefix",
        "half",
        "--property",
        "TRAN_MSG=true",
        "--property",
        f"PGROUP={group}",
        "--linger",
        60,
    )
    try:
        logs = tmp_path / "home" / "logs" / "rocketmq-cpp"
        check = _wait_for_check(logs, timeout=60)
        assert sdk_bodies(addr, topic) == [], "a half is invisible until it is decided"
        raw = stock_broker.call(RawClient.connect(addr))
        try:
            # The decision a stock producer sends after a check, from what the check carried:
            # END_TRANSACTION, oneway, in JSON.
            stock_broker.call(_end_oneway(raw, group, check, COMMIT))
            deadline = time.monotonic() + 30
            while sdk_bodies(addr, topic) != [b"half-0"]:
                assert time.monotonic() < deadline, "the committed half never became visible"
                time.sleep(0.05)
        finally:
            stock_broker.call(raw.close())
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def _wait_for_check(logs: Path, timeout: float) -> dict[str, str]:
    """The fields of the first CHECK_TRANSACTION_STATE header the client's log says it decoded
    (``CheckTransactionStateRequestHeader: msgId:... transactionId:... commitLogOffset:...``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in sorted(logs.glob("*.log*")) if logs.exists() else []:
            for line in f.read_text(errors="replace").splitlines():
                _, found, rest = line.partition("CheckTransactionStateRequestHeader:")
                if found:
                    fields = dict(w.split(":", 1) for w in rest.split("[")[0].split() if ":" in w)
                    if "transactionId" in fields and "commitLogOffset" in fields:
                        return fields
        time.sleep(0.1)
    pytest.fail(f"the client did not log a decoded check-back within {timeout}s")


async def _end_oneway(raw: RawClient, group: str, check: dict[str, str], decision: int) -> None:
    ext = {
        "producerGroup": group,
        "tranStateTableOffset": check["tranStateTableOffset"],
        "commitLogOffset": check["commitLogOffset"],
        "commitOrRollback": str(decision),
        "fromTransactionCheck": "1",
        "msgId": check["msgId"],
        "transactionId": check["transactionId"],
    }
    raw.conn.send_oneway(
        RemotingCommand.request(RequestCode.END_TRANSACTION, ext, serialize_type=SerializeType.JSON)
    )


def test_the_stock_orderly_consumer_locks_its_queues_and_keeps_each_key_in_order(
    stock_broker: BrokerThread, cpp: StockClient
) -> None:
    addr, topic, group = stock_broker.address, "cpp-orderly", "cpp-orderly-group"
    keys, per_key = 4, 15
    total = keys * per_key
    # Message i goes with sharding key i % keys: one queue per key, in the order sent.
    cpp.run(
        "send", addr, topic, "--mode", "orderly", "--count", total, "--keys", keys, "--prefix", "o"
    ).check()
    run = push_until_settled(
        cpp, stock_broker, topic, group, total, "--orderly", "--threads", 4, "--timeout", 60
    ).check()
    got = run.events("received")
    assert sorted(int(str(d["body"]).split("-")[1]) for d in got) == list(range(total))
    by_key: dict[int, list[dict[str, object]]] = {}
    for d in got:  # in the order the callbacks finished
        i = int(str(d["body"]).split("-")[1])
        by_key.setdefault(i % keys, []).append(d)
    for key, docs in by_key.items():
        seqs = [int(str(d["body"]).split("-")[1]) // keys for d in docs]
        assert seqs == list(range(per_key)), f"key {key} handled out of order: {seqs}"
        assert len({d["queue_id"] for d in docs}) == 1
        spans = sorted((float(str(d["start"])), float(str(d["end"]))) for d in docs)
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"key {key}: two callbacks of its queue ran at once"
    assert len({d["queue_id"] for d in got}) == keys
    # The client consumed only after the broker granted it each queue's lock (its log says
    # so), and its locks ended with it.
    logs = Path(cpp.env["HOME"]) / "logs" / "rocketmq-cpp"
    text = "".join(f.read_text(errors="replace") for f in sorted(logs.glob("*.log*")))
    assert f"lockBatchMQ success of mq:MessageQueue [topic={topic}" in text or (
        f"lock success of mq:MessageQueue [topic={topic}" in text
    ), "no granted lock in the client's log"
    assert stock_broker.controller is not None
    controller = stock_broker.controller
    wait_until_sync(
        lambda: stock_broker.run(lambda: controller.locks.held()) == 0,
        30,
        "the client's locks released once it stopped",
    )

"""The official RocketMQ 5 Node.js client (npm ``rocketmq-client-nodejs``, the version locked in
``tests/compat/node5/package-lock.json``) against the broker's gRPC front end.

``make node5-client``, which ``make test`` runs before pytest, installs it with ``npm ci`` into
``build/clients/node5``; the tests do the same when it is missing.  Each case runs
``tests/compat/node5_client.js`` with Node as a subprocess with bounded timeouts.  Without the
client the tests are skipped with the reason, and fail when the environment variable CI is set.

The resend case puts a gRPC proxy between the client and the broker that holds the first
SendMessage answer until the client gave up on it, so the client sends the message again with
the same message id.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.compat.stock import run_setup, sdk_messages
from tests.compat.test_grpc_fifo import two_message_groups
from tests.conftest import BrokerThread
from tests.support.unavailable import unavailable
from tests.support.waiting import wait_until_sync
from txmq.client import AdminClient

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CLIENT_DIR = ROOT / "build" / "clients" / "node5"
LOCK_DIR = HERE / "node5"
STAMP = CLIENT_DIR / ".installed"
SCRIPT = HERE / "node5_client.js"
#: Seconds one client run may take.
RUN_TIMEOUT = 90.0
QUEUES = 4


def _installed() -> bool:
    lock = CLIENT_DIR / "package-lock.json"
    return (
        STAMP.exists()
        and lock.exists()
        and lock.read_bytes() == (LOCK_DIR / "package-lock.json").read_bytes()
    )


def _client_missing() -> str | None:
    """Install the client if ``make node5-client`` has not (same steps); the reason if it
    cannot be."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are not on the PATH"
    if not _installed():
        print(f"installing rocketmq-client-nodejs into {CLIENT_DIR}", file=sys.stderr)
        shutil.rmtree(CLIENT_DIR, ignore_errors=True)
        CLIENT_DIR.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(LOCK_DIR / name, CLIENT_DIR / name)
        err = run_setup(
            ["npm", "ci", "--quiet", "--no-audit", "--no-fund", "--ignore-scripts"], CLIENT_DIR
        )
        if err is not None:
            return err
        STAMP.touch()
    return run_setup(["node", "-e", "require('rocketmq-client-nodejs').PushConsumer"], CLIENT_DIR)


def client_version() -> str:
    lock = json.loads((LOCK_DIR / "package-lock.json").read_text())
    return str(lock["packages"]["node_modules/rocketmq-client-nodejs"]["version"])


class NodeProc:
    """One client process started in the background: its JSON lines as they come."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _first(
        self, wanted: Callable[[dict[str, Any]], bool], timeout: float, what: str, until: str
    ) -> dict[str, Any]:
        """The next line that is ``wanted``, skipping others; fails, naming ``what`` it waited
        for (``until``: how the exit message names it), when the process ends first or after
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                doc = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {what} within {timeout}s: {''.join(self.stderr)[-3000:]}")
            if doc is None:
                self.proc.wait(10)
                pytest.fail(
                    f"client exited {self.proc.returncode}{until}: {''.join(self.stderr)[-3000:]}"
                )
            if wanted(doc):
                return doc

    def event(self, name: str, timeout: float) -> dict[str, Any]:
        """The next line that is event ``name``; fails when the process ends first or after
        ``timeout``."""
        return self._first(
            lambda d: d.get("event") == name, timeout, f"{name} event", f" before {name}"
        )

    def finish(self, timeout: float = 30) -> dict[str, Any]:
        """Tell the process to end (a line on stdin); its result."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("done\n")
        self.proc.stdin.flush()
        doc = self.event_result(timeout)
        self.proc.wait(timeout)
        return doc

    def event_result(self, timeout: float) -> dict[str, Any]:
        return dict(self._first(lambda d: "result" in d, timeout, "result", "")["result"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@dataclass
class Node5:
    """Runs ``node5_client.js`` with the installed client."""

    env: dict[str, str]
    started: list[NodeProc] = field(default_factory=list)

    def argv(self, args: dict[str, Any]) -> list[str]:
        return ["node", str(SCRIPT), json.dumps(args)]

    def run(self, **args: Any) -> dict[str, Any]:
        """One operation to its end; its result, or a failure with the client's output."""
        try:
            proc = subprocess.run(
                self.argv(args), capture_output=True, text=True, timeout=RUN_TIMEOUT, env=self.env
            )
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            pytest.fail(f"client {args['op']} did not finish within {RUN_TIMEOUT}s: {err[-3000:]}")
        if proc.returncode != 0:
            pytest.fail(
                f"client {args['op']} exited {proc.returncode}\n--- stderr ---\n"
                f"{proc.stderr[-4000:]}\n--- stdout ---\n{proc.stdout[-2000:]}"
            )
        docs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        return dict(docs[-1]["result"])

    def start(self, **args: Any) -> NodeProc:
        p = NodeProc(self.argv(args), self.env)
        self.started.append(p)
        return p


@pytest.fixture(scope="module")
def node5_client(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    reason = _client_missing()
    if reason is not None:
        unavailable(f"RocketMQ 5 Node.js client unavailable: {reason}")
    # HOME: the client's consume service logs to $HOME/logs/rocketmq whatever logger it is given
    home = tmp_path_factory.mktemp("node5-home")
    return {**os.environ, "NODE_PATH": str(CLIENT_DIR / "node_modules"), "HOME": str(home)}


@pytest.fixture
def node5(node5_client: dict[str, str]) -> Iterator[Node5]:
    n = Node5(node5_client)
    try:
        yield n
    finally:
        for p in n.started:
            p.kill()


@pytest.fixture
def grpc_broker(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(
        grpc_server_enable=True,
        grpc_server_port=0,
        transaction_check_max=10_000,
        default_topic_queue_nums=QUEUES,
    )


def endpoint(bt: BrokerThread) -> str:
    assert bt.controller is not None
    return f"127.0.0.1:{bt.controller.grpc_port}"


def committed(bt: BrokerThread, group: str, topic: str) -> int:
    def get() -> int:
        assert bt.controller is not None
        return sum(bt.controller.offsets.offsets(group, topic).values())

    return int(bt.run(get))


def tx_record(bt: BrokerThread, txid: str) -> Any:
    def get() -> Any:
        assert bt.controller is not None
        return bt.controller.transactions.records.get(txid)

    return bt.run(get)


def tx_state(bt: BrokerThread, txid: str) -> str | None:
    rec = tx_record(bt, txid)
    return None if rec is None else str(rec.state.value)


def test_client_version_is_the_locked_one(node5_client: dict[str, str]) -> None:
    installed = json.loads(
        (CLIENT_DIR / "node_modules" / "rocketmq-client-nodejs" / "package.json").read_text()
    )
    assert installed["version"] == client_version()


def test_send_then_simple_consumer_receives_and_acks(
    grpc_broker: BrokerThread, node5: Node5
) -> None:
    ep, topic, group = endpoint(grpc_broker), "node5-normal", "node5-g"
    sent = node5.run(
        op="send",
        endpoint=ep,
        topic=topic,
        messages=[
            {"body": "one", "tag": "TagA", "keys": ["k1", "k2"], "properties": {"color": "red"}},
            {"body": "two", "tag": "TagB"},
            {"body": "three"},
        ],
    )
    assert len(set(sent["ids"])) == 3
    # stored as a remoting consumer sees them, under the client's message ids
    stored = {m.body: m for m in sdk_messages(grpc_broker.address, topic)}
    assert sorted(stored) == [b"one", b"three", b"two"]
    assert stored[b"one"].tags == "TagA" and sorted((stored[b"one"].keys or "").split()) == [
        "k1",
        "k2",
    ]
    assert stored[b"one"].user_properties == {"color": "red"}
    assert {m.msg_id for m in stored.values()} == set(sent["ids"])
    got = node5.run(op="receive", endpoint=ep, topic=topic, group=group, count=3, timeout=20)
    by_body = {m["body"]: m for m in got["messages"]}
    assert sorted(by_body) == ["one", "three", "two"]
    assert by_body["one"]["tag"] == "TagA" and by_body["one"]["keys"] == ["k1", "k2"]
    assert by_body["one"]["properties"] == {"color": "red"}
    assert by_body["two"]["tag"] == "TagB"
    assert {m["id"] for m in got["messages"]} == set(sent["ids"])
    assert {m["attempt"] for m in got["messages"]} == {1}
    assert not any(m["corrupted"] for m in got["messages"])  # the body digest checks out
    # acked: the group's committed offsets cover every message
    wait_until_sync(lambda: committed(grpc_broker, group, topic) == 3, 10, "the 3 acks committed")


def test_unacked_message_comes_back_after_the_invisible_duration(
    grpc_broker: BrokerThread, node5: Node5
) -> None:
    ep, topic, group = endpoint(grpc_broker), "node5-redeliver", "node5-re"
    node5.run(op="send", endpoint=ep, topic=topic, messages=[{"body": "again"}])
    first = node5.run(
        op="receive",
        endpoint=ep,
        topic=topic,
        group=group,
        count=1,
        ack=False,
        invisible_s=2,
        timeout=15,
    )
    [m1] = first["messages"]
    assert (m1["body"], m1["attempt"]) == ("again", 1)
    assert committed(grpc_broker, group, topic) == 0
    second = node5.run(
        op="receive", endpoint=ep, topic=topic, group=group, count=1, invisible_s=5, timeout=20
    )
    [m2] = second["messages"]
    assert (m2["body"], m2["attempt"], m2["id"]) == ("again", 2, m1["id"])
    # not before the invisible duration was over (the first receipt was stamped after the
    # broker handed it out, hence the small allowance)
    assert m2["received_at"] - m1["received_at"] >= 2000 - 250, (m1, m2)
    wait_until_sync(lambda: committed(grpc_broker, group, topic) == 1, 10, "the ack committed")


def make_orderly(bt: BrokerThread, group: str) -> None:
    with AdminClient(bt.address) as admin:
        admin.update_group_config(group, orderly=True)
        assert admin.group_config(group)["consumeMessageOrderly"] is True


def test_fifo_message_groups_keep_their_order(grpc_broker: BrokerThread, node5: Node5) -> None:
    ep, topic, group = endpoint(grpc_broker), "node5-fifo", "node5-fifo-g"
    a, b = two_message_groups(QUEUES)
    specs = [("a1", a), ("b1", b), ("a2", a), ("b2", b), ("a3", a), ("b3", b), ("a4", a)]
    sent = node5.run(
        op="send",
        endpoint=ep,
        topic=topic,
        messages=[{"body": body, "group": g} for body, g in specs],
    )
    assert len(set(sent["ids"])) == len(specs)
    # one message group, one queue, in send order
    stored = sdk_messages(grpc_broker.address, topic, QUEUES)
    for g in (a, b):
        of_g = [m for m in stored if m.properties.get("__SHARDINGKEY") == g]
        assert len({m.queue_id for m in of_g}) == 1, g
        by_offset = sorted(of_g, key=lambda m: m.queue_offset)
        assert [m.body.decode() for m in by_offset] == [s for s, gg in specs if gg == g]
    make_orderly(grpc_broker, group)
    out = node5.run(
        op="push", endpoint=ep, topic=topic, group=group, count=6, fail_once=["a2"], timeout=60
    )
    assert out["fifo"] is True  # the broker's settings answer made the client consume FIFO
    handled = out["handled"]

    def of(g: str) -> list[tuple[str, bool]]:
        return [(r["body"], r["failed"]) for r in handled if r["group"] == g]

    # each message group handled one message at a time, in send order.  The failed a2 is not
    # retried: client 1.0.8 reads no retry policy from settings with a customized backoff (the
    # delay levels, as RocketMQ's proxy sends by default), so it allows one attempt and
    # forwards the message to the dead-letter queue, then goes on with a3
    assert of(a) == [("a1", False), ("a2", True), ("a3", False), ("a4", False)], handled
    assert of(b) == [("b1", False), ("b2", False), ("b3", False)], handled
    dlq = wait_until_sync(
        lambda: sdk_messages(grpc_broker.address, f"%DLQ%{group}", 1), 10, "a2 dead-lettered"
    )
    assert [m.body for m in dlq] == [b"a2"]
    wait_until_sync(lambda: committed(grpc_broker, group, topic) == 7, 10, "all 7 settled")


def test_delivery_timestamp_is_honoured(grpc_broker: BrokerThread, node5: Node5) -> None:
    ep, topic, group = endpoint(grpc_broker), "node5-delay", "node5-delay-g"
    sent = node5.run(
        op="send",
        endpoint=ep,
        topic=topic,
        messages=[{"body": "later", "delay_ms": 3000}, {"body": "now"}],
    )
    deliver_at = sent["receipts"][0]["deliver_at"]
    # the message without a delivery time is stored at once; the delayed one is not yet
    stored = sdk_messages(grpc_broker.address, topic)
    if time.time() * 1000 < deliver_at:
        assert [m.body for m in stored] == [b"now"]
    got = node5.run(op="receive", endpoint=ep, topic=topic, group=group, count=2, timeout=30)
    by_body = {m["body"]: m for m in got["messages"]}
    assert sorted(by_body) == ["later", "now"]
    later = by_body["later"]
    assert later["delivery_timestamp"] == deliver_at
    assert later["received_at"] >= deliver_at, later["received_at"] - deliver_at
    [m] = [m for m in sdk_messages(grpc_broker.address, topic) if m.body == b"later"]
    # stored in its topic at the delivery time, not before (the timer's 100 ms granularity)
    assert 0 <= m.store_timestamp - deliver_at <= 1000, m.store_timestamp - deliver_at


def test_transaction_commit_and_rollback(grpc_broker: BrokerThread, node5: Node5) -> None:
    ep, topic = endpoint(grpc_broker), "node5-tx"
    yes = node5.run(
        op="transaction",
        endpoint=ep,
        topic=topic,
        decision="commit",
        message={"body": "yes", "tag": "T"},
    )
    no = node5.run(
        op="transaction", endpoint=ep, topic=topic, decision="rollback", message={"body": "no"}
    )
    assert tx_state(grpc_broker, yes["transaction_id"]) == "COMMITTED"
    assert tx_state(grpc_broker, no["transaction_id"]) == "ROLLED_BACK"
    got = node5.run(
        op="receive", endpoint=ep, topic=topic, group="node5-tx-g", count=1, drain=True, timeout=20
    )
    assert [(m["body"], m["id"]) for m in got["messages"]] == [("yes", yes["id"])]
    assert [m.body for m in sdk_messages(grpc_broker.address, topic)] == [b"yes"]


def test_half_of_a_dead_producer_is_decided_by_a_live_producers_check(
    grpc_broker: BrokerThread, node5: Node5
) -> None:
    ep, topic = endpoint(grpc_broker), "node5-orphan"
    # a producer whose checker answers nothing (UNKNOWN) sends a half and dies undecided
    dead = node5.start(op="half", endpoint=ep, topic=topic, message={"body": "orphan"}, timeout=60)
    half = dead.event("half_sent", 30)
    dead.kill()
    assert tx_state(grpc_broker, half["transaction_id"]) == "PENDING"
    # a live producer of the same topic has a checker: the broker asks it, it commits
    live = node5.start(op="checker", endpoint=ep, topic=topic, check_answer="commit", timeout=60)
    live.event("ready", 30)
    checked = live.event("checked", 30)
    assert checked["message_id"] == half["id"] and checked["body"] == "orphan"
    wait_until_sync(
        lambda: tx_state(grpc_broker, half["transaction_id"]) == "COMMITTED",
        30,
        "the check-back commit",
    )
    result = live.finish()
    assert {c["message_id"] for c in result["checked"]} == {half["id"]}
    rec = tx_record(grpc_broker, half["transaction_id"])
    assert rec.decided_by == "check" and rec.check_times >= 1
    got = node5.run(
        op="receive",
        endpoint=ep,
        topic=topic,
        group="node5-orphan-g",
        count=1,
        drain=True,
        timeout=20,
    )
    assert [(m["body"], m["id"]) for m in got["messages"]] == [("orphan", half["id"])]


def test_push_consumer_consumes_and_retries_a_failure(
    grpc_broker: BrokerThread, node5: Node5
) -> None:
    ep, topic, group = endpoint(grpc_broker), "node5-push", "node5-push-g"
    node5.run(op="send", endpoint=ep, topic=topic, messages=[{"body": "p1"}, {"body": "p2"}])
    out = node5.run(
        op="push", endpoint=ep, topic=topic, group=group, count=2, fail_once=["p2"], timeout=60
    )
    assert out["fifo"] is False
    attempts = {m["body"]: m["attempt"] for m in out["messages"]}
    assert attempts == {"p1": 1, "p2": 2}  # p2 failed once and was delivered again
    assert [(h["body"], h["attempt"]) for h in out["handled"] if h["failed"]] == [("p2", 1)]
    wait_until_sync(lambda: committed(grpc_broker, group, topic) == 2, 10, "both acked")


# -- resend after a lost answer -------------------------------------------------------------


class StallingProxy:
    """A gRPC proxy for ``apache.rocketmq.v2.MessagingService``: every call goes to the broker
    as it came (bytes and metadata), every answer back, except the first SendMessage answer,
    which it holds until the client gave up on that call (its deadline passed)."""

    def __init__(self, upstream: str) -> None:
        self.channel = grpc.insecure_channel(upstream)
        self.sends: list[list[str]] = []  # the message ids of each SendMessage, in order
        #: whether that answer was held until the client gave up (within 30 s)
        self.held: list[bool] = []
        self.lock = threading.Lock()
        service = spb.DESCRIPTOR.services_by_name["MessagingService"]
        handlers: dict[str, Any] = {}
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            handlers[method.name] = self._handler(path, method)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service.full_name, handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @staticmethod
    def _metadata(context: Any) -> list[tuple[str, str]]:
        return [
            (k, v)
            for k, v in context.invocation_metadata()
            if not k.startswith(":") and k not in ("user-agent", "te", "content-type")
        ]

    def _handler(self, path: str, method: Any) -> Any:
        ch = self.channel
        if method.client_streaming and method.server_streaming:
            call = ch.stream_stream(path)

            def bidi(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
                upstream = call(requests, metadata=self._metadata(context))
                context.add_callback(upstream.cancel)
                yield from upstream

            return grpc.stream_stream_rpc_method_handler(bidi)
        if method.server_streaming:
            ustream = ch.unary_stream(path)

            def server_stream(request: bytes, context: Any) -> Iterator[bytes]:
                upstream = ustream(request, metadata=self._metadata(context), timeout=60)
                context.add_callback(upstream.cancel)
                yield from upstream

            return grpc.unary_stream_rpc_method_handler(server_stream)
        unary = ch.unary_unary(path)

        def one(request: bytes, context: Any) -> bytes:
            answer: bytes = unary(request, metadata=self._metadata(context), timeout=30)
            if method.name == "SendMessage":
                ids = [
                    m.system_properties.message_id
                    for m in spb.SendMessageRequest.FromString(request).messages
                ]
                with self.lock:
                    index = len(self.sends)
                    self.sends.append(ids)
                    self.held.append(False)
                if index == 0:
                    # stored by the broker; the answer is held until the client gave up on it
                    gave_up = threading.Event()
                    if not context.add_callback(gave_up.set):
                        gave_up.set()  # over already
                    self.held[index] = gave_up.wait(30)
            return answer

        return grpc.unary_unary_rpc_method_handler(one)

    def close(self) -> None:
        self.server.stop(grace=None).wait(10)
        self.channel.close()


@pytest.fixture
def proxy(grpc_broker: BrokerThread) -> Iterator[StallingProxy]:
    p = StallingProxy(endpoint(grpc_broker))
    try:
        yield p
    finally:
        p.close()


def test_resend_after_a_lost_answer_is_stored_and_delivered_once(
    grpc_broker: BrokerThread, node5: Node5, proxy: StallingProxy
) -> None:
    topic, group = "node5-resend", "node5-resend-g"
    sent = node5.run(
        op="send",
        endpoint=f"127.0.0.1:{proxy.port}",
        topic=topic,
        request_timeout_ms=2000,
        messages=[{"body": "once"}, {"body": "after"}],
    )
    once_id, after_id = sent["ids"]
    # the first answer was held past the client's timeout: it sent the same message again
    assert proxy.sends == [[once_id], [once_id], [after_id]], proxy.sends
    assert proxy.held == [True, False, False]
    stored = sdk_messages(grpc_broker.address, topic)
    assert sorted((m.body, m.msg_id) for m in stored) == [
        (b"after", after_id),
        (b"once", once_id),
    ], "stored once each"
    # the resend was answered with the first send's receipt
    [once] = [m for m in stored if m.msg_id == once_id]
    assert sent["receipts"][0]["offset"] == once.queue_offset
    got = node5.run(
        op="receive",
        endpoint=endpoint(grpc_broker),
        topic=topic,
        group=group,
        count=2,
        drain=True,
        timeout=30,
    )
    assert sorted(m["body"] for m in got["messages"]) == ["after", "once"]
    wait_until_sync(lambda: committed(grpc_broker, group, topic) == 2, 10, "both acked")

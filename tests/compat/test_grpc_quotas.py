"""Quotas on the RocketMQ 5 gRPC front end, over the broker's generated stubs with signed calls
(ACL accounts from a real plain_acl.yml): an account over its produce rate is delayed, then
refused with ``Code.TOO_MANY_REQUESTS`` (42900) naming it and its limit, while another account's
sends all succeed unthrottled; a consume rate delays and then refuses ReceiveMessage; each
Telemetry stream counts against ``maxConnections``; every throttle and refusal is counted in
``txmq_quota_throttled_total`` as on the remoting port."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.test_grpc_python5 import endpoint, py5, stock_send, stock_send_refused
from tests.conftest import BrokerThread
from tests.support.acl_files import acl_file, open_account, write_acl
from tests.support.grpc_probes import receive_request
from tests.support.waiting import wait_until_sync
from txmq.protocol.acl import GRPC_AUTHORIZATION, GRPC_DATE_TIME, grpc_authorization

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402

__all__ = ["py5"]  # the fixture, imported for this module's tests

RATE = 64 * 1024
CONSUME_RATE = 32 * 1024
TOO_MANY_REQUESTS = 42900
ACL_FILE = acl_file(
    open_account("flooder", "secret-flood-1", produceByteRate=RATE),
    open_account("quieter", "secret-quiet-1"),
    open_account("reader", "secret-read-1", consumeByteRate=CONSUME_RATE),
    open_account("trickle", "secret-trickle-1", produceByteRate=100),
    open_account("limited", "secret-limit-1", maxConnections=1),
)
SECRETS = {
    "flooder": "secret-flood-1",
    "quieter": "secret-quiet-1",
    "reader": "secret-read-1",
    "limited": "secret-limit-1",
    "trickle": "secret-trickle-1",
}


@pytest.fixture
def bt(broker_thread_factory: Callable[..., BrokerThread], tmp_path: Path) -> BrokerThread:
    path = write_acl(tmp_path, ACL_FILE)
    return broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, acl_enable=True, plain_acl_file=str(path)
    )


def md(who: str, client_id: str = "") -> list[tuple[str, str]]:
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return [
        ("x-mq-client-id", client_id or f"quota-{who}"),
        ("x-mq-language", "PYTHON"),
        (GRPC_DATE_TIME, now),
        (GRPC_AUTHORIZATION, grpc_authorization(who, SECRETS[who], now)),
    ]


def message(topic: str, body: bytes) -> Any:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_id = f"id-{time.monotonic_ns()}"
    m.system_properties.message_type = pb.NORMAL
    m.system_properties.born_host = "127.0.0.1"
    return m


def send(stub: Any, who: str, topic: str, body: bytes) -> Any:
    req = spb.SendMessageRequest(messages=[message(topic, body)])
    return stub.SendMessage(req, metadata=md(who), timeout=10)


def throttled(bt: BrokerThread, account: str, kind: str) -> float:
    assert bt.controller is not None
    snap = bt.run(bt.controller.metrics.snapshot)
    return float(snap.get(f"txmq_quota_throttled_total{{account={account},kind={kind}}}", 0))


def test_a_flooding_account_is_refused_with_42900_and_another_is_unaffected(
    bt: BrokerThread, stub: Any
) -> None:
    assert send(stub, "quieter", "calm", b"warm-up").status.code == pb.OK
    body = b"f" * (16 * 1024)
    stop = threading.Event()
    lock = threading.Lock()
    stored = 0
    refusals: list[Any] = []
    errors: list[BaseException] = []

    def flooder() -> None:
        nonlocal stored
        try:
            while not stop.is_set():
                r = send(stub, "flooder", "storm", body)
                with lock:
                    if r.status.code == pb.OK:
                        stored += len(body)
                    else:
                        refusals.append(r)
                        time.sleep(0.01)  # a client's next attempt
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=flooder, daemon=True) for _ in range(8)]
    started = time.monotonic()
    for t in threads:
        t.start()
    quiet: list[tuple[int, float]] = []
    try:
        while time.monotonic() - started < 3.0:
            t0 = time.perf_counter()
            r = send(stub, "quieter", "calm", b"q" * 200)
            quiet.append((r.status.code, time.perf_counter() - t0))
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    elapsed = time.monotonic() - started
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a flooder did not stop"

    # the flooder: throttled to its rate (a second of burst, a second of debt and what its
    # eight senders had in flight on top), refused with TOO_MANY_REQUESTS in the Status
    assert stored <= RATE * (elapsed + 2) + 8 * len(body), (stored, elapsed)
    assert stored >= RATE * 0.5, stored
    assert refusals, "the flooder was never refused"
    for r in refusals:
        assert r.status.code == TOO_MANY_REQUESTS, r.status
        assert r.status.message.startswith("[TOO_MANY_REQUESTS]"), r.status.message
        assert "'flooder'" in r.status.message and f"produceByteRate {RATE}" in r.status.message
        assert [e.status.code for e in r.entries] == [TOO_MANY_REQUESTS]
    assert throttled(bt, "flooder", "produce") >= len(refusals)

    # the other account: every send stored, none delayed by a quota
    assert quiet and all(code == pb.OK for code, _ in quiet), quiet[:5]
    assert throttled(bt, "quieter", "produce") == 0
    worst = max(s for _, s in quiet)
    assert worst < 0.5, f"the quiet account waited {worst:.3f}s"

    # and only what was acknowledged was stored
    def storm_bytes() -> int:
        assert bt.controller is not None
        store = bt.controller.store
        return sum(store.get_max_offset_in_queue("storm", q) for q in range(4)) * len(body)

    assert bt.run(storm_bytes) == stored


def receive(stub: Any, who: str, topic: str, group: str) -> tuple[Any, int]:
    """One ReceiveMessage: its status and the number of messages it returned."""
    r = receive_request(group, topic, batch=8, invisible_ms=60_000, poll_ms=100)
    items = list(stub.ReceiveMessage(r, metadata=md(who), timeout=15))
    return items[0].status, sum(1 for i in items if i.HasField("message"))


def test_a_consume_rate_delays_then_refuses_receive(bt: BrokerThread, stub: Any) -> None:
    body = b"r" * (8 * 1024)
    for _ in range(40):
        assert send(stub, "quieter", "reading", body).status.code == pb.OK
    # 64 KiB per receive against 32 KiB/s: the first puts the bucket a second in debt, the
    # second waits that second and adds another, the third is refused
    st, n = receive(stub, "reader", "reading", "readers")
    assert st.code == pb.OK and n == 8, st
    t0 = time.monotonic()
    st, n = receive(stub, "reader", "reading", "readers")
    waited = time.monotonic() - t0
    assert st.code == pb.OK and n == 8, st
    assert waited >= 0.7, f"the second receive was not delayed ({waited:.3f}s)"
    st, n = receive(stub, "reader", "reading", "readers")
    assert st.code == TOO_MANY_REQUESTS and n == 0, st
    assert "'reader'" in st.message and f"consumeByteRate {CONSUME_RATE}" in st.message
    assert throttled(bt, "reader", "consume") >= 2
    # another account reads at once
    t0 = time.monotonic()
    st, n = receive(stub, "quieter", "reading", "others")
    assert st.code == pb.OK and n == 8, st
    assert time.monotonic() - t0 < 0.7
    assert throttled(bt, "quieter", "consume") == 0


class Stream:
    """An open Telemetry call; its first answer is read, more commands can be written."""

    def __init__(self, stub: Any, who: str, client_id: str) -> None:
        self.commands: queue.Queue[Any] = queue.Queue()
        settings = spb.TelemetryCommand(
            settings=pb.Settings(
                client_type=pb.PRODUCER,
                publishing=pb.Publishing(topics=[pb.Resource(name="calm")]),
            )
        )
        self.commands.put(settings)
        self.call = stub.Telemetry(self._requests(), metadata=md(who, client_id), timeout=30)
        self.first = next(self.call)

    def _requests(self) -> Iterator[Any]:
        while True:
            cmd = self.commands.get()
            if cmd is None:
                return
            yield cmd

    def close(self) -> None:
        self.commands.put(None)
        self.call.cancel()


def test_telemetry_streams_count_against_max_connections(bt: BrokerThread, stub: Any) -> None:
    first = Stream(stub, "limited", "limited-1")
    try:
        assert first.first.status.code == pb.OK, first.first.status
        second = Stream(stub, "limited", "limited-2")
        second.close()
        assert second.first.status.code == TOO_MANY_REQUESTS, second.first.status
        assert second.first.status.message.startswith("[TOO_MANY_CONNECTIONS]")
        assert "maxConnections" in second.first.status.message
        assert throttled(bt, "limited", "connections") == 1
        other = Stream(stub, "quieter", "quiet-1")  # another account is not counted with it
        other.close()
        assert other.first.status.code == pb.OK
    finally:
        first.close()

    # once the first stream is gone its place is free again
    assert bt.controller is not None
    quota = bt.controller.quota
    assert quota is not None
    wait_until_sync(
        lambda: bt.run(lambda: quota.connections.get("limited", 0)) == 0,
        10,
        "the closed stream given back",
    )
    again = Stream(stub, "limited", "limited-3")
    again.close()
    assert again.first.status.code == pb.OK, again.first.status


def keys_of(account: str) -> dict[str, str]:
    """The stock client's arguments that sign its requests as ``account``."""
    return {"access_key": account, "secret_key": SECRETS[account]}


def test_stock_client_over_its_rate_is_refused_and_another_sends(
    bt: BrokerThread, py5: Path
) -> None:
    """The official RocketMQ 5 Python client: an account of 100 bytes/s sends 3,000 bytes (a
    30 s debt), so its next send -- and the client's retries of it -- are refused with 42900;
    another account's client sends at once."""
    ep = endpoint(bt)
    err = stock_send_refused(
        py5, ep, "trickled", {"body": "x" * 3000}, {"body": "y"}, **keys_of("trickle")
    )
    # the client's own exception for the proxy's flow-control answer, with the broker's words
    assert "TooManyRequestsException: 42900" in err, err[-2000:]
    assert "[TOO_MANY_REQUESTS] account 'trickle'" in err, err[-2000:]
    assert throttled(bt, "trickle", "produce") >= 1
    sent = stock_send(
        py5, ep, "trickled", {"body": "z" * 3000}, {"body": "w"}, **keys_of("quieter")
    )
    assert len(sent["ids"]) == 2

    def stored() -> int:
        assert bt.controller is not None
        store = bt.controller.store
        return sum(store.get_max_offset_in_queue("trickled", q) for q in range(4))

    assert bt.run(stored) == 3  # the trickle's first message and the other account's two

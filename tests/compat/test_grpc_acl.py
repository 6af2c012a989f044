"""ACL 1.0 on the gRPC front end: the official RocketMQ 5 Python client with credentials sends,
receives and runs transactions; without credentials or with a wrong secret it is refused.  A
plain grpcio client (the broker's own stubs) signs calls as RocketMQ 5 clients do and checks
every RPC against every kind of account, the identity checks, the reload of the file and that
check-backs go only to streams authenticated for the transaction's topic."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.test_grpc_python5 import (
    endpoint,
    py5,
    run,
    run_refused,
    stock_receive,
    stock_send_refused,
    tx_state,
)
from tests.conftest import BrokerThread
from tests.support.acl_files import write_acl
from tests.support.grpc_probes import end_transaction_request, receive_request
from tests.support.waiting import wait_until_sync
from txmq.protocol.acl import GRPC_AUTHORIZATION, GRPC_DATE_TIME, grpc_authorization

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.auth import RPC_NEEDS  # noqa: E402
from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402

__all__ = ["py5"]  # the fixture, imported for this module's tests

ACL_FILE = """
accounts:
  - accessKey: producerP
    secretKey: secret-p-123
    topicPerms:
      - orders=PUB
  - accessKey: consumerC
    secretKey: secret-c-123
    topicPerms:
      - orders=SUB
    groupPerms:
      - cgroup=SUB
  - accessKey: strangerS
    secretKey: secret-s-123
    topicPerms:
      - elsewhere=PUB|SUB
  - accessKey: operator
    secretKey: secret-op-123
    admin: true
  - accessKey: faraway
    secretKey: secret-f-123
    whiteRemoteAddress: 10.20.30.*
    admin: true
"""

KEYS = {
    "P": ("producerP", "secret-p-123"),
    "C": ("consumerC", "secret-c-123"),
    "S": ("strangerS", "secret-s-123"),
    "ADMIN": ("operator", "secret-op-123"),
}


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    return write_acl(tmp_path, ACL_FILE)


@pytest.fixture
def bt(broker_thread_factory: Callable[..., BrokerThread], acl_file: Path) -> BrokerThread:
    return broker_thread_factory(
        grpc_server_enable=True,
        grpc_server_port=0,
        acl_enable=True,
        plain_acl_file=str(acl_file),
        transaction_check_max=10_000,
    )


def md(who: str | None, client_id: str = "", **override: str) -> list[tuple[str, str]]:
    """The metadata of a call signed by account ``who`` (None: unsigned)."""
    out = [("x-mq-client-id", client_id or f"raw-{who}"), ("x-mq-language", "PYTHON")]
    if who is not None:
        ak, sk = KEYS[who]
        now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        out += [(GRPC_DATE_TIME, now), (GRPC_AUTHORIZATION, grpc_authorization(ak, sk, now))]
    for k, v in override.items():
        key = {"date": GRPC_DATE_TIME, "auth": GRPC_AUTHORIZATION}[k]
        out = [(a, b) for a, b in out if a != key] + [(key, v)]
    return out


def res(name: str) -> Any:
    return pb.Resource(name=name)


def message(topic: str, body: bytes = b"x", kind: pb.MessageType = pb.NORMAL) -> Any:
    m = pb.Message(topic=res(topic), body=body)
    m.system_properties.message_id = f"id-{time.monotonic_ns()}"
    m.system_properties.message_type = kind
    m.system_properties.born_host = "127.0.0.1"
    return m


def publishing(topic: str) -> Any:
    return spb.TelemetryCommand(
        settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[res(topic)]))
    )


def subscribing(topic: str, group: str) -> Any:
    sub = pb.Subscription(group=res(group), subscriptions=[pb.SubscriptionEntry(topic=res(topic))])
    return spb.TelemetryCommand(
        settings=pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=sub)
    )


def call(stub: Any, rpc: str, request: Any, metadata: list[tuple[str, str]]) -> Any:
    """One call; the Status it was answered with."""
    if rpc in ("ReceiveMessage", "PullMessage"):
        return list(getattr(stub, rpc)(request, metadata=metadata, timeout=10))[0].status
    if rpc == "Telemetry":
        stream = stub.Telemetry(iter([request]), metadata=metadata, timeout=10)
        try:
            return next(stream).status
        finally:
            stream.cancel()
    return getattr(stub, rpc)(request, metadata=metadata, timeout=10).status


ALL = {"P", "C", "S", "ADMIN"}
SUB_SIDE = {"C", "ADMIN"}
PUB_SIDE = {"P", "ADMIN"}
HANDLE = "0:1:2:bogus"

#: (RPC, request, the accounts allowed)
TABLE: list[tuple[str, Any, set[str]]] = [
    ("QueryRoute", spb.QueryRouteRequest(topic=res("orders")), {"P", "C", "ADMIN"}),
    ("QueryRoute", spb.QueryRouteRequest(topic=res("elsewhere")), {"S", "ADMIN"}),
    ("Heartbeat", spb.HeartbeatRequest(client_type=pb.PRODUCER), ALL),
    (
        "Heartbeat",
        spb.HeartbeatRequest(group=res("cgroup"), client_type=pb.SIMPLE_CONSUMER),
        SUB_SIDE,
    ),
    ("SendMessage", spb.SendMessageRequest(messages=[message("orders")]), PUB_SIDE),
    (
        "SendMessage",
        spb.SendMessageRequest(messages=[message("orders", kind=pb.TRANSACTION)]),
        PUB_SIDE,
    ),
    (
        "QueryAssignment",
        spb.QueryAssignmentRequest(topic=res("orders"), group=res("cgroup")),
        SUB_SIDE,
    ),
    ("ReceiveMessage", receive_request("cgroup", "orders", batch=8, poll_ms=100), SUB_SIDE),
    (
        "AckMessage",
        spb.AckMessageRequest(
            group=res("cgroup"),
            topic=res("orders"),
            entries=[spb.AckMessageEntry(message_id="m", receipt_handle=HANDLE)],
        ),
        SUB_SIDE,
    ),
    (
        "ForwardMessageToDeadLetterQueue",
        spb.ForwardMessageToDeadLetterQueueRequest(
            group=res("cgroup"), topic=res("orders"), receipt_handle=HANDLE, message_id="m"
        ),
        SUB_SIDE,
    ),
    (
        "ChangeInvisibleDuration",
        spb.ChangeInvisibleDurationRequest(
            group=res("cgroup"), topic=res("orders"), receipt_handle=HANDLE, message_id="m"
        ),
        SUB_SIDE,
    ),
    (
        "EndTransaction",
        spb.EndTransactionRequest(
            topic=res("orders"), transaction_id="no-such", resolution=pb.COMMIT
        ),
        PUB_SIDE,
    ),
    ("Telemetry", publishing("orders"), PUB_SIDE),
    ("Telemetry", subscribing("orders", "cgroup"), SUB_SIDE),
    ("NotifyClientTermination", spb.NotifyClientTerminationRequest(), ALL),
    ("NotifyClientTermination", spb.NotifyClientTerminationRequest(group=res("cgroup")), SUB_SIDE),
    ("PullMessage", spb.PullMessageRequest(), ALL),
    ("UpdateOffset", spb.UpdateOffsetRequest(), ALL),
    ("GetOffset", spb.GetOffsetRequest(), ALL),
    ("QueryOffset", spb.QueryOffsetRequest(), ALL),
    ("RecallMessage", spb.RecallMessageRequest(), ALL),
    ("SyncLiteSubscription", spb.SyncLiteSubscriptionRequest(), ALL),
]


def test_the_table_covers_every_rpc_of_the_service() -> None:
    methods = {m.name for m in spb.DESCRIPTOR.services_by_name["MessagingService"].methods}
    assert set(RPC_NEEDS) == methods
    assert {rpc for rpc, _, _ in TABLE} == methods


def test_every_rpc_is_allowed_or_refused_as_the_file_says(bt: BrokerThread, stub: Any) -> None:
    for rpc, request, allowed in TABLE:
        for who in sorted(ALL):
            st = call(stub, rpc, request, md(who, client_id=f"raw-{who}"))
            if who in allowed:
                assert st.code not in (pb.UNAUTHORIZED, pb.FORBIDDEN), (rpc, who, st)
            else:
                assert st.code == pb.FORBIDDEN, (rpc, who, st)
                assert "missing permission" in st.message, (rpc, who, st)
                assert KEYS[who][0] in st.message and KEYS[who][1] not in st.message
        st = call(stub, rpc, request, md(None, client_id="raw-none"))
        assert st.code == pb.UNAUTHORIZED, (rpc, st)
        assert f"RPC {rpc} carries no AccessKey" in st.message

    # nothing the refused sends carried was stored
    def stored() -> int:
        assert bt.controller is not None
        return sum(bt.controller.store.get_max_offset_in_queue("orders", q) for q in range(4))

    # the plain sends of P and ADMIN: the same message (one message id), so the second is a
    # resend within the duplicate window, answered with the first's receipt
    assert bt.run(stored) == 1
    assert bt.controller is not None
    # and the half (the same message from both: one transaction)
    tx = bt.controller.transactions
    assert bt.run(lambda: len(tx.records)) == 1


def logged(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> str:
    """The broker's log lines so far, printed and through the standard library."""
    out = capsys.readouterr()
    return out.out + out.err + caplog.text


def test_identity_checks_and_their_statuses(
    bt: BrokerThread,
    stub: Any,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    route = spb.QueryRouteRequest(topic=res("orders"))
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    cases = [
        (md("P", auth=grpc_authorization("producerP", "not-the-secret", now)), "bad signature"),
        (md("P", date="20000101T000000Z"), "bad signature"),  # the date is what is signed
        (md("P", auth=grpc_authorization("nobody", "secret-x-123", now)), "unknown AccessKey"),
        (md("P", auth="Basic dXNlcjpwYXNz"), "cannot read the authorization metadata"),
        (md("P", auth="MQv2-HMAC-SHA1 Credential=producerP"), "no Signature"),
        (md(None), "carries no AccessKey"),
    ]
    for metadata, reason in cases:
        st = call(stub, "QueryRoute", route, metadata)
        assert st.code == pb.UNAUTHORIZED and reason in st.message, (reason, st)
    # an admin key restricted to other addresses
    ak, sk = "faraway", "secret-f-123"
    st = call(stub, "QueryRoute", route, md(None, auth=grpc_authorization(ak, sk, now), date=now))
    assert st.code == pb.UNAUTHORIZED and "forbidden address" in st.message
    # a client id belongs to the account that registered it
    assert call(stub, "Heartbeat", spb.HeartbeatRequest(), md("P", client_id="mine")).code == pb.OK
    st = call(stub, "Heartbeat", spb.HeartbeatRequest(), md("S", client_id="mine"))
    assert st.code == pb.FORBIDDEN and "registered by another AccessKey" in st.message
    st = call(
        stub, "NotifyClientTermination", spb.NotifyClientTerminationRequest(), md("S", "mine")
    )
    assert st.code == pb.FORBIDDEN
    # logged without secrets
    text = logged(capsys, caplog)
    assert "acl_refused" in text and "rpc" in text
    assert "secret-p-123" not in text and "not-the-secret" not in text


def test_a_changed_file_takes_effect_without_a_restart(
    bt: BrokerThread, stub: Any, acl_file: Path
) -> None:
    send = spb.SendMessageRequest(messages=[message("orders")])
    assert call(stub, "SendMessage", send, md("S")).code == pb.FORBIDDEN
    acl_file.write_text(
        ACL_FILE.replace("      - elsewhere=PUB|SUB", "      - orders=PUB\n")
        + "globalWhiteRemoteAddresses:\n  - 10.99.*\n",
        encoding="utf-8",
    )
    assert bt.controller is not None and bt.controller.acl is not None
    acl = bt.controller.acl
    wait_until_sync(lambda: acl.reloads >= 1, 30.0, "the ACL reload")
    assert call(stub, "SendMessage", send, md("S")).code == pb.OK
    # and a trusted address needs no credentials at all
    acl_file.write_text(ACL_FILE + "globalWhiteRemoteAddresses:\n  - 127.0.0.1\n", encoding="utf-8")
    wait_until_sync(lambda: acl.reloads >= 2, 30.0, "the second ACL reload")
    assert call(stub, "SendMessage", send, md(None, client_id="trusted")).code == pb.OK


def test_check_backs_go_only_to_streams_of_accounts_that_may_publish_the_topic(
    bt: BrokerThread, stub: Any, acl_file: Path
) -> None:
    assert bt.controller is not None
    tx = bt.controller.transactions
    requests: queue.Queue[Any] = queue.Queue()
    requests.put(publishing("orders"))

    def feed() -> Iterator[Any]:
        while (item := requests.get()) is not None:
            yield item

    stream = stub.Telemetry(feed(), metadata=md("P", client_id="p-1"), timeout=60)
    try:
        assert next(stream).status.code == pb.OK
        # nobody else can take over the client id, nor announce a topic it may not publish
        st = call(stub, "Telemetry", publishing("orders"), md("S", client_id="p-1"))
        assert st.code == pb.FORBIDDEN and "registered by another AccessKey" in st.message
        st = call(stub, "Telemetry", publishing("orders"), md("S", client_id="s-1"))
        assert st.code == pb.FORBIDDEN and "missing permission" in st.message

        half = message("orders", b"half", kind=pb.TRANSACTION)
        r = stub.SendMessage(spb.SendMessageRequest(messages=[half]), metadata=md("P", "p-1"))
        first = r.entries[0].transaction_id
        cmd = next(stream)
        assert cmd.recover_orphaned_transaction_command.transaction_id == first
        end = end_transaction_request("orders", first, pb.ROLLBACK, pb.SOURCE_SERVER_CHECK)
        assert stub.EndTransaction(end, metadata=md("P", "p-1")).status.code == pb.OK

        # P loses PUB on the topic: its open stream is asked about nothing any more
        acl = bt.controller.acl
        assert acl is not None
        acl_file.write_text(ACL_FILE.replace("orders=PUB", "orders=DENY"), encoding="utf-8")
        wait_until_sync(lambda: acl.reloads >= 1, 30.0, "the ACL reload")
        half = message("orders", b"half-2", kind=pb.TRANSACTION)
        r = stub.SendMessage(spb.SendMessageRequest(messages=[half]), metadata=md("ADMIN"))
        second = r.entries[0].transaction_id

        def rounds() -> int:
            return int(bt.run(lambda: tx.rounds))

        start = rounds()
        wait_until_sync(lambda: rounds() >= start + 5, 30.0, "five check rounds")
        assert bt.run(lambda: tx.records[second].check_times) == 0
        assert tx_state(bt, second) == "PENDING"
    finally:
        requests.put(None)
        stream.cancel()


# -- the stock client ---------------------------------------------------------------------------


def creds(who: str) -> dict[str, Any]:
    ak, sk = KEYS[who]
    return {"access_key": ak, "secret_key": sk}


def test_stock_client_with_credentials_sends_receives_and_commits(
    bt: BrokerThread, py5: Path
) -> None:
    ep = endpoint(bt)
    sent = run(py5, op="send", endpoint=ep, topic="orders", messages=[{"body": "a"}], **creds("P"))
    tx = run(
        py5,
        op="transaction",
        endpoint=ep,
        topic="orders",
        decision="commit",
        message={"body": "t"},
        **creds("P"),
    )
    assert tx_state(bt, tx["transaction_id"]) == "COMMITTED"
    got = stock_receive(py5, ep, "orders", "cgroup", 2, timeout=20, **creds("C"))
    assert sorted(m["body"] for m in got["messages"]) == ["a", "t"]
    assert sent["ids"][0] in {m["id"] for m in got["messages"]}


def test_stock_client_without_or_with_wrong_credentials_is_refused(
    bt: BrokerThread,
    py5: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ep = endpoint(bt)
    stock_send_refused(py5, ep, "orders", {"body": "x"})
    stock_send_refused(
        py5, ep, "orders", {"body": "x"}, access_key="producerP", secret_key="wrong-secret"
    )
    # a consumer key may not publish
    run_refused(py5, op="send", endpoint=ep, topic="orders", messages=[{}], **creds("C"))
    run_refused(
        py5, op="receive", endpoint=ep, topic="orders", group="cgroup", count=1, **creds("P")
    )
    text = logged(capsys, caplog)
    for reason in ("carries no AccessKey", "bad signature", "missing permission"):
        assert reason in text, reason

    def stored() -> int:
        assert bt.controller is not None
        return sum(bt.controller.store.get_max_offset_in_queue("orders", q) for q in range(4))

    assert bt.run(stored) == 0

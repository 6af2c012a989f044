"""ACL 2.0 on the gRPC front end: users and policies created over remoting decide the calls of
RocketMQ 5 clients (signed as they sign for ACL 1.0) — a plain grpcio client on the broker's
stubs and the official Python client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.compat.test_grpc_python5 import endpoint, py5, stock_send, stock_send_refused
from tests.conftest import BrokerThread
from tests.support.acl_files import acl2_with_root, write_acl
from tests.support.grpc_probes import receive_request
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.acl import GRPC_AUTHORIZATION, GRPC_DATE_TIME, grpc_authorization

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from tests.compat.test_grpc_acl import message, res  # noqa: E402
from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc  # noqa: E402

__all__ = ["py5"]

KEYS = {
    "root": "root-secret-123",
    "alice": "alice-secret-1",
    "bob-user": "bob-secret-12",
}


@pytest.fixture
def bt(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    b = broker_thread_factory(
        grpc_server_enable=True,
        grpc_server_port=0,
        **acl2_with_root("root", KEYS["root"]),
    )
    assert b.controller is not None

    async def setup() -> None:
        async with AsyncAdminClient(
            b.controller.address,  # type: ignore[union-attr]
            access_key="root",
            secret_key=KEYS["root"],
        ) as a:
            for topic in ("orders", "secret"):
                await a.create_topic(topic)
            for user in ("alice", "bob-user"):
                await a.create_user(user, KEYS[user])
            entries = [
                {"resource": "Topic:order*", "actions": ["Pub", "Sub"], "decision": "Allow"},
                {"resource": "Group:billing", "actions": ["Sub"], "decision": "Allow"},
                {"resource": "Topic:secret", "actions": ["All"], "decision": "Deny"},
            ]
            await a.create_acl("User:alice", [{"policyType": "Custom", "entries": entries}])

    asyncio.run(setup())
    return b


def md(user: str | None, secret: str | None = None) -> list[tuple[str, str]]:
    out = [("x-mq-client-id", f"raw-{user}"), ("x-mq-language", "PYTHON")]
    if user is not None:
        now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        auth = grpc_authorization(user, secret or KEYS[user], now)
        out += [(GRPC_DATE_TIME, now), (GRPC_AUTHORIZATION, auth)]
    return out


def send(stub: Any, topic: str, who: list[tuple[str, str]]) -> Any:
    return stub.SendMessage(
        spb.SendMessageRequest(messages=[message(topic)]), metadata=who, timeout=10
    ).status


def test_policies_decide_grpc_calls(bt: BrokerThread, stub: Any) -> None:
    assert send(stub, "orders", md("alice")).code == pb.OK
    assert send(stub, "orders", md("root")).code == pb.OK  # a super user
    refused = send(stub, "secret", md("alice"))
    assert refused.code == pb.FORBIDDEN
    assert "User:alice has no permission to Pub Topic:secret" in refused.message
    assert send(stub, "orders", md("bob-user")).code == pb.FORBIDDEN  # no policies
    assert send(stub, "orders", md(None)).code == pb.UNAUTHORIZED
    wrong = send(stub, "orders", md("alice", "not-her-secret"))
    assert wrong.code == pb.UNAUTHORIZED and "bad signature" in wrong.message

    route = stub.QueryRoute(
        spb.QueryRouteRequest(topic=res("orders")), metadata=md("alice"), timeout=10
    )
    assert route.status.code == pb.OK
    got = list(
        stub.ReceiveMessage(
            receive_request("billing", "orders", batch=8, poll_ms=100),
            metadata=md("alice"),
            timeout=10,
        )
    )
    assert got[0].status.code not in (pb.UNAUTHORIZED, pb.FORBIDDEN), got[0].status
    other = list(
        stub.ReceiveMessage(
            receive_request("other", "orders", batch=8, poll_ms=100),
            metadata=md("alice"),
            timeout=10,
        )
    )
    assert other[0].status.code == pb.FORBIDDEN

    def stored() -> int:
        assert bt.controller is not None
        return sum(bt.controller.store.get_max_offset_in_queue("orders", q) for q in range(8))

    assert bt.run(stored) == 2  # alice's and root's sends; nothing refused was stored


def test_stock_client_with_a_user_of_acl2(bt: BrokerThread, py5: Path) -> None:
    ep = endpoint(bt)
    sent = stock_send(
        py5, ep, "orders", {"body": "a"}, access_key="alice", secret_key=KEYS["alice"]
    )
    assert sent["ids"]
    stock_send_refused(
        py5, ep, "orders", {"body": "x"}, access_key="bob-user", secret_key=KEYS["bob-user"]
    )


def test_every_rpc_is_decided_as_acl1_decided_it_after_migration(
    broker_thread_factory: Callable[..., BrokerThread], tmp_path: Path
) -> None:
    """test_grpc_acl.py's file, migrated to users and policies, allows and refuses every RPC
    as ACL 1.0 did."""
    from tests.compat import test_grpc_acl as v1
    from txmq.broker.auth2 import migrate_plain_acl

    path = write_acl(tmp_path, v1.ACL_FILE)
    b = broker_thread_factory(
        grpc_server_enable=True,
        grpc_server_port=0,
        transaction_check_max=10_000,
        **acl2_with_root("root", KEYS["root"]),
    )
    assert b.controller is not None
    address = b.controller.address

    async def migrate() -> None:
        async with AsyncAdminClient(address, access_key="root", secret_key=KEYS["root"]) as a:
            for m in migrate_plain_acl(str(path)):
                assert not m.notes
                await a.create_user(
                    m.user["username"],
                    m.user["password"],
                    super_user=m.user["userType"] == "Super",
                )
                if m.acl is not None:
                    await a.create_acl(m.acl["subject"], m.acl["policies"])

    asyncio.run(migrate())
    with grpc.insecure_channel(endpoint(b)) as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        for rpc, request, allowed in v1.TABLE:
            for who in sorted(v1.ALL):
                st = v1.call(stub, rpc, request, v1.md(who, client_id=f"raw-{who}"))
                if who in allowed:
                    assert st.code not in (pb.UNAUTHORIZED, pb.FORBIDDEN), (rpc, who, st)
                else:
                    assert st.code == pb.FORBIDDEN, (rpc, who, st)
                    assert "no permission" in st.message, (rpc, who, st)
            st = v1.call(stub, rpc, request, v1.md(None, client_id="raw-none"))
            assert st.code == pb.UNAUTHORIZED, (rpc, st)

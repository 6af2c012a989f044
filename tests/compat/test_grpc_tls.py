"""TLS on the gRPC front end: the official RocketMQ 5 Python client (5.1.2) sends, receives and
runs a transaction over TLS against an enforcing broker; plain clients, clients that trust
another CA and (with mutual TLS) clients without a certificate are refused; a rotated
certificate reaches new gRPC connections; permissive keeps the gRPC port plain.

The stock client builds its TLS channel with gRPC's default roots, so it is given the test CA
through ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``.  It cannot present a client certificate: mutual
TLS is checked with a plain grpcio client (the broker's own stubs).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.compat.test_grpc_python5 import endpoint, py5, run, run_refused, tx_state
from tests.conftest import BrokerThread
from tests.support.certs import Certs, issue, make_certs
from tests.support.waiting import wait_until_sync

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc  # noqa: E402

__all__ = ["py5"]  # the fixture, imported for this module's tests

MD = (("x-mq-client-id", "tls-raw-1"), ("x-mq-language", "PYTHON"))


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "certs")


def tls_broker(factory: Callable[..., BrokerThread], certs: Certs, **settings: Any) -> BrokerThread:
    values: dict[str, Any] = dict(certs.broker_settings("enforcing"))
    values.update(settings)
    return factory(grpc_server_enable=True, grpc_server_port=0, **values)


def roots(ca: Path) -> dict[str, str]:
    """The environment that makes a stock client's default TLS roots ``ca``."""
    return {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(ca)}


def route(bt: BrokerThread, creds: Any | None) -> Any:
    """One QueryRoute over a fresh channel (TLS with ``creds``, plain when None): the answer,
    or the RpcError."""
    target = endpoint(bt)
    ch = grpc.insecure_channel(target) if creds is None else grpc.secure_channel(target, creds)
    try:
        return sgrpc.MessagingServiceStub(ch).QueryRoute(
            spb.QueryRouteRequest(topic=pb.Resource(name="tls-topic")), metadata=MD, timeout=10
        )
    except grpc.RpcError as exc:
        return exc
    finally:
        ch.close()


def tls_creds(ca: Path, cert: Path | None = None, key: Path | None = None) -> Any:
    return grpc.ssl_channel_credentials(
        ca.read_bytes(),
        key.read_bytes() if key else None,
        cert.read_bytes() if cert else None,
    )


def assert_refused(answer: Any) -> None:
    assert isinstance(answer, grpc.RpcError), f"expected a refused connection, got {answer}"
    assert answer.code() == grpc.StatusCode.UNAVAILABLE, answer


def test_stock_client_sends_receives_and_commits_over_tls(
    broker_thread_factory: Callable[..., BrokerThread], certs: Certs, py5: Path
) -> None:
    bt = tls_broker(broker_thread_factory, certs)
    ep, env = endpoint(bt), roots(certs.ca)
    sent = run(py5, env, op="send", endpoint=ep, topic="tls-t", tls=True, messages=[{"body": "s"}])
    tx = run(
        py5,
        env,
        op="transaction",
        endpoint=ep,
        topic="tls-t",
        tls=True,
        decision="commit",
        message={"body": "t"},
    )
    assert tx_state(bt, tx["transaction_id"]) == "COMMITTED"
    got = run(
        py5, env, op="receive", endpoint=ep, topic="tls-t", group="g", tls=True, count=2, timeout=20
    )
    assert sorted(m["body"] for m in got["messages"]) == ["s", "t"]
    assert sent["ids"][0] in {m["id"] for m in got["messages"]}


def test_plain_and_wrong_ca_clients_are_refused_on_an_enforcing_port(
    broker_thread_factory: Callable[..., BrokerThread], certs: Certs, py5: Path
) -> None:
    bt = tls_broker(broker_thread_factory, certs)
    ep = endpoint(bt)
    # the stock client in plain text, and trusting another CA
    err = run_refused(py5, op="send", endpoint=ep, topic="tls-t", messages=[{"body": "x"}])
    assert "failed to fetch topic:tls-t route" in err
    err = run_refused(
        py5, roots(certs.wrong_ca), op="send", endpoint=ep, topic="tls-t", tls=True, messages=[{}]
    )
    assert "CERTIFICATE_VERIFY_FAILED" in err
    assert_refused(route(bt, None))
    assert_refused(route(bt, tls_creds(certs.wrong_ca)))
    assert route(bt, tls_creds(certs.ca)).status.code == pb.OK

    def stored() -> int:
        assert bt.controller is not None
        store = bt.controller.store
        return sum(store.get_max_offset_in_queue("tls-t", q) for q in range(4))

    assert bt.run(stored) == 0


def test_mutual_tls_requires_a_certificate_of_the_trusted_ca(
    broker_thread_factory: Callable[..., BrokerThread], certs: Certs, tmp_path: Path, py5: Path
) -> None:
    bt = tls_broker(
        broker_thread_factory, certs, **certs.broker_settings("enforcing", client_auth="require")
    )
    wrong_key = (certs.wrong_ca, certs.folder / "wrong-ca.key")
    stranger = issue(tmp_path, "stranger", wrong_key, server=False)
    # the stock client has no way to present a certificate
    err = run_refused(
        py5, roots(certs.ca), op="send", endpoint=endpoint(bt), topic="m", tls=True, messages=[{}]
    )
    assert "failed to fetch topic:m route" in err
    assert_refused(route(bt, tls_creds(certs.ca)))
    assert_refused(route(bt, tls_creds(certs.ca, *stranger)))
    ok = route(bt, tls_creds(certs.ca, certs.client_cert, certs.client_key))
    assert ok.status.code == pb.OK


def test_a_rotated_certificate_reaches_new_grpc_connections(
    broker_thread_factory: Callable[..., BrokerThread], certs: Certs, tmp_path: Path
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(certs.server_cert, live / "broker.pem")
    shutil.copy(certs.server_key, live / "broker.key")
    bt = tls_broker(
        broker_thread_factory,
        certs,
        tls_server_cert_path=str(live / "broker.pem"),
        tls_server_key_path=str(live / "broker.key"),
    )
    assert route(bt, tls_creds(certs.ca)).status.code == pb.OK
    cert, key = issue(
        tmp_path, "broker-next", (certs.wrong_ca, certs.folder / "wrong-ca.key"), server=True
    )
    os.replace(key, live / "broker.key")
    os.replace(cert, live / "broker.pem")
    assert bt.controller is not None and bt.controller.tls is not None
    tls = bt.controller.tls
    wait_until_sync(lambda: tls.reloads >= 1, 30.0, "the certificate reload")
    assert route(bt, tls_creds(certs.wrong_ca)).status.code == pb.OK
    assert_refused(route(bt, tls_creds(certs.ca)))


def test_permissive_keeps_the_grpc_port_plain(
    broker_thread_factory: Callable[..., BrokerThread], certs: Certs
) -> None:
    bt = tls_broker(broker_thread_factory, certs, **certs.broker_settings("permissive"))
    assert route(bt, None).status.code == pb.OK
    assert_refused(route(bt, tls_creds(certs.ca)))


def test_stock_client_over_tls_with_credentials(
    broker_thread_factory: Callable[..., BrokerThread], certs: Certs, tmp_path: Path, py5: Path
) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(
        "accounts:\n"
        "  - accessKey: tlsProducer\n    secretKey: tls-secret-123\n"
        "    topicPerms: [secure=PUB|SUB]\n    groupPerms: [sg=SUB]\n",
        encoding="utf-8",
    )
    bt = tls_broker(broker_thread_factory, certs, acl_enable=True, plain_acl_file=str(acl))
    ep, env = endpoint(bt), roots(certs.ca)
    keys = {"access_key": "tlsProducer", "secret_key": "tls-secret-123"}
    run(
        py5, env, op="send", endpoint=ep, topic="secure", tls=True, messages=[{"body": "z"}], **keys
    )
    got = run(
        py5, env, op="receive", endpoint=ep, topic="secure", group="sg", tls=True, count=1, **keys
    )
    assert [m["body"] for m in got["messages"]] == ["z"]
    err = run_refused(py5, env, op="send", endpoint=ep, topic="secure", tls=True, messages=[{}])
    assert "route" in err  # over TLS, but without credentials

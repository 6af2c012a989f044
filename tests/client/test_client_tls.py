"""The SDK, the admin client and the CLI over TLS: send, consume and a transaction with
check-back against a broker that enforces mutual TLS; refusals are clear errors."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.client.helpers import FAST_CLIENT
from tests.support.brokers import started
from tests.support.certs import Certs, make_certs
from tests.support.listeners import CheckBack
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.cli import main as cli
from txmq.client import AsyncProducer, AsyncPushConsumer, ClientConfig
from txmq.client.admin import AsyncAdminClient
from txmq.client.config import tls_context
from txmq.client.transaction import (
    AsyncTransactionProducer,
    LocalTransactionState,
)
from txmq.protocol.errors import ConnectionClosedError
from txmq.protocol.message import Message, MessageExt


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "certs")


@pytest.fixture
async def mtls_broker(
    make_broker_config: Callable[..., BrokerConfig], certs: Certs
) -> AsyncIterator[BrokerController]:
    async with started(
        make_broker_config(**certs.broker_settings("enforcing", client_auth="require"))
    ) as controller:
        yield controller


def tls_config(certs: Certs) -> ClientConfig:
    ctx = tls_context(str(certs.ca), str(certs.client_cert), str(certs.client_key))
    return FAST_CLIENT.replace(tls=ctx)


async def test_send_consume_and_a_checked_back_transaction_over_mutual_tls(
    mtls_broker: BrokerController, certs: Certs, unique: Callable[[str], str]
) -> None:
    config = tls_config(certs)
    topic, group = unique("tls-orders"), unique("tls-billing")
    async with AsyncAdminClient(mtls_broker.address, tls=config.tls) as admin:
        await admin.create_topic(topic, 2)
        assert (await admin.runtime_info())["brokerName"]

    inbox: asyncio.Queue[MessageExt] = asyncio.Queue()
    consumer = AsyncPushConsumer(group, broker=mtls_broker.address, config=config)
    consumer.subscribe(topic, "*", inbox.put_nowait)
    listener = CheckBack()
    tx = AsyncTransactionProducer(
        unique("tls-tx"), listener, broker=mtls_broker.address, config=config
    )
    async with consumer, tx:  # started in this order, shut down in the other
        async with AsyncProducer(
            unique("tls-prod"), broker=mtls_broker.address, config=config
        ) as producer:
            sent = await producer.send(Message(topic, b"over tls", tags="plain"))
            assert sent.msg_id
        result = await tx.send_message_in_transaction(Message(topic, b"checked back", tags="tx"))
        assert result.local_transaction_state == LocalTransactionState.UNKNOW

        got: dict[str | None, bytes] = {}
        while len(got) < 2:
            msg = await asyncio.wait_for(inbox.get(), 30.0)
            got[msg.tags] = msg.body
        assert got == {"plain": b"over tls", "tx": b"checked back"}
        assert listener.checks >= 1  # the check-back reached the producer over TLS


async def test_refusals_are_clear_connection_errors(
    mtls_broker: BrokerController, certs: Certs, unique: Callable[[str], str]
) -> None:
    # tls=True trusts the system's CAs, which did not sign this broker's certificate
    with pytest.raises(ConnectionClosedError, match="TLS handshake .* failed"):
        async with AsyncProducer(
            unique("p"), broker=mtls_broker.address, config=FAST_CLIENT.replace(tls=True)
        ):
            pass
    # the right CA, but no client certificate: the broker closes the connection
    no_cert = FAST_CLIENT.replace(tls=tls_context(str(certs.ca)))
    with pytest.raises(ConnectionClosedError):
        async with AsyncProducer(unique("p"), broker=mtls_broker.address, config=no_cert):
            pass
    # plain TCP
    with pytest.raises(ConnectionClosedError):
        async with AsyncAdminClient(mtls_broker.address) as admin:
            await admin.runtime_info()


def test_client_tls_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="tls must be a bool or an ssl.SSLContext"):
        ClientConfig(tls="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="certificate and its key must be given together"):
        tls_context(None, "client.pem", None)
    with pytest.raises(ValueError, match="cannot load the TLS CA file 'missing.pem'"):
        tls_context("missing.pem")
    assert ClientConfig().ssl_context is None
    assert isinstance(ClientConfig(tls=True).ssl_context, ssl.SSLContext)


def test_cli_over_mutual_tls(
    make_broker_config: Callable[..., BrokerConfig], certs: Certs, tmp_path: Path
) -> None:
    from tests.conftest import BrokerThread

    bt = BrokerThread(
        make_broker_config(**certs.broker_settings("enforcing", client_auth="require"))
    )
    bt.start()
    try:
        runner = CliRunner()
        env = {
            "TXMQ_TLS_CA": str(certs.ca),
            "TXMQ_TLS_CERT": str(certs.client_cert),
            "TXMQ_TLS_KEY": str(certs.client_key),
        }
        ok = runner.invoke(cli, ["status", "--broker", bt.address], env=env)
        assert ok.exit_code == 0, ok.output
        assert "is up" in ok.output
        sent = runner.invoke(
            cli,
            ["--tls-ca", str(certs.ca), "send", "--broker", bt.address, "cli-tls", "hello"],
            env={k: v for k, v in env.items() if k != "TXMQ_TLS_CA"},
        )
        assert sent.exit_code == 0, sent.output
        assert "SEND_OK" in sent.output
        refused = runner.invoke(cli, ["--tls-ca", str(certs.ca), "status", "-b", bt.address])
        assert refused.exit_code != 0
        plain = runner.invoke(cli, ["status", "-b", bt.address])
        assert plain.exit_code != 0
        bad = runner.invoke(cli, ["--tls-cert", str(certs.client_cert), "status"])
        assert bad.exit_code == 2
        assert "given together" in bad.output
    finally:
        bt.stop()

"""The SDK, the admin client and the CLI with ACL credentials against a real broker whose ACL
is on: sends, consumption and a transaction decided by check-back all work signed, and the
same calls without credentials (or with another account's) are refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import BrokerThread
from tests.support.acl_files import write_acl
from tests.support.brokers import started
from tests.support.listeners import CheckBack
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.cli import main as cli
from txmq.client import (
    AsyncProducer,
    AsyncPushConsumer,
    AsyncTransactionProducer,
    ClientConfig,
    LocalTransactionState,
    Message,
    RollbackOnCheck,
)
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.errors import NoPermissionError

ACL = """
accounts:
  - accessKey: shopProducer
    secretKey: producer-secret-1
    topicPerms: [orders=PUB]
    groupPerms: [shop=PUB]
  - accessKey: billingReader
    secretKey: consumer-secret-1
    topicPerms: [orders=SUB]
    groupPerms: [billing=SUB]
  - accessKey: opsAdmin
    secretKey: admin-secret-1
    admin: true
"""

PRODUCER = ClientConfig(access_key="shopProducer", secret_key="producer-secret-1")
CONSUMER = ClientConfig(access_key="billingReader", secret_key="consumer-secret-1")


@pytest.fixture
def acl_config(make_broker_config: Callable[..., BrokerConfig], tmp_path: Path) -> BrokerConfig:
    path = write_acl(tmp_path, ACL)
    return make_broker_config(acl_enable=True, plain_acl_file=str(path))


@pytest.fixture
async def acl_broker(acl_config: BrokerConfig) -> AsyncIterator[BrokerController]:
    async with started(acl_config) as controller:
        yield controller


async def test_send_consume_and_a_checked_back_transaction_with_credentials(
    acl_broker: BrokerController,
) -> None:
    addr = acl_broker.address
    got: list[bytes] = []
    consumer = AsyncPushConsumer("billing", addr, consume_from="first", config=CONSUMER)
    consumer.subscribe("orders", "*", lambda m: got.append(m.body))
    listener = CheckBack()
    async with AsyncProducer("shop", addr, config=PRODUCER) as producer:
        await producer.send(Message("orders", b"plain-1"))
        async with AsyncTransactionProducer("shop", listener, addr, config=PRODUCER) as tx:
            result = await tx.send_message_in_transaction(Message("orders", b"tx-1"))
            assert result.local_transaction_state is LocalTransactionState.UNKNOWN
            await wait_until(lambda: listener.bodies == ["tx-1"], what="the check-back")
            await consumer.start()
            try:
                await wait_until(lambda: sorted(got) == [b"plain-1", b"tx-1"], what="both messages")
            finally:
                await consumer.shutdown()
    assert acl_broker.transactions.records[str(result.transaction_id)].state.value == "COMMITTED"


async def test_without_credentials_or_with_the_wrong_account_the_sdk_is_refused(
    acl_broker: BrokerController,
) -> None:
    addr = acl_broker.address
    with pytest.raises(NoPermissionError, match="carries no AccessKey"):
        async with AsyncProducer("shop", addr):
            pass
    async with AsyncProducer("other", addr, config=CONSUMER) as reader_as_producer:
        with pytest.raises(NoPermissionError, match="has SUB on topic 'orders'.*needs PUB"):
            await reader_as_producer.send(Message("orders", b"nope"))
    wrong = ClientConfig(access_key="shopProducer", secret_key="not-the-secret")
    with pytest.raises(NoPermissionError, match="bad signature"):
        async with AsyncProducer("shop", addr, config=wrong):
            pass


async def test_the_admin_client_signs_and_operator_requests_need_an_admin(
    acl_broker: BrokerController,
) -> None:
    async with AsyncAdminClient(
        acl_broker.address, access_key="opsAdmin", secret_key="admin-secret-1"
    ) as admin:
        await admin.create_topic("audit", 2)
        assert "audit" in await admin.list_topics()
    async with AsyncAdminClient(
        acl_broker.address, access_key="shopProducer", secret_key="producer-secret-1"
    ) as not_admin:
        with pytest.raises(NoPermissionError, match="needs an admin account"):
            await not_admin.create_topic("audit2", 2)


def test_the_cli_takes_credentials_from_the_environment(
    acl_config: BrokerConfig, broker_thread_factory: Callable[..., BrokerThread]
) -> None:
    bt = broker_thread_factory(acl_config)
    runner = CliRunner()
    env = {"TXMQ_BROKER": bt.address}
    refused = runner.invoke(cli, ["topic", "create", "cli-topic"], env=env)
    assert refused.exit_code != 0 and "carries no AccessKey" in refused.output
    admin_env = {**env, "TXMQ_ACCESS_KEY": "opsAdmin", "TXMQ_SECRET_KEY": "admin-secret-1"}
    ok = runner.invoke(cli, ["topic", "create", "cli-topic"], env=admin_env)
    assert ok.exit_code == 0, ok.output
    sent = runner.invoke(
        cli,
        ["--access-key", "shopProducer", "--secret-key", "producer-secret-1"]
        + ["send", "orders", "hello", "--group", "shop"],
        env=env,
    )
    assert sent.exit_code == 0, sent.output
    assert "SEND_OK" in sent.output


def test_the_spark_options_carry_credentials() -> None:
    from txmq.spark_connector.options import (
        TxmqOptionError,
        parse_sink_options,
        parse_source_options,
    )

    sink = parse_sink_options(
        {"broker": "h:1", "topic": "orders", "accessKey": "shopProducer", "secretKey": "s3cret!"}
    )
    assert sink.credentials is not None and sink.credentials.access_key == "shopProducer"
    assert "s3cret!" not in repr(sink)
    source = parse_source_options({"broker": "h:1", "topic": "orders"})
    assert source.credentials is None
    with pytest.raises(TxmqOptionError, match="accessKey and secretKey go together"):
        parse_source_options({"broker": "h:1", "topic": "orders", "accessKey": "x"})


async def test_a_producer_account_recovers_its_two_phase_transactions(
    acl_broker: BrokerController,
) -> None:
    async with AsyncTransactionProducer(
        "shop", RollbackOnCheck(), acl_broker.address, config=PRODUCER
    ) as p:
        async with p.transaction(two_phase=True) as txn:
            await txn.send(Message("orders", b"prepared"))
            handle = await txn.prepare()
        assert await p.recover() == [handle]
        await p.commit(handle)
        assert await p.recover() == []
    # another account may not list the group's transactions; the producer's account lists
    # only its group's two-phase ones (all the others need the admin right)
    async with AsyncTransactionProducer(
        "shop", RollbackOnCheck(), acl_broker.address, config=CONSUMER
    ) as other:
        with pytest.raises(NoPermissionError):
            await other.recover()
    async with AsyncAdminClient(
        acl_broker.address, access_key="shopProducer", secret_key="producer-secret-1"
    ) as admin:
        with pytest.raises(NoPermissionError):
            await admin.list_transactions(group="shop")

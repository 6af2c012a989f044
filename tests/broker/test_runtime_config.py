"""Settings changed while the broker runs (RocketMQ's updateBrokerConfig, ``txmq config set``):
what may change takes effect at once and is kept across a restart; everything else is refused
with the list of what may change, and nothing changes."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.broker.test_admin_commands import cli
from tests.support.brokers import started
from tests.support.listeners import CheckBack
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.runtime_config import RUNTIME_KEYS, runtime_file
from txmq.broker.server import BrokerController
from txmq.cli import main
from txmq.client import (
    AdminClient,
    AsyncProducer,
    AsyncTransactionProducer,
    Message,
)
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.errors import InvalidParameterError, NoPermissionError, TopicNotExistError


async def test_a_change_takes_effect_at_once_and_survives_a_restart(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    config = make_broker_config()
    async with started(config, stop_within=30) as first:
        async with AsyncProducer("p", first.address) as producer:
            await producer.send(Message("made-before", b"x"))  # auto-created
            async with AsyncAdminClient(first.address) as admin:
                await admin.update_broker_config(
                    {"autoCreateTopicEnable": False, "maxReconsumeTimes": 3}
                )
                settings = await admin.broker_config()
            assert settings["autoCreateTopicEnable"] == "false"
            assert settings["maxReconsumeTimes"] == "3"
            with pytest.raises(TopicNotExistError):
                await producer.send(Message("made-after", b"x"))
            await producer.send(Message("made-before", b"y"))  # existing topics keep working
    saved = json.loads(Path(runtime_file(config)).read_text())
    assert saved.pop("txmqCrc32") > 0  # its checksum
    assert saved == {"autoCreateTopicEnable": False, "maxReconsumeTimes": 3}

    async with started(config, stop_within=30) as second:
        async with AsyncAdminClient(second.address) as admin:
            settings = await admin.broker_config()
        assert settings["autoCreateTopicEnable"] == "false"
        assert settings["maxReconsumeTimes"] == "3"
        async with AsyncProducer("p", second.address) as producer:
            with pytest.raises(TopicNotExistError):
                await producer.send(Message("made-after", b"x"))


async def test_a_shorter_transaction_timeout_reschedules_pending_halves(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    async with started(make_broker_config(transaction_time_out=600_000), stop_within=30) as broker:
        listener = CheckBack()
        async with AsyncTransactionProducer("tx", listener, broker.address) as producer:
            await producer.send_message_in_transaction(Message("orders", b"o1"))
            checks = broker.transactions.checks
            rounds = checks.rounds
            await wait_until(lambda: checks.rounds >= rounds + 3, what="three check rounds")
            assert listener.checked == []  # ten minutes before its first check
            async with AsyncAdminClient(broker.address) as admin:
                await admin.update_broker_config({"transactionTimeOut": 100})
            await wait_until(lambda: listener.checked, what="the check of the pending half")


async def test_what_cannot_change_is_refused_and_nothing_changes(
    broker: BrokerController,
) -> None:
    async with AsyncAdminClient(broker.address) as admin:
        before = await admin.broker_config()
        with pytest.raises(NoPermissionError) as refused:
            await admin.update_broker_config({"listenPort": 1, "maxReconsumeTimes": 2})
        assert "listenPort cannot change while the broker runs" in str(refused.value)
        assert "transactionCheckMax" in str(refused.value)  # says what can
        with pytest.raises(InvalidParameterError, match="diskMaxUsedSpaceRatio must be 0..100"):
            await admin.update_broker_config({"diskMaxUsedSpaceRatio": 150})
        with pytest.raises(InvalidParameterError, match="maxReconsumeTimes from"):
            await admin.update_broker_config({"maxReconsumeTimes": "many"})
        with pytest.raises(InvalidParameterError, match="unknown configuration key"):
            await admin.update_broker_config({"noSuchKey": 1})
        assert await admin.broker_config() == before
    assert not os.path.exists(runtime_file(broker.config))


async def test_a_damaged_settings_file_is_set_aside_not_a_failed_start(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    config = make_broker_config()
    path = Path(runtime_file(config))
    path.parent.mkdir(parents=True)
    path.write_text('{"maxReconsumeTimes": 3, "listenPort"')  # torn
    async with started(config, stop_within=30) as broker:
        assert broker.config.max_reconsume_times == config.max_reconsume_times
        aside = [p.name for p in path.parent.iterdir() if p.name.startswith("runtime.json.")]
        assert len(aside) == 1 and aside[0].startswith("runtime.json.damaged-"), aside
        assert not path.exists()


async def test_the_cli_and_the_sync_admin_client(broker: BrokerController) -> None:
    out = await cli("config", "set", "-b", broker.address, "-o", "json", "transactionCheckMax=4")
    assert json.loads(out) == [{"key": "transactionCheckMax", "value": "4"}]
    err = await cli("config", "set", "-b", broker.address, "flushDiskType=SYNC_FLUSH", ok=False)
    assert "NoPermissionError: flushDiskType cannot change while the broker runs" in err
    err = await cli("config", "set", "-b", broker.address, "maxReconsumeTimes", ok=False)
    assert "is not KEY=VALUE" in err

    def sync_side() -> dict[str, str]:
        with AdminClient(broker.address) as admin:
            admin.update_broker_config({"diskFullPolicy": "delete_oldest"})
            return admin.broker_config()

    settings = await asyncio.to_thread(sync_side)
    assert settings["diskFullPolicy"] == "delete_oldest"
    assert settings["transactionCheckMax"] == "4"
    assert broker.store.config.disk_full_policy == "delete_oldest"


def test_the_help_lists_exactly_the_keys_that_can_change() -> None:
    res = CliRunner().invoke(main, ["config", "set", "--help"], prog_name="txmq")
    assert res.exit_code == 0, res.output
    listed = set(re.findall(r"^ {4}([a-zA-Z]+) {2,}", res.output, re.MULTILINE))
    assert listed == set(RUNTIME_KEYS), listed ^ set(RUNTIME_KEYS)

"""Quotas: a real broker, a real plain_acl.yml with two accounts, signed requests over TCP.  An
account over its produce rate is delayed, then refused with SYSTEM_BUSY ``[TOO_MANY_REQUESTS]``
naming it and its limit, while another account's sends keep their latency; an account over its
connection limit is refused at its first request and its connection closed; clients without an
account get the broker configuration's defaults per address; a consume rate slows pulls."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.support.acl_files import acl_file, open_account, write_acl
from tests.support.brokers import raw_broker, started
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.acl import AclConfigError, parse_acl_document
from txmq.broker.config import BrokerConfig, ConfigError
from txmq.broker.server import BrokerController
from txmq.client import AsyncProducer, ClientConfig, Message
from txmq.protocol.acl import Credentials
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import SystemBusyError

RATE = 64 * 1024
ACL_FILE = acl_file(
    open_account("flooder", "secret-flood-1", produceByteRate=RATE),
    open_account("quieter", "secret-quiet-1"),
    open_account("limited", "secret-limit-1", maxConnections=2),
)

FLOODER = Credentials("flooder", "secret-flood-1")
QUIET = Credentials("quieter", "secret-quiet-1")
LIMITED = Credentials("limited", "secret-limit-1")


@pytest.fixture
async def quota_broker(
    make_broker_config: Callable[..., BrokerConfig], tmp_path: Path
) -> AsyncIterator[BrokerController]:
    path = write_acl(tmp_path, ACL_FILE)
    async with started(make_broker_config(acl_enable=True, plain_acl_file=str(path))) as b:
        yield b


def throttled(b: BrokerController, account: str, kind: str) -> float:
    snap = b.metrics.snapshot()
    return float(snap.get(f"txmq_quota_throttled_total{{account={account},kind={kind}}}", 0))


async def _timed_send(c: RawClient, topic: str, body: bytes) -> float:
    t0 = time.perf_counter()
    r = await c.send(topic, body)
    assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    return time.perf_counter() - t0


async def test_a_flooding_account_is_throttled_and_another_keeps_its_latency(
    quota_broker: BrokerController,
) -> None:
    b = quota_broker
    quiet = await RawClient.connect(b.address, credentials=QUIET)
    flood = [await RawClient.connect(b.address, credentials=FLOODER) for _ in range(4)]
    try:
        await _timed_send(quiet, "calm", b"warm-up")
        unloaded = [await _timed_send(quiet, "calm", b"q" * 200) for _ in range(40)]

        stop = asyncio.Event()
        stored = 0
        refusals: list[str] = []
        body = b"f" * (16 * 1024)

        async def flooder(c: RawClient) -> None:
            nonlocal stored
            while not stop.is_set():
                r = await c.send("storm", body)
                if r.code == ResponseCode.SUCCESS:
                    stored += len(body)
                else:
                    assert r.code == ResponseCode.SYSTEM_BUSY, (r.code, r.remark)
                    refusals.append(r.remark or "")
                    await asyncio.sleep(0.01)  # a stock producer's next attempt

        started = time.monotonic()
        tasks = [asyncio.create_task(flooder(c)) for c in flood for _ in range(2)]
        try:
            loaded = []
            while time.monotonic() - started < 3.0:
                loaded.append(await _timed_send(quiet, "calm", b"q" * 200))
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
        elapsed = time.monotonic() - started

        # The flooder stored no more than its rate allows: a second of burst, a second of
        # debt (quotaMaxThrottleMs) and what its eight senders had in flight on top.
        assert stored <= RATE * (elapsed + 2) + 8 * len(body), (stored, elapsed)
        assert stored >= RATE * 0.5, stored  # throttled, not shut out
        assert refusals, "the flooder was never refused"
        assert all(
            r.startswith("[TOO_MANY_REQUESTS]")
            and "account 'flooder'" in r
            and f"produceByteRate {RATE}" in r
            for r in refusals
        ), refusals[:3]
        assert throttled(b, "flooder", "produce") >= len(refusals)
        assert throttled(b, "quieter", "produce") == 0
        # The other account's sends keep their latency (generous: the machine is shared).
        p50_before, p50_during = statistics.median(unloaded), statistics.median(loaded)
        assert p50_during <= max(5 * p50_before, 0.1), (p50_before, p50_during)
    finally:
        for c in [quiet, *flood]:
            await c.close()


async def test_an_account_over_its_connection_limit_is_refused_and_closed(
    quota_broker: BrokerController,
) -> None:
    b = quota_broker
    first = await RawClient.connect(b.address, credentials=LIMITED)
    second = await RawClient.connect(b.address, credentials=LIMITED)
    other = await RawClient.connect(b.address, credentials=QUIET)
    third = await RawClient.connect(b.address, credentials=LIMITED)
    try:
        for c in (first, second, other):
            await c.heartbeat(["p"])
        r = await third.call(RequestCode.HEART_BEAT, body=b'{"clientID":"x"}')
        assert r.code == ResponseCode.SYSTEM_BUSY, (r.code, r.remark)
        assert r.remark is not None and r.remark.startswith("[TOO_MANY_CONNECTIONS]"), r.remark
        assert "account 'limited'" in r.remark and "maxConnections) is 2" in r.remark, r.remark
        assert await third.conn.wait_closed(5.0), "the refused connection was not closed"
        assert throttled(b, "limited", "connections") == 1
        # The accounts' connections that were admitted are still served.
        assert (await first.send("t", b"x")).code == ResponseCode.SUCCESS
        # One closes: a new connection of the account is admitted again.
        await second.close()
        await wait_until(lambda: b.quota is not None and b.quota.connections["limited"] == 1)
        async with connected(b.address, credentials=LIMITED) as fourth:
            assert (await fourth.send("t", b"y")).code == ResponseCode.SUCCESS
    finally:
        for c in (first, second, other, third):
            await c.close()


async def test_clients_without_an_account_get_the_default_per_address(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    async with raw_broker(make_broker_config(quota_max_connections=1)) as (b, one):
        async with connected(b.address) as two:
            assert (await one.send("t", b"x")).code == ResponseCode.SUCCESS
            r = await two.send("t", b"y")
            assert r.code == ResponseCode.SYSTEM_BUSY, (r.code, r.remark)
            assert r.remark is not None and "client address 127.0.0.1" in r.remark, r.remark
            assert await two.conn.wait_closed(5.0)


async def test_a_consume_rate_slows_pulls(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    rate = 32 * 1024
    async with raw_broker(make_broker_config(quota_consume_byte_rate=rate)) as (b, c):
        for _ in range(40):  # 160 KiB
            assert (await c.send("slow", b"s" * 4096, queue_id=0)).code == ResponseCode.SUCCESS
        t0 = time.monotonic()
        got, offset, busy = 0, 0, 0
        while got < 40:
            resp, msgs = await c.pull("slow", 0, offset, max_nums=4)
            if resp.code == ResponseCode.SYSTEM_BUSY:
                assert resp.remark and "consumeByteRate" in resp.remark, resp.remark
                busy += 1
                await asyncio.sleep(0.05)
                continue
            assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
            got += len(msgs)
            offset = int(resp.ext_fields["nextBeginOffset"])
        took = time.monotonic() - t0
        # 160 KiB at 32 KiB/s after a 32 KiB burst: four seconds; at least half of it.
        assert took >= 2.0, took
        assert throttled(b, "address:127.0.0.1", "consume") > 0


def test_quota_settings_are_checked() -> None:
    doc = {"accounts": [{"accessKey": "abcdef", "secretKey": "123456", "produceByteRate": -1}]}
    with pytest.raises(AclConfigError, match="produceByteRate"):
        parse_acl_document(doc, "f.yml")
    doc["accounts"][0]["produceByteRate"] = "lots"
    with pytest.raises(AclConfigError, match="whole number"):
        parse_acl_document(doc, "f.yml")
    doc["accounts"][0]["produceByteRate"] = 1000
    acct = parse_acl_document(doc, "f.yml").accounts["abcdef"]
    assert acct.quota.produce_byte_rate == 1000 and acct.quota.max_connections is None
    with pytest.raises(ConfigError, match="quotaMaxConnections"):
        BrokerConfig(quota_max_connections=-1)


async def test_the_sdk_producer_slows_to_its_rate_and_sees_the_refusal(
    quota_broker: BrokerController, make_broker_config: Callable[..., BrokerConfig]
) -> None:
    # Within quotaMaxThrottleMs the answers are only delayed: a producer sending one message
    # at a time slows to its account's rate, every send stored.
    flooder = ClientConfig(access_key="flooder", secret_key="secret-flood-1")
    body = b"s" * (32 * 1024)
    async with AsyncProducer("sdk-slow", quota_broker.address, config=flooder) as producer:
        t0 = time.monotonic()
        for _ in range(6):  # 192 KiB at 64 KiB/s: 1.5 s (a 64 KiB burst, the last debt unpaid)
            await producer.send(Message("sdk-slow", body))
        took = time.monotonic() - t0
    assert took >= 1.2, took
    assert throttled(quota_broker, "flooder", "produce") > 0

    # Refused past it (here at once: quotaMaxThrottleMs 0): the SDK retries SYSTEM_BUSY, then
    # raises it with the broker's words.
    async with started(
        make_broker_config(quota_produce_byte_rate=8 * 1024, quota_max_throttle_ms=0)
    ) as b:
        async with AsyncProducer("sdk-busy", b.address) as producer:
            # Passes (no debt yet) and leaves five seconds of debt.
            await producer.send(Message("sdk-busy", b"b" * (48 * 1024)))
            with pytest.raises(SystemBusyError, match=r"\[TOO_MANY_REQUESTS\] client address"):
                await producer.send(Message("sdk-busy", b"b" * (48 * 1024)))
        # Each attempt, the SDK's retries included, was refused and counted.
        assert throttled(b, "address:127.0.0.1", "produce") == 3

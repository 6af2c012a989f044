"""One seam for the four direct paths: every remoting send is counted by the path it took
(``txmq_send_path_total{path}``), and one switch, ``fastPathEnable``, turns them all off (its
old name ``batchFastPathEnable`` is still read, with a warning)."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from tests.support.brokers import raw_broker, started
from tests.support.fastpath import batch_body, batch_header
from tests.support.logs import fresh_loggers
from tests.support.raw import connected
from txmq.broker.config import load_config
from txmq.broker.messaging.fastpath import PATHS
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import MessageConst, MessageSysFlag, properties_to_string

C = MessageConst
GROUP = "paths-g"
TOPIC = "paths-t"


def _one(props: dict[str, str], sys_flag: int = 0) -> dict[str, Any]:
    return SendMessageRequestHeader(
        producer_group=GROUP,
        topic=TOPIC,
        queue_id=0,
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_000,
        flag=0,
        properties=properties_to_string(props),
    ).to_v2_ext_fields()


def _half(uniq: str, txid: str) -> dict[str, str]:
    return {C.UNIQ_KEY: uniq, C.TRAN_MSG: "true", C.PGROUP: GROUP, C.TRANSACTION_ID: txid}


async def _send_one_of_each(b: BrokerController) -> dict[str, float]:
    """A plain message, a half, a batch of each, and a delayed message (no direct path);
    the ``txmq_send_path_total`` samples after them."""
    prepared = MessageSysFlag.TRANSACTION_PREPARED_TYPE
    async with connected(b.address) as c:
        calls: list[tuple[int, dict[str, Any], bytes]] = [
            (RequestCode.SEND_MESSAGE_V2, _one({C.UNIQ_KEY: "P1"}), b"plain"),
            (RequestCode.SEND_MESSAGE_V2, _one(_half("H1", "tx-1"), prepared), b"half"),
            (
                RequestCode.SEND_BATCH_MESSAGE,
                batch_header(GROUP, TOPIC, 0, 0),
                batch_body(
                    [
                        (b"b", 0, properties_to_string({C.UNIQ_KEY: f"B{i}"}).encode())
                        for i in (1, 2)
                    ]
                ),
            ),
            (
                RequestCode.SEND_BATCH_MESSAGE,
                batch_header(GROUP, TOPIC, 0, prepared),
                batch_body(
                    [
                        (b"h", 0, properties_to_string(_half(f"BH{i}", "tx-2")).encode())
                        for i in (1, 2)
                    ]
                ),
            ),
            (RequestCode.SEND_MESSAGE_V2, _one({C.UNIQ_KEY: "D1", C.DELAY: "2"}), b"delayed"),
        ]
        for code, ext, body in calls:
            resp = await c.call(code, ext, body)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
    snap = b.metrics.snapshot()
    return {p: snap.get(f"txmq_send_path_total{{path={p}}}", 0.0) for p in PATHS}


async def test_each_path_a_send_takes_is_counted(make_broker_config: Any) -> None:
    async with started(make_broker_config()) as b:
        counted = await _send_one_of_each(b)
    assert counted == {
        "plain": 1,
        "halves": 1,
        "one_plain": 1,
        "one_half": 1,
        "generic": 1,
        "disabled": 0,
    }


async def test_one_switch_turns_every_direct_path_off(make_broker_config: Any) -> None:
    async with started(make_broker_config(fast_path_enable=False)) as b:
        counted = await _send_one_of_each(b)
    assert counted == dict.fromkeys(PATHS, 0.0) | {"disabled": 5}


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Any:
    fresh_loggers(monkeypatch)
    with structlog.testing.capture_logs() as captured:
        yield captured


def _renamed(captured: list[dict[str, Any]]) -> list[str]:
    return [e["key"] for e in captured if e["event"] == "config_key_renamed"]


def test_the_old_switch_name_is_read_with_a_warning(tmp_path: Any, logs: Any) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text("batchFastPathEnable = false\n")
    assert load_config(toml, env={}).fast_path_enable is False
    assert load_config(None, env={"TXMQ_BATCH_FAST_PATH_ENABLE": "false"}).fast_path_enable is False
    cli = load_config(None, env={}, overrides={"batchFastPathEnable": "false"})
    assert cli.fast_path_enable is False
    snake = load_config(None, env={}, overrides={"batch_fast_path_enable": False})
    assert snake.fast_path_enable is False
    assert _renamed(logs) == [
        "batchFastPathEnable",
        "TXMQ_BATCH_FAST_PATH_ENABLE",
        "batchFastPathEnable",
        "batch_fast_path_enable",
    ]


def test_the_new_switch_name_wins_over_the_old(tmp_path: Any, logs: Any) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text("batchFastPathEnable = false\nfastPathEnable = true\n")
    assert load_config(toml, env={}).fast_path_enable is True
    env = {"TXMQ_BATCH_FAST_PATH_ENABLE": "false", "TXMQ_FAST_PATH_ENABLE": "true"}
    assert load_config(None, env=env).fast_path_enable is True
    assert load_config(None, env={}).fast_path_enable is True
    assert _renamed(logs) == ["batchFastPathEnable", "TXMQ_BATCH_FAST_PATH_ENABLE"]


async def test_a_send_is_admitted_before_its_topic_is_created(make_broker_config: Any) -> None:
    """The produce quota (like the ACL) admits a send before a direct path looks its topic up:
    a send refused for a client over its byte rate creates no topic."""
    async with raw_broker(
        make_broker_config(quota_produce_byte_rate=64, quota_max_throttle_ms=0)
    ) as (b, c):
        first = await c.call(RequestCode.SEND_MESSAGE_V2, _one({C.UNIQ_KEY: "Q1"}), b"x" * 200)
        assert first.code == ResponseCode.SUCCESS, first.remark
        ext = _one({C.UNIQ_KEY: "Q2"})
        ext["b"] = "paths-fresh"
        refused = await c.call(RequestCode.SEND_MESSAGE_V2, ext, b"y")
        assert refused.code == ResponseCode.SYSTEM_BUSY, refused.remark
        assert refused.remark is not None and refused.remark.startswith("[TOO_MANY_REQUESTS]")
        snap = b.metrics.snapshot()
        assert snap.get("txmq_send_path_total{path=one_plain}") == 1  # the first, directly
        assert b.topics.get("paths-fresh") is None

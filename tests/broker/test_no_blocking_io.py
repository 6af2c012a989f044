"""No fsync and no atomic file write on the event loop: offsets, topic configs, transaction
check state, retention and the commit-log flush all run on worker threads, under a workload
that touches each of them, through shutdown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.loopguard import blocking_call_guard
from tests.support.raw import RawClient
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.broker.store import atomic_write
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import CreateTopicRequestHeader
from txmq.protocol.message import encode_batch

COMMIT = 8


async def test_the_guard_sees_an_atomic_write_on_the_loop_and_not_off_it(tmp_path: Path) -> None:
    with blocking_call_guard() as guard:
        await asyncio.to_thread(atomic_write, str(tmp_path / "off"), b"1")
        assert guard.calls == []
        atomic_write(str(tmp_path / "on"), b"1")
    assert any("fsync" in c for c in guard.calls) and any("os.rename" in c for c in guard.calls)


def _has(path: Path, section: str, key: str | None) -> bool:
    """Whether the JSON document at ``path`` has ``key`` in its ``section`` object."""
    table = _json(path).get(section)
    return isinstance(table, dict) and key in table


def _json(path: Path) -> dict[str, object]:
    try:
        doc = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
async def test_a_busy_broker_never_blocks_its_loop_on_the_disk(
    make_broker_config: Callable[..., BrokerConfig], flush: str
) -> None:
    cfg = make_broker_config(
        flush_disk_type=flush,
        flush_consumer_offset_interval=100,
        transaction_time_out=100,
        transaction_check_interval=100,
        transaction_check_max=1000,
    )
    root = Path(cfg.store_path_root_dir)
    broker = BrokerController(cfg)
    await broker.start()  # recovery at start reads and writes on the loop, before serving
    checks: list[RemotingCommand] = []

    async def producer_side(conn: object, cmd: RemotingCommand) -> RemotingCommand:
        checks.append(cmd)
        return cmd.response()  # accepted; the answer comes as END_TRANSACTION later

    with blocking_call_guard() as guard:
        try:
            c = await RawClient.connect(broker.address, producer_side)
            # A consumer group (its retry topic is created) and a producer group.
            await c.heartbeat(producer_groups=["guard-tx"], consumer_groups={"g": {"t1": "*"}})
            # A topic created by an operator, one by a send, one by a batch.
            h = CreateTopicRequestHeader(topic="made", read_queue_nums=2, write_queue_nums=2)
            made = await c.call(RequestCode.UPDATE_AND_CREATE_TOPIC, h.to_ext_fields())
            assert made.code == ResponseCode.SUCCESS
            for i in range(20):
                assert (await c.send("t1", f"m{i}".encode())).code == ResponseCode.SUCCESS
            body = encode_batch([(b"b", 0, {"UNIQ_KEY": f"K{i}"}) for i in range(5)])
            from txmq.protocol.headers import SendMessageRequestHeader

            bh = SendMessageRequestHeader(producer_group="p", topic="t2", queue_id=0, batch=True)
            sent = await c.call(RequestCode.SEND_BATCH_MESSAGE, bh.to_v2_ext_fields(), body)
            assert sent.code == ResponseCode.SUCCESS, sent.remark
            # Offsets committed; a message returned for a retry (the retry topic exists now).
            q = {"consumerGroup": "g", "topic": "t1", "queueId": 0, "commitOffset": 3}
            assert (await c.call(RequestCode.UPDATE_CONSUMER_OFFSET, q)).code == 0
            _, [m] = await c.pull("t1", 0, 0, max_nums=1)
            back = await c.call(
                RequestCode.CONSUMER_SEND_MSG_BACK,
                {
                    "offset": m.commit_log_offset,
                    "group": "g",
                    "delayLevel": 0,
                    "originMsgId": m.msg_id,
                    "originTopic": "t1",
                    "maxReconsumeTimes": 16,
                },
            )
            assert back.code == ResponseCode.SUCCESS, back.remark
            # A transaction that is checked (check state persisted), then committed.
            half = await c.send("orders", b"half", group="guard-tx", transactional=True)
            await wait_until(lambda: len(checks) >= 2, what="two check-backs")
            txid = c.send_header(half).transaction_id
            check_state = root / "transaction" / "checkState.json"
            await wait_until(
                lambda: _has(check_state, "checks", txid),
                what="the check state to be written",
            )
            resp = await c.end_transaction("guard-tx", half, COMMIT)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            # Housekeeping writes the offsets and the topic table.
            offsets = root / "config" / "consumerOffset.json"
            await wait_until(
                lambda: _has(offsets, "offsetTable", "t1@g"),
                what="the offsets to be written",
            )
            topics = dict(_json(root / "config" / "topics.json").get("topicConfigTable") or {})  # type: ignore[call-overload]
            assert {"made", "t1", "t2", "%RETRY%g", "orders"} <= set(topics)
            await c.close()
        finally:
            await broker.shutdown()
    assert guard.calls == [], f"blocking calls on the event loop:\n{guard.report()}"

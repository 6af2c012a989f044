"""What an operator alerts on: a real broker, real traffic, /metrics read over HTTP.

Every txmq_* name the shipped Grafana dashboard and Prometheus rules use is exported, and the
figures match the traffic made: consumer lag (messages and age), request latency counts, messages
out per (topic, group), pending and parked transactions, disk."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support.brokers import raw_broker, started
from tests.support.ports import free_port
from tests.support.raw import RawClient
from tests.support.scrape import (
    ALERTS,
    CLUSTER_ONLY,
    EXPORTER_RULES,
    Samples,
    names,
    referenced,
    scrape,
    value,
)
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.broker.transaction.state import TxState
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.message import decode_message

TOPIC = "metrics-orders"
GROUP = "metrics-consumers"
LIVE = "metrics-tx-live"  # its producer takes checks and never decides: parked after the budget
OFFLINE = "metrics-tx-offline"  # no producer online: stays pending
AGE = 1000.0  # seconds the clock is moved past the oldest unconsumed message before the scrape


async def _ack_checks(conn: object, cmd: RemotingCommand) -> RemotingCommand | None:
    """A producer that takes every check and answers none of them."""
    return cmd.response() if cmd.code == RequestCode.CHECK_TRANSACTION_STATE else None


async def test_dashboard_and_alert_metrics_are_exported_with_the_traffics_values(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    frozen: list[float | None] = [None]

    def clock() -> float:
        f = frozen[0]
        return time.time() if f is None else f

    port = free_port()
    b = BrokerController(
        make_broker_config(
            metrics_port=port,
            transaction_time_out=0,
            transaction_check_interval=50,
            transaction_check_max=2,
        ),
        clock=clock,
    )
    await b.start()
    c = await RawClient.connect(b.address)
    live = await RawClient.connect(b.address, _ack_checks)
    try:
        await live.heartbeat(producer_groups=[LIVE])
        # 3 messages on queue 1 first (the oldest unconsumed), then 7 on queue 0.
        sends = 0
        t_sends = time.perf_counter()
        for qid, n in ((1, 3), (0, 7)):
            for i in range(n):
                c.send_header(await c.send(TOPIC, b"m%d" % i, queue_id=qid))
                sends += 1
        # the group takes 4 from queue 0 and commits them; queue 1 it never touches
        resp, got = await c.pull(TOPIC, 0, 0, group=GROUP, max_nums=4)
        assert resp.code == ResponseCode.SUCCESS and len(got) == 4, resp.remark
        r = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0, "commitOffset": 4},
        )
        assert r.code == ResponseCode.SUCCESS, r.remark
        resp, _ = await c.pull("metrics-no-such-topic", 0, 0, group=GROUP)  # an error answer
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST, resp.remark
        # a transaction parked after its check budget, another one left pending
        parked = live.send_header(await live.send(TOPIC, b"p", group=LIVE, transactional=True))
        pending = c.send_header(await c.send(TOPIC, b"q", group=OFFLINE, transactional=True))
        window = time.perf_counter() - t_sends  # every SEND_MESSAGE_V2 was answered in it
        assert parked.transaction_id and pending.transaction_id
        tx = b.transactions
        await wait_until(
            lambda: tx.records[parked.transaction_id or ""].state is TxState.DISCARDED,
            what="the live group's transaction parked after 2 unanswered checks",
        )
        assert tx.records[pending.transaction_id].state is TxState.PENDING

        # The clock stops AGE seconds after the oldest unconsumed message (queue 1, offset 0).
        oldest = b.store.get_messages(TOPIC, 1, 0, 1)
        oldest_ts = decode_message(oldest.messages[0]).store_timestamp
        frozen[0] = (oldest_ts + AGE * 1000 + 0.5) / 1000.0  # whole ms: exact ages below
        half_ts = {
            t: tx.records[t].oldest_store_timestamp
            for t in (parked.transaction_id, pending.transaction_id)
        }
        s: Samples = await asyncio.to_thread(scrape, port)

        # every name the dashboard and the rules use (cluster-only ones: tests/cluster)
        exported = names(s)
        for where, used in referenced().items():
            assert used, f"{where} uses no txmq_* metric: the parser found nothing"
            missing = used - CLUSTER_ONLY - exported
            assert not missing, f"{where} uses metrics the broker does not export: {missing}"

        # every sample carries the broker's identity (what rocketmq-exporter groups by)
        raw = await asyncio.to_thread(scrape, port, identity=True)
        ident = {("cluster", b.config.broker_cluster_name), ("broker", b.config.broker_name)}
        assert raw and all(ident <= labels for _, labels in raw), "a sample without identity"

        # consumer lag: 10 sent, 4 consumed; the age is the clock minus the oldest's store time
        assert value(s, "txmq_consumer_lag_messages", group=GROUP, topic=TOPIC) == 10 - 4
        # rocketmq-exporter's offsets: the topic's end and the group's committed progress
        assert value(s, "txmq_topic_offset", topic=TOPIC) == 10
        assert value(s, "txmq_consumer_offset", group=GROUP, topic=TOPIC) == 4
        assert value(s, "txmq_consumer_lag_seconds", group=GROUP, topic=TOPIC) == AGE
        assert value(s, "txmq_messages_out_total", topic=TOPIC, group=GROUP) == 4

        # latency: one observation per request of the code, adding up to less than the time
        # the client took to send them one after another
        code = str(int(RequestCode.SEND_MESSAGE_V2))
        observed = value(s, "txmq_request_latency_seconds_count", code=code)
        assert observed == sends + 2, (observed, sends)  # plus the two halves
        total = value(s, "txmq_request_latency_seconds_sum", code=code) or 0.0
        assert 0 < total < window, (total, window)
        assert value(s, "txmq_request_latency_seconds_bucket", code=code, le="+Inf") == observed
        pull = str(int(RequestCode.PULL_MESSAGE))
        assert value(s, "txmq_request_latency_seconds_count", code=pull) == 2
        assert (
            value(s, "txmq_request_errors_total", code=str(int(ResponseCode.TOPIC_NOT_EXIST))) == 1
        )

        # transactions: one pending, one parked, ages from the frozen clock
        now_ms = oldest_ts + AGE * 1000
        assert value(s, "txmq_transaction_pending", topic=TOPIC, group=OFFLINE) == 1
        assert value(s, "txmq_transaction_pending_oldest_seconds", topic=TOPIC, group=OFFLINE) == (
            (now_ms - half_ts[pending.transaction_id]) / 1000.0
        )
        assert value(s, "txmq_transaction_parked", topic=TOPIC, group=LIVE) == 1
        assert value(s, "txmq_transaction_parked_oldest_seconds", topic=TOPIC, group=LIVE) == (
            (now_ms - half_ts[parked.transaction_id]) / 1000.0
        )

        # disk: ratios of the store's filesystem, and the commit log's retained bytes
        used_ratio = value(s, "txmq_disk_used_ratio") or 0.0
        free = value(s, "txmq_disk_free_ratio") or 0.0
        assert 0 < used_ratio < 1 and 0 < free < 1 and used_ratio + free <= 1.0001, (
            used_ratio,
            free,
        )
        assert value(s, "txmq_commit_log_bytes") == b.store.max_phy_offset - b.store.min_phy_offset
        assert (value(s, "txmq_disk_total_bytes") or 0) > 0

        # consuming the rest brings the lag, and its age, to 0
        r = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0, "commitOffset": 7},
        )
        r2 = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 1, "commitOffset": 3},
        )
        assert r.code == r2.code == ResponseCode.SUCCESS
        s = await asyncio.to_thread(scrape, port)
        assert value(s, "txmq_consumer_lag_messages", group=GROUP, topic=TOPIC) == 0
        assert value(s, "txmq_consumer_lag_seconds", group=GROUP, topic=TOPIC) == 0
    finally:
        await c.close()
        await live.close()
        await b.shutdown()


async def test_a_scrape_while_the_loop_is_blocked_still_answers(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """A scrape whose loop does not answer (here: blocked by the test's own synchronous read)
    refreshes the figures from the server's thread instead of hanging."""
    port = free_port()
    async with raw_broker(make_broker_config(metrics_port=port)) as (b, c):
        c.send_header(await c.send(TOPIC, b"x", queue_id=0))
        r = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0, "commitOffset": 0},
        )
        assert r.code == ResponseCode.SUCCESS
        t0 = time.monotonic()
        s = scrape(port)  # blocks the loop on purpose
        assert time.monotonic() - t0 < 5.0
        assert value(s, "txmq_consumer_lag_messages", group=GROUP, topic=TOPIC) == 1


async def test_the_process_python_and_build_figures_every_exporter_has(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """Dashboards and alerts made for any Prometheus exporter find ``process_*``,
    ``python_info`` and a build-info series."""
    import platform

    from txmq import __version__

    port = free_port()
    async with started(make_broker_config(metrics_port=port)):
        s = await asyncio.to_thread(scrape, port)
        assert (value(s, "process_resident_memory_bytes") or 0) > 10_000_000
        assert (value(s, "process_cpu_seconds_total") or 0) > 0
        assert (value(s, "process_open_fds") or 0) > 0
        build = {
            "version": __version__,
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
        }
        assert value(s, "txmq_build_info", **build) == 1, sorted(
            k for k in s if k[0] == "txmq_build_info"
        )
        assert any(name == "python_info" for name, _labels in s)


def test_the_alert_rules_cover_what_an_operator_is_paged_for() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    by_name = {r["alert"]: r for r in rules}
    assert len(by_name) == len(rules), "alert names repeat"
    for r in rules:
        assert r["expr"].strip() and r["labels"]["severity"] in ("warning", "critical"), r
        assert r["annotations"]["summary"], r
    wanted = {
        "TxmqBrokerDown": "up{",
        "TxmqPendingHalfTooOld": "txmq_transaction_pending_oldest_seconds",
        "TxmqConsumerLagMessages": "txmq_consumer_lag_messages",
        "TxmqConsumerLagAge": "txmq_consumer_lag_seconds",
        "TxmqInSyncReplicasBelowMinimum": "txmq_min_in_sync_replicas",
        "TxmqDiskFreeLow": "txmq_disk_free_ratio",
    }
    for name, metric in wanted.items():
        assert metric in by_name[name]["expr"], (name, by_name[name]["expr"])


#: What rocketmq-exporter exports (its RMQMetricsCollector): the rules record these names only.
EXPORTER_NAMES = frozenset(
    {
        "rocketmq_broker_tps",
        "rocketmq_broker_qps",
        "rocketmq_producer_tps",
        "rocketmq_producer_message_size",
        "rocketmq_producer_offset",
        "rocketmq_topic_retry_offset",
        "rocketmq_topic_dlq_offset",
        "rocketmq_consumer_tps",
        "rocketmq_group_consume_tps",
        "rocketmq_consumer_message_size",
        "rocketmq_consumer_offset",
        "rocketmq_group_diff",
        "rocketmq_group_retrydiff",
        "rocketmq_message_accumulation",
        "rocketmq_group_get_latency_by_storetime",
        *(
            f"rocketmq_brokeruntime_{kind}_tps{window}"
            for kind in ("put", "gettransfered", "gettotal")
            for window in (10, 60, 600)
        ),
        "rocketmq_brokeruntime_putmessage_times_total",
        "rocketmq_brokeruntime_put_message_size_total",
        "rocketmq_brokeruntime_put_message_average_size",
        "rocketmq_brokeruntime_commitlog_disk_ratio",
        "rocketmq_brokeruntime_start_accept_sendrequest_time",
    }
)
RULES_TEST = Path(__file__).resolve().parents[1] / "support" / "prometheus"


def _promtool() -> str:
    """promtool (``make promtool``: Debian's prometheus package unpacked), or a skip (a failure
    under CI)."""
    made = Path(__file__).resolve().parents[2] / "build" / "prometheus" / "bin" / "promtool"
    path = str(made) if os.access(made, os.X_OK) else shutil.which("promtool")
    if path:
        return path
    why = f"promtool not found at {made} or on PATH: run `make promtool` (`make test` does)"
    if os.environ.get("CI"):
        pytest.fail(why)
    print(why, file=sys.stderr)
    pytest.skip(why)


def test_the_exporter_rules_record_rocketmq_exporter_names_by_cluster_and_broker() -> None:
    """Each rule records one of rocketmq-exporter's names, once, keeping the cluster and broker
    labels its dashboards group by (the txmq series they read: the test above)."""
    doc = yaml.safe_load(EXPORTER_RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    recorded = [r["record"] for r in rules]
    assert len(recorded) == len(set(recorded)), "a name recorded twice"
    assert set(recorded) <= EXPORTER_NAMES, set(recorded) - EXPORTER_NAMES
    for r in rules:
        assert "by (cluster, broker" in r["expr"], r


def test_the_rule_files_pass_promtool() -> None:
    """promtool parses every expression (check rules) and computes what the exporter's
    names should be from txmq series (test rules)."""
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", str(EXPORTER_RULES), str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", "rocketmq-exporter-rules.test.yml"],
        cwd=RULES_TEST,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr

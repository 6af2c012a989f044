"""``txmq status`` (ping a broker, its key figures) and ``txmq connections`` (the live clients of
its producer and consumer groups)."""

from __future__ import annotations

import time
from typing import Any

import click

from .common import BROKER_OPTION, OUTPUT_OPTION, _admin, _echo_json, _emit, _output_options


@click.command()
@BROKER_OPTION
@_output_options
def status(broker: str, as_json: bool) -> None:
    """Ping the broker and print key figures (exit status 1 if it does not answer)."""
    t0 = time.perf_counter()
    info = _admin(broker, lambda admin: admin.runtime_info())
    ms = (time.perf_counter() - t0) * 1000  # connect + one request: the ping a user sees
    if as_json:
        _echo_json({"pingMs": round(ms, 2), **info})
        return
    click.echo(
        f"broker {info['brokerName']} at {info['address']} is up "
        f"(ping {ms:.1f} ms, version {info['brokerVersion']}, "
        f"uptime {info['uptimeMs'] / 1000:.0f} s)"
    )
    keys = [
        "flushDiskType",
        "topics",
        "connections",
        "store.commit_log_max_offset",
        "store.commit_log_unflushed_bytes",
        "store.commit_log_segments",
        "txn.pending",
        "txn.discarded",
        "txn.committed",
        "txn.rolledBack",
    ]
    for k in keys:
        if k in info:
            click.echo(f"  {k:28} {info[k]}")


@click.command()
@BROKER_OPTION
@OUTPUT_OPTION
@click.option("--producer-group", "-p", multiple=True, help="A producer group (repeatable).")
@click.option("--consumer-group", "-c", multiple=True, help="A consumer group (repeatable).")
def connections(
    broker: str, output: str, producer_group: tuple[str, ...], consumer_group: tuple[str, ...]
) -> None:
    """The live client connections of producer and consumer groups (default: every group
    the broker knows of)."""

    async def collect(admin: Any) -> list[dict[str, Any]]:
        from txmq.protocol.errors import BrokerResponseError

        consumers = list(consumer_group)
        producers = list(producer_group)
        if not consumers and not producers:
            consumers = await admin.consumer_groups()
            info = await admin.runtime_info()
            producers = sorted(info.get("producerGroups", {}))
        rows = []
        for g in producers:
            for c in await admin.producer_connections(g):
                rows.append({"role": "producer", "group": g, **c})
        for g in consumers:
            try:
                conns = (await admin.consumer_connections(g))["connectionSet"]
            except BrokerResponseError:
                conns = []
            rows.extend({"role": "consumer", "group": g, **c} for c in conns)
        return rows

    _emit(
        _admin(broker, collect),
        output,
        [("role", "role", 8), ("group", "group", 28), ("clientId", "client id", 36)]
        + [("clientAddr", "address", 22), ("language", "language", 0)],
    )

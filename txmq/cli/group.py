"""``txmq group list|show|update|delete|reset-offset``: consumer groups."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from .common import (
    BROKER_OPTION,
    OUTPUT_OPTION,
    _admin,
    _collect_pages,
    _echo_json,
    _emit,
    _leaders,
    _more,
    _output_options,
    _page_options,
    _parse_time,
)


@click.group()
def group() -> None:
    """Consumer groups: list them, show their progress, lag and settings, change their
    settings, delete one."""


@group.command("list")
@BROKER_OPTION
@OUTPUT_OPTION
@_page_options("At most this many groups, by name (default: all).")
def group_list(broker: str, output: str, limit: int | None, cursor: str | None) -> None:
    """Every consumer group the broker knows, by name, with its live consumers and total lag
    (asked for a page at a time)."""
    from txmq.client.admin import LIST_PAGE

    more: str | None = None

    async def collect(admin: Any) -> list[dict[str, Any]]:
        from txmq.protocol.errors import BrokerResponseError

        nonlocal more

        async def page(n: int, after: str | None) -> Any:
            table, nxt = await admin.list_groups_page(limit=n, after=after)
            return sorted(table), nxt

        names, more = await _collect_pages(page, limit, cursor, LIST_PAGE)
        rows = []
        for g in names:
            stats = await admin.consume_stats(g)
            try:
                members = len((await admin.consumer_connections(g))["connectionSet"])
            except BrokerResponseError:  # 206: no consumer online
                members = 0
            topics = sorted({s["topic"] for s in stats})
            lag = sum(s["lag"] for s in stats)
            rows.append({"group": g, "consumers": members, "topics": topics, "lag": lag})
        return rows

    rows = _admin(broker, collect)
    if output == "table":
        rows = [{**r, "topics": ",".join(r["topics"])} for r in rows]
    _emit(
        rows,
        output,
        [("group", "group", 32), ("consumers", "consumers", -9), ("lag", "lag", -10)]
        + [("topics", "topics", 0)],
    )
    _more(more)


@group.command("show")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("group_name", metavar="GROUP")
@click.option("--topic", "-t", help="Only this topic (default: every topic the group consumed).")
def group_show(broker: str, output: str, group_name: str, topic: str | None) -> None:
    """GROUP's progress per queue: the queue's end, the committed offset, the lag, and when
    the last consumed message was stored; then its live consumers and its settings."""

    async def collect(admin: Any) -> dict[str, Any]:
        from txmq.protocol.errors import BrokerResponseError, SubscriptionGroupNotExistError

        stats = await admin.consume_stats(group_name, topic)
        try:
            conns = await admin.consumer_connections(group_name)
        except BrokerResponseError:
            conns = {"connectionSet": []}
        try:
            config = await admin.group_config(group_name)
        except SubscriptionGroupNotExistError:
            config = None
        return {
            "group": group_name,
            "queues": stats,
            "consumers": conns["connectionSet"],
            "config": config,
        }

    doc = _admin(broker, collect)
    if output == "json":
        _echo_json(doc)
        return
    for q in doc["queues"]:
        ts = q["lastTimestamp"]
        q["last"] = (
            datetime.fromtimestamp(ts / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "-"
        )
    _emit(
        doc["queues"],
        "table",
        [("topic", "topic", 24), ("queueId", "queue", -5), ("brokerOffset", "end", -10)]
        + [("consumerOffset", "committed", -10), ("lag", "lag", -8), ("last", "last consumed", 0)],
    )
    click.echo(f"total lag: {sum(q['lag'] for q in doc['queues'])}")
    click.echo(f"consumers online: {len(doc['consumers'])}")
    for c in doc["consumers"]:
        click.echo(f"  {c['clientId']}  {c['clientAddr']}  {c['language']}")
    _echo_group_config(doc["config"])


def _echo_group_config(config: dict[str, Any] | None) -> None:
    """A group's settings as ``key: value`` lines, the ones the broker acts on first."""
    if config is None:
        click.echo("settings: none (the broker does not know the group)")
        return
    click.echo("settings:")
    acted_on = ("consumeMessageOrderly", "consumeEnable", "retryMaxTimes")
    for key in [*acted_on, *sorted(k for k in config if k not in acted_on)]:
        if key in config and key != "groupName":
            value = config[key]
            text = json.dumps(value) if isinstance(value, bool | dict | list) else value
            click.echo(f"  {key}: {text}")


@group.command("update")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("group_name", metavar="GROUP")
@click.option(
    "--orderly/--no-orderly",
    default=None,
    help="FIFO consumption for the group's RocketMQ 5 gRPC consumers (consumeMessageOrderly).",
)
@click.option(
    "--consume-enable/--consume-disable",
    default=None,
    help="Whether the group may consume: a disabled group's pulls and receives are refused.",
)
@click.option(
    "--retry-max-times",
    type=click.IntRange(min=-1),
    help="Redeliveries before a message goes to the group's dead-letter queue (retryMaxTimes).",
)
def group_update(
    broker: str,
    output: str,
    group_name: str,
    orderly: bool | None,
    consume_enable: bool | None,
    retry_max_times: int | None,
) -> None:
    """Change GROUP's settings (mqadmin updateSubGroup), keeping those not given; the broker
    keeps them across restarts.  Prints the settings now in force."""
    if orderly is None and consume_enable is None and retry_max_times is None:
        raise click.UsageError(
            "give at least one of --orderly/--no-orderly, --consume-enable/--consume-disable, "
            "--retry-max-times"
        )

    async def change(admin: Any) -> dict[str, Any]:
        await admin.update_group_config(
            group_name,
            orderly=orderly,
            consume_enable=consume_enable,
            retry_max_times=retry_max_times,
        )
        return dict(await admin.group_config(group_name))

    config = _admin(broker, change)
    if output == "json":
        _echo_json(config)
        return
    click.echo(f"consumer group {group_name} updated")
    _echo_group_config(config)


@group.command("delete")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("group_name", metavar="GROUP")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def group_delete(broker: str, output: str, group_name: str, yes: bool) -> None:
    """Forget GROUP's committed offsets and settings (refused while it has live consumers): a
    group of the same name starts afresh, from where its consume-from setting says.  In a
    cluster: in every broker group."""
    as_json = output == "json"
    if not yes:
        question = f"delete the committed offsets of consumer group {group_name}?"
        click.confirm(question, abort=True, err=as_json)  # stdout: only the JSON
    groups = []
    for broker_group, addr in _leaders(broker):
        _admin(addr, lambda admin: admin.delete_consumer_group(group_name))
        if broker_group:
            groups.append(broker_group)
        where = f" in broker group {broker_group}" if broker_group else ""
        if not as_json:
            click.echo(f"consumer group {group_name} deleted{where}")
    if as_json:
        _echo_json({"group": group_name, "deleted": True, "brokerGroups": groups})


@group.command("reset-offset")
@BROKER_OPTION
@_output_options
@click.argument("group_name", metavar="GROUP")
@click.option("--topic", "-t", required=True, help="The topic whose offsets move.")
@click.option("--to-time", help="The first message stored at or after: ms or an ISO time.")
@click.option("--to-offset", type=click.IntRange(min=0), help="This offset in every queue.")
@click.option("--to-earliest", is_flag=True, help="The oldest message still stored.")
@click.option("--to-latest", is_flag=True, help="The end of each queue (skip everything).")
@click.option(
    "--force/--no-force",
    default=True,
    show_default=True,
    help="With --no-force a queue only moves back (RocketMQ's isForce=false).",
)
def group_reset_offset(
    broker: str,
    group_name: str,
    topic: str,
    to_time: str | None,
    to_offset: int | None,
    to_earliest: bool,
    to_latest: bool,
    force: bool,
    as_json: bool,
) -> None:
    """Move GROUP's offsets on a topic; its live consumers continue from there at once.  In a
    cluster: in every broker group holding the topic."""
    chosen = [to_time is not None, to_offset is not None, to_earliest, to_latest]
    if sum(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --to-time, --to-offset, --to-earliest, --to-latest"
        )
    timestamp: Any = None
    if to_time is not None:
        timestamp = _parse_time(to_time)
    elif to_earliest:
        timestamp = 0
    elif to_latest:
        timestamp = 2**62  # after every message: each queue's end
    rows = []
    for broker_group, addr in _leaders(broker, topic) or [("", broker)]:
        offsets = _admin(
            addr,
            lambda admin: admin.reset_offset(
                group_name, topic, timestamp=timestamp, offset=to_offset, force=force
            ),
        )
        rows += [
            {"group": broker_group, "topic": topic, "queueId": q, "offset": o}
            for q, o in sorted(offsets.items())
        ]
    columns = [("topic", "topic", 24), ("queueId", "queue", -5), ("offset", "offset", -12)]
    if any(r["group"] for r in rows):
        columns = [("group", "broker group", 14), *columns]
    else:
        for r in rows:
            del r["group"]
    _emit(rows, "json" if as_json else "table", columns)

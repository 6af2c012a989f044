"""``txmq topic create|list|route|stats|update|delete``."""

from __future__ import annotations

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
)


@click.group()
def topic() -> None:
    """Create, list and inspect topics."""


@topic.command("create")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("name")
@click.option("--queues", "-q", default=4, show_default=True, help="Read and write queues.")
@click.option("--order", is_flag=True, help="Mark the topic as ordered.")
def topic_create(broker: str, output: str, name: str, queues: int, order: bool) -> None:
    """Create (or update) topic NAME.

    With -o json, prints its configuration as the broker now holds it."""

    async def create(admin: Any) -> dict[str, Any] | None:
        await admin.create_topic(name, queues, order=order)
        if output != "json":
            return None
        return dict((await admin.list_topics())[name])

    tc = _admin(broker, create)
    if output == "json":
        _echo_json(tc)
        return
    click.echo(f"topic {name} created with {queues} queues")


@topic.command("list")
@BROKER_OPTION
@_output_options
@click.option("--all", "show_all", is_flag=True, help="Include system, retry and DLQ topics.")
@_page_options("At most this many topics, by name (default: all).")
def topic_list(
    broker: str, show_all: bool, limit: int | None, cursor: str | None, as_json: bool
) -> None:
    """List topics, by name (asked for a page at a time)."""

    async def fetch(admin: Any) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        async def page(n: int, after: str | None) -> Any:
            table, nxt = await admin.list_topics_page(limit=n, after=after)
            return list(table.items()), nxt

        return await _collect_pages(page, limit, cursor, LIST_PAGE)

    from txmq.client.admin import LIST_PAGE

    result, more = _admin(broker, fetch)
    shown = {}
    for name, tc in sorted(result):
        system = name.startswith(("%", "RMQ_SYS_", "TRANS_CHECK_", "SCHEDULE_TOPIC"))
        if system and not show_all:
            continue
        shown[name] = tc
    if as_json:
        _echo_json(shown)
    else:
        for name, tc in shown.items():
            click.echo(
                f"{name}\tqueues={tc['writeQueueNums']}/{tc['readQueueNums']}\tperm={tc['perm']}"
            )
    _more(more)


@topic.command("route")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("name")
def topic_route(broker: str, output: str, name: str) -> None:
    """Where topic NAME lives: each broker group's queues, permission and leader address
    (the route clients get; mqadmin topicRoute)."""
    route = _admin(broker, lambda admin: admin.route(name))
    if route is None:
        raise click.ClickException(f"no topic {name!r} on this broker")
    addrs = {b["brokerName"]: b.get("brokerAddrs", {}) for b in route.get("brokerDatas", [])}
    rows = [
        {
            "group": q["brokerName"],
            "readQueues": q["readQueueNums"],
            "writeQueues": q["writeQueueNums"],
            "perm": q["perm"],
            "leader": addrs.get(q["brokerName"], {}).get("0", ""),
        }
        for q in sorted(route.get("queueDatas", []), key=lambda q: q["brokerName"])
    ]
    _emit(
        rows,
        output,
        [("group", "group", 16), ("readQueues", "read", -5), ("writeQueues", "write", -6)]
        + [("perm", "perm", -5), ("leader", "leader", 0)],
    )


@topic.command("stats")
@BROKER_OPTION
@_output_options
@click.argument("name")
def topic_stats(broker: str, name: str, as_json: bool) -> None:
    """Per-queue offsets and consumer-group progress of topic NAME."""
    result = _admin(broker, lambda admin: admin.topic_stats(name))

    doc = result
    if as_json:
        _echo_json(doc)
        return
    total = 0
    click.echo(f"{'queue':>5} {'min':>12} {'max':>12}")
    for q in doc["offsetTable"]:
        total += q["maxOffset"] - q["minOffset"]
        click.echo(f"{q['queueId']:>5} {q['minOffset']:>12} {q['maxOffset']:>12}")
    click.echo(f"messages stored: {total}")
    for group, offs in sorted(doc.get("consumerOffsets", {}).items()):
        lag = sum(q["maxOffset"] - offs.get(str(q["queueId"]), 0) for q in doc["offsetTable"])
        click.echo(f"group {group}: lag {lag}")


_PERMS = {"r": 4, "w": 2, "rw": 6}


@topic.command("update")
@BROKER_OPTION
@_output_options
@click.argument("name")
@click.option("--perm", type=click.Choice(sorted(_PERMS)), help="Readable, writable, or both.")
@click.option("--read-queues", type=click.IntRange(1, 1024), help="Read queue count.")
@click.option("--write-queues", type=click.IntRange(1, 1024), help="Write queue count.")
def topic_update(
    broker: str,
    name: str,
    perm: str | None,
    read_queues: int | None,
    write_queues: int | None,
    as_json: bool,
) -> None:
    """Change topic NAME's permission or queue counts (what is not given stays)."""
    if perm is None and read_queues is None and write_queues is None:
        raise click.UsageError("give --perm, --read-queues or --write-queues")
    tc = _admin(
        broker,
        lambda admin: admin.update_topic(
            name,
            perm=_PERMS[perm] if perm else None,
            read_queues=read_queues,
            write_queues=write_queues,
        ),
    )
    if as_json:
        _echo_json(tc)
        return
    click.echo(
        f"topic {name} updated: queues={tc['writeQueueNums']}/{tc['readQueueNums']} "
        f"perm={tc['perm']}"
    )


@topic.command("delete")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def topic_delete(broker: str, output: str, name: str, yes: bool) -> None:
    """Delete topic NAME: its config, consume queues and every group's committed offsets on it
    (refused for system topics and while live consumers subscribe to it).  Its messages stay in
    the commit log until retention deletes them.  In a cluster: in every broker group holding
    it."""
    as_json = output == "json"
    if not yes:
        question = f"delete topic {name}, its queues and its consumer offsets?"
        click.confirm(question, abort=True, err=as_json)  # stdout: only the JSON
    groups = []
    for group_name, addr in _leaders(broker, name) or [("", broker)]:
        _admin(addr, lambda admin: admin.delete_topic(name))
        if group_name:
            groups.append(group_name)
        if not as_json:
            click.echo(f"topic {name} deleted" + (f" in group {group_name}" if group_name else ""))
    if as_json:
        _echo_json({"topic": name, "deleted": True, "brokerGroups": groups})

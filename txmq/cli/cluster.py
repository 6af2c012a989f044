"""``txmq cluster status|list|place``: a cluster's groups and replicas, and topics placed on
its groups."""

from __future__ import annotations

import time
from typing import Any

import click

from .common import BROKER_OPTION, OUTPUT_OPTION, _admin, _echo_json, _emit, _output_options


@click.group()
def cluster() -> None:
    """Inspect a cluster (brokers started with etcdEndpoints) and place topics on its groups."""


@cluster.command("status")
@BROKER_OPTION
@_output_options
def cluster_status(broker: str, as_json: bool) -> None:
    """Groups, their leaders, in-sync replicas, lag and epochs (asked of any one broker)."""
    doc = _admin(broker, lambda admin: admin.cluster_status())
    if as_json:
        _echo_json(doc)
        return
    me = doc.get("self", {})
    click.echo(
        f"cluster {doc['cluster']} (asked {me.get('addr')}: replica {me.get('replicaId')} of "
        f"{me.get('group')}, {me.get('role')})"
    )
    for name, g in sorted(doc["groups"].items()):
        leader = g["leader"]
        who = f"replica {leader['replicaId']} at {leader['addr']}" if leader else "NONE"
        click.echo(f"group {name}: leader {who}, epoch {g['epoch']}")
        click.echo(f"  members   {', '.join(f'{k}={v}' for k, v in sorted(g['members'].items()))}")
        click.echo(f"  in sync   {g['inSync']}")
        for rid, why in sorted((g.get("notServing") or {}).items()):
            click.echo(f"  NOT SERVING replica {rid}: {why}")
        lag = ", ".join(f"{k}: {v} B" for k, v in sorted(g["lag"].items())) or "-"
        click.echo(f"  lag       {lag} (leader end {g['leaderEnd']})")
        click.echo(f"  topics    {', '.join(g['topics']) or '-'}")


@cluster.command("list")
@BROKER_OPTION
@OUTPUT_OPTION
def cluster_list(broker: str, output: str) -> None:
    """Every broker of the cluster, one line each: its group, replica id, address, role,
    whether it is in sync and how far behind its leader (mqadmin clusterList)."""
    doc = _admin(broker, lambda admin: admin.cluster_status())
    rows = []
    for name, g in sorted(doc["groups"].items()):
        leader = (g.get("leader") or {}).get("replicaId")
        for rid, addr in sorted(g["members"].items(), key=lambda kv: int(kv[0])):
            is_leader = leader is not None and int(rid) == int(leader)
            rows.append(
                {
                    "cluster": doc["cluster"],
                    "group": name,
                    "replica": int(rid),
                    "addr": addr,
                    "role": "leader"
                    if is_leader
                    else "no-serve"
                    if rid in (g.get("notServing") or {})
                    else "follower",
                    "inSync": int(rid) in g["inSync"],
                    "lagBytes": 0 if is_leader else g["lag"].get(str(rid), ""),
                    "epoch": g["epoch"],
                }
            )
    _emit(
        rows,
        output,
        [("cluster", "cluster", 16), ("group", "group", 12), ("replica", "replica", -7)]
        + [("addr", "address", 22), ("role", "role", 9), ("inSync", "in sync", 8)]
        + [("lagBytes", "lag (B)", -10), ("epoch", "epoch", -6)],
    )


@cluster.command("place")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("topic_name")
@click.option("--group", "group_name", required=True, help="The broker group (brokerName).")
@click.option("--queues", "-q", default=4, show_default=True, help="Queues in that group.")
@click.option(
    "--read-only",
    is_flag=True,
    help="Stop new writes to the group's queues of the topic (consumers drain them): the "
    "step that moves a topic's traffic off a group.",
)
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds to wait until every broker of the cluster routes the topic as placed "
    "(0: return once the group's leader has it).",
)
def cluster_place(
    broker: str,
    output: str,
    topic_name: str,
    group_name: str,
    queues: int,
    read_only: bool,
    wait_s: float,
) -> None:
    """Give TOPIC_NAME queues in broker group GROUP (create or update them on its leader), and
    return once every broker's route answer shows it."""
    doc = _admin(broker, lambda admin: admin.cluster_status())
    g = doc["groups"].get(group_name)
    if g is None or not g.get("leader"):
        raise click.ClickException(
            f"broker group {group_name!r} has no leader now (groups: {sorted(doc['groups'])})"
        )
    perm = 4 if read_only else 6
    _admin(g["leader"]["addr"], lambda admin: admin.create_topic(topic_name, queues, perm=perm))
    if wait_s > 0:
        brokers = sorted(
            {broker} | {addr for grp in doc["groups"].values() for addr in grp["members"].values()}
        )
        _wait_placed(brokers, topic_name, group_name, queues, perm, wait_s)
    if output == "json":
        placed = {"topic": topic_name, "group": group_name, "leader": g["leader"]["addr"]}
        placed |= {"queues": queues, "perm": perm, "readOnly": read_only}
        _echo_json({**placed, "routedEverywhere": wait_s > 0})
        return
    click.echo(
        f"topic {topic_name}: {queues} queues in group {group_name}"
        + (" (read-only)" if read_only else "")
    )


def _wait_placed(
    brokers: list[str], topic: str, group: str, queues: int, perm: int, wait_s: float
) -> None:
    """Poll each broker's route of ``topic`` until it lists ``group`` with ``queues`` queues
    and ``perm``: the placement travels from the leader through etcd to every broker."""

    def placed(route: dict[str, Any] | None) -> bool:
        for q in (route or {}).get("queueDatas", []):
            if q["brokerName"] == group:
                return bool(q["readQueueNums"] == queues and q["perm"] == perm)
        return False

    deadline = time.monotonic() + wait_s
    pending = list(brokers)
    click.echo(f"waiting for {len(pending)} brokers to route {topic} as placed", err=True)
    while pending:
        addr = pending[0]
        try:
            ok = placed(_admin(addr, lambda admin: admin.route(topic)))
        except click.ClickException:  # a broker down right now: not routing it, say so below
            ok = False
        if ok:
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"placed on group {group}'s leader, but after {wait_s:.0f}s these brokers do "
                f"not route {topic} as placed yet: {', '.join(pending)}"
            )
        time.sleep(0.2)

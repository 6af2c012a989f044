"""Live clients: producer groups and consumer groups -> connections (RocketMQ's
ProducerManager and ConsumerManager in one place)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from txmq.protocol.aio import Connection
from txmq.protocol.codes import RequestCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError, TxmqError
from txmq.protocol.message import parse_subscription

from .sql_filter import SqlFilter, SqlFilterError, compile_sql

log = structlog.get_logger(__name__)


@dataclass
class Subscription:
    topic: str
    expression: str
    tags: frozenset[str] | None  # None = all
    #: RocketMQ's expressionType: TAG, or SQL92 (a property filter, evaluated on the broker
    #: when enablePropertyFilter is on; refused otherwise, never answered as a tag expression)
    expression_type: str = "TAG"
    #: The SQL92 expression compiled once, when the heartbeat registered it (None: a tag
    #: expression, or one that does not compile: ``sql_error`` says why).
    sql: SqlFilter | None = None
    sql_error: str | None = None


@dataclass
class ClientChannel:
    """One client connection and what it registered."""

    conn: Connection
    client_id: str
    language: int = 3
    version: int = 0
    last_heartbeat: float = field(default_factory=time.monotonic)
    producer_groups: set[str] = field(default_factory=set)
    consumer_groups: dict[str, dict[str, Subscription]] = field(default_factory=dict)
    consume_from_where: dict[str, str] = field(default_factory=dict)
    #: Per consumer group: what the heartbeat said of it (consumeType, messageModel,
    #: consumeFromWhere), for the operator's views.
    consumer_meta: dict[str, dict[str, str]] = field(default_factory=dict)


#: What a heartbeat's consumerData says of its group that the operator's views show.
CONSUMER_META = ("consumeType", "messageModel", "consumeFromWhere")


def parse_heartbeat(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvalidParameterError(f"heartbeat body is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("clientID"), str):
        raise InvalidParameterError("heartbeat body has no clientID")
    return data


class ClientManager:
    """Tracks channels by connection; answers "who is alive in group G"."""

    def __init__(
        self,
        *,
        on_consumer_group_changed: Callable[[str], None] | None = None,
        on_producer_registered: Callable[[str], None] | None = None,
        producer_filter: Callable[[Connection, str], bool] | None = None,
    ) -> None:
        self._channels: dict[Connection, ClientChannel] = {}
        self._on_consumer_group_changed = on_consumer_group_changed
        self._on_producer_registered = on_producer_registered
        #: When set (ACL on), only connections it accepts for a group get that group's
        #: check-backs.
        self.producer_filter = producer_filter
        #: Per consumer group, bumped on every membership change (join, leave, connection
        #: closed, heartbeat expiry).  Every group starts at this broker's start time in ms, so
        #: a restarted broker hands out numbers above its previous run's (unless a group
        #: changed more often than once a millisecond); commits also check committed offsets.
        self._generation_base = int(time.time() * 1000)
        self._generations: dict[str, int] = {}

    # -- registration ---------------------------------------------------------------------------

    def heartbeat(
        self, conn: Connection, data: dict[str, Any], language: int = 3, version: int = 0
    ) -> ClientChannel:
        client_id = data["clientID"]
        ch = self._channels.get(conn)
        if ch is None:
            ch = ClientChannel(conn, client_id, language, version)
            self._channels[conn] = ch
            conn.context["client_id"] = client_id
            log.info(
                "client_registered", client_id=client_id, peer=f"{conn.peer[0]}:{conn.peer[1]}"
            )
        ch.last_heartbeat = time.monotonic()
        new_producers = set()
        for p in data.get("producerDataSet") or []:
            g = p.get("groupName") if isinstance(p, dict) else None
            if g and g not in ch.producer_groups:
                ch.producer_groups.add(g)
                new_producers.add(g)
        changed: set[str] = set()
        for c in data.get("consumerDataSet") or []:
            if not isinstance(c, dict) or not c.get("groupName"):
                continue
            g = c["groupName"]
            subs = {}
            for s in c.get("subscriptionDataSet") or []:
                if isinstance(s, dict) and s.get("topic"):
                    expr = s.get("subString") or "*"
                    kind = str(s.get("expressionType") or "TAG").upper()
                    tags = parse_subscription(expr) if kind == "TAG" else frozenset()
                    sub = Subscription(s["topic"], expr, tags, kind)
                    if kind == "SQL92":
                        try:
                            sub.sql = compile_sql(expr)
                        except SqlFilterError as exc:
                            sub.sql_error = str(exc)
                    subs[s["topic"]] = sub
            if g not in ch.consumer_groups:
                changed.add(g)
            ch.consumer_groups[g] = subs
            if c.get("consumeFromWhere"):
                ch.consume_from_where[g] = str(c["consumeFromWhere"])
            ch.consumer_meta[g] = {k: str(c[k]) for k in CONSUMER_META if c.get(k)}
        for g in new_producers:
            log.info("producer_registered", group=g, client_id=client_id)
            if self._on_producer_registered:
                self._on_producer_registered(g)
        for g in changed:
            log.info("consumer_registered", group=g, client_id=client_id)
            self._consumer_group_changed(g)
        return ch

    def unregister(
        self, conn: Connection, producer_group: str | None, consumer_group: str | None
    ) -> None:
        ch = self._channels.get(conn)
        if ch is None:
            return
        if producer_group:
            ch.producer_groups.discard(producer_group)
            log.info("producer_unregistered", group=producer_group, client_id=ch.client_id)
        if consumer_group and consumer_group in ch.consumer_groups:
            del ch.consumer_groups[consumer_group]
            log.info("consumer_unregistered", group=consumer_group, client_id=ch.client_id)
            self._consumer_group_changed(consumer_group)

    def connection_closed(self, conn: Connection) -> None:
        ch = self._channels.pop(conn, None)
        if ch is None:
            return
        log.info(
            "client_disconnected",
            client_id=ch.client_id,
            producer_groups=sorted(ch.producer_groups),
            consumer_groups=sorted(ch.consumer_groups),
        )
        for g in ch.consumer_groups:
            self._consumer_group_changed(g)

    def expire(self, timeout_s: float) -> list[ClientChannel]:
        """Close channels without a heartbeat for ``timeout_s``."""
        now = time.monotonic()
        dead = [ch for ch in self._channels.values() if now - ch.last_heartbeat > timeout_s]
        for ch in dead:
            log.warning(
                "client_expired",
                client_id=ch.client_id,
                silent_for_s=round(now - ch.last_heartbeat, 1),
            )
            ch.conn.close()
            self.connection_closed(ch.conn)
        return dead

    def _consumer_group_changed(self, group: str) -> None:
        self._generations[group] = self.generation(group) + 1
        for ch in self.consumer_channels(group):
            try:
                ch.conn.send_oneway(
                    RemotingCommand.request(
                        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                        {"consumerGroup": group},
                        serialize_type=ch.conn.peer_serialize_type,
                    )
                )
            except TxmqError:
                pass
        if self._on_consumer_group_changed:
            self._on_consumer_group_changed(group)

    # -- queries --------------------------------------------------------------------------------

    def channel(self, conn: Connection) -> ClientChannel | None:
        return self._channels.get(conn)

    def producer_channels(self, group: str) -> list[ClientChannel]:
        """Live producer connections of a group (closed ones are never returned, nor, with
        the ACL on, connections not authenticated for the group)."""
        allowed = self.producer_filter
        return [
            ch
            for ch in self._channels.values()
            if group in ch.producer_groups
            and not ch.conn.closed
            and (allowed is None or allowed(ch.conn, group))
        ]

    def consumer_channels(self, group: str) -> list[ClientChannel]:
        return [
            ch
            for ch in self._channels.values()
            if group in ch.consumer_groups and not ch.conn.closed
        ]

    def consumer_ids(self, group: str) -> list[str]:
        return sorted({ch.client_id for ch in self.consumer_channels(group)})

    def generation(self, group: str) -> int:
        """The group's membership generation: it changes whenever a member joins or leaves."""
        return self._generations.get(group, self._generation_base)

    def fenced_reason(self, group: str, generation: int, client_id: str) -> str | None:
        """Why a member that rebalanced under ``generation`` may no longer commit offsets
        for ``group``; None when it still may (same generation, still a live member)."""
        current = self.generation(group)
        if generation != current:
            return f"generation {generation} is stale, the group {group} is at {current}"
        if client_id not in self.consumer_ids(group):
            return f"{client_id} is not a live member of the group {group}"
        return None

    def subscription(self, group: str, topic: str) -> Subscription | None:
        for ch in self.consumer_channels(group):
            sub = ch.consumer_groups[group].get(topic)
            if sub is not None:
                return sub
        return None

    def producer_groups(self) -> dict[str, int]:
        """Live connections per producer group."""
        return dict(Counter(g for ch in self._channels.values() for g in ch.producer_groups))

    def consumer_groups(self) -> dict[str, int]:
        """Live connections per consumer group."""
        return dict(Counter(g for ch in self._channels.values() for g in ch.consumer_groups))

    @property
    def channel_count(self) -> int:
        return len(self._channels)

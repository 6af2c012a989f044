"""Quotas on both front ends (remoting and RocketMQ 5 gRPC): produce and consume bytes per
second and open connections, per ACL account (``produceByteRate``, ``consumeByteRate``, ``maxConnections`` in the account's
entry of ``plain_acl.yml``) or, for a client without an account, per client address; the broker
configuration's ``quotaProduceByteRate``, ``quotaConsumeByteRate`` and ``quotaMaxConnections``
are the defaults (0: unlimited, the default, so nothing changes unless an operator sets one).

The byte rates are token buckets (a second's worth of burst) read through the broker's clock,
in the manner of Kafka's client quotas: a request arriving while its bucket is in debt is
delayed until the debt is paid (Kafka's ``throttle_time``), so a synchronous producer simply
slows down; when the debt is more than ``quotaMaxThrottleMs`` worth the request is refused with
SYSTEM_BUSY and a remark starting ``[TOO_MANY_REQUESTS]``, which stock RocketMQ producers retry
after a pause and consumers answer by pulling again later.  A send is charged its body before
it is stored (by the send use case, :mod:`txmq.broker.messaging.admission`, for both front
ends); a pull is charged the bytes of its answer.

A connection is counted against its account (or address) at its first request; one past
``maxConnections`` gets SYSTEM_BUSY with a ``[TOO_MANY_CONNECTIONS]`` remark, is logged and
closed.  Each throttle or refusal counts in ``txmq_quota_throttled_total{account,kind}``
(kind: ``produce``, ``consume``, ``connections``).

The gRPC front end (``broker/grpc/server.py``) uses the same manager, so an account's buckets
and connection count are shared by both front ends: SendMessage is charged the bodies of its
messages, ReceiveMessage the bodies it returns, and each Telemetry stream (one per RocketMQ 5
client and endpoint) counts as a connection.  A refusal there is the response's ``Status``
with ``Code.TOO_MANY_REQUESTS`` (42900), what RocketMQ's proxy answers for a flow-controlled
request, carrying the same ``[TOO_MANY_REQUESTS]`` / ``[TOO_MANY_CONNECTIONS]`` message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from prometheus_client import Counter

from txmq.protocol.aio import Connection
from txmq.protocol.codes import RequestCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import SystemBusyError

log = structlog.get_logger(__name__)

#: Connection context keys: the quota key a connection is counted under, and whether its
#: connection was refused.
CONTEXT_KEY = "quota_key"
_REFUSED = "quota_refused"

_CONSUME_CODES = frozenset({RequestCode.PULL_MESSAGE})


@dataclass(frozen=True)
class QuotaLimits:
    """Limits of one account or address; 0 means unlimited, None (an account's) the default."""

    produce_byte_rate: int | None = None
    consume_byte_rate: int | None = None
    max_connections: int | None = None

    def over(self, defaults: QuotaLimits) -> QuotaLimits:
        """These limits, the ``defaults``' where unset."""
        return QuotaLimits(
            self.produce_byte_rate
            if self.produce_byte_rate is not None
            else defaults.produce_byte_rate,
            self.consume_byte_rate
            if self.consume_byte_rate is not None
            else defaults.consume_byte_rate,
            self.max_connections if self.max_connections is not None else defaults.max_connections,
        )


class TokenBucket:
    """``rate`` tokens a second, at most a second's worth saved; taking more than there are
    leaves the bucket in debt."""

    def __init__(self, rate: int, now: float) -> None:
        self.rate = rate
        self.tokens = float(rate)
        self.last = now

    def _refill(self, now: float) -> None:
        if now > self.last:
            self.tokens = min(float(self.rate), self.tokens + (now - self.last) * self.rate)
        self.last = now

    def debt_seconds(self, now: float) -> float:
        """How long until the bucket is out of debt (0 when it is not in debt)."""
        self._refill(now)
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def take(self, n: int, now: float) -> None:
        self._refill(now)
        self.tokens -= n


class QuotaManager:
    """The quotas in force and the per-request check.

    Args:
        defaults: the broker configuration's limits (per account without its own, and per
            client address for clients without an account).
        max_throttle: seconds a request may be delayed before it is refused instead.
        clock: seconds (the broker's clock seam).
        account_limits: an account's own limits (None: no such account).
        registry: where ``txmq_quota_throttled_total`` is registered.
    """

    def __init__(
        self,
        defaults: QuotaLimits,
        max_throttle: float,
        clock: Callable[[], float],
        account_limits: Callable[[str], QuotaLimits | None],
        registry: object,
    ) -> None:
        self.defaults = defaults
        self.max_throttle = max_throttle
        self.clock = clock
        self.account_limits = account_limits
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self.connections: dict[str, int] = {}
        self.throttled = Counter(
            "txmq_quota_throttled",
            "Requests delayed or refused by a quota (kind: produce, consume, connections)",
            ["account", "kind"],
            registry=registry,  # type: ignore[arg-type]
        )

    @staticmethod
    def key_of(conn: Connection, access_key: str | None) -> str:
        """An account's access key, or ``address:<ip>`` for a client without one."""
        return QuotaManager.key_for(access_key, conn.peer[0])

    @staticmethod
    def key_for(access_key: str | None, host: str) -> str:
        """An account's access key, or ``address:<host>`` for a client without one."""
        return access_key if access_key else f"address:{host}"

    def limits(self, key: str) -> QuotaLimits:
        if key.startswith("address:"):
            return self.defaults
        own = self.account_limits(key)
        return self.defaults if own is None else own.over(self.defaults)

    def _bucket(self, key: str, kind: str, rate: int) -> TokenBucket:
        b = self._buckets.get((key, kind))
        if b is None or b.rate != rate:
            b = self._buckets[(key, kind)] = TokenBucket(rate, self.clock())
        return b

    # -- connections ----------------------------------------------------------------------------

    def admit(self, key: str, peer: tuple[str, int], what: str = "connection") -> str | None:
        """Count one connection (or gRPC Telemetry stream) under ``key``; the refusal's text
        if that would pass the key's ``maxConnections`` (it is then not counted).  Each
        admitted one is given back with :meth:`release`."""
        limit = self.limits(key).max_connections or 0
        n = self.connections.get(key, 0)
        if limit and n >= limit:
            self.throttled.labels(key, "connections").inc()
            log.warning(
                "connection_refused_by_quota",
                peer=f"{peer[0]}:{peer[1]}",
                what=what,
                account=key,
                open=n,
                max_connections=limit,
            )
            return (
                f"[TOO_MANY_CONNECTIONS] {_who(key)} already has {n} connections open, its "
                f"limit (maxConnections) is {limit}: this {what} is refused"
            )
        self.connections[key] = n + 1
        return None

    def release(self, key: str) -> None:
        """One connection (or stream) counted under ``key`` is gone."""
        n = self.connections.get(key, 0) - 1
        if n > 0:
            self.connections[key] = n
        else:
            self.connections.pop(key, None)

    def admit_connection(self, conn: Connection, key: str) -> str | None:
        """Count ``conn`` under ``key`` at its first request; the refusal's remark if that
        would pass the key's ``maxConnections`` (the connection is then not counted)."""
        refused = self.admit(key, conn.peer)
        conn.context[CONTEXT_KEY] = None if refused is not None else key
        return refused

    def connection_closed(self, conn: Connection) -> None:
        key = conn.context.get(CONTEXT_KEY)
        if isinstance(key, str):
            self.release(key)

    async def serve(
        self,
        conn: Connection,
        cmd: RemotingCommand,
        access_key: str | None,
        proc: Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]],
    ) -> RemotingCommand | None:
        """Run one request under the quotas of its account (or address).

        Raises:
            SystemBusyError: the connection is refused, or the request is over a byte rate.
        """
        key = conn.context.get(CONTEXT_KEY, "")
        if key == "":
            refused = self.admit_connection(conn, self.key_of(conn, access_key))
            if refused is not None:
                conn.context[_REFUSED] = refused
                loop = asyncio.get_running_loop()
                # Closed once the refusal is written (it is queued after this returns).
                loop.call_soon(loop.call_soon, conn.close)
                raise SystemBusyError(refused)
            key = conn.context[CONTEXT_KEY]
        elif key is None:
            raise SystemBusyError(str(conn.context.get(_REFUSED, "connection refused")))
        await self.before(key, cmd)
        resp = await proc(conn, cmd)
        self.after(key, cmd, resp)
        return resp

    # -- byte rates -----------------------------------------------------------------------------

    async def before(self, key: str, cmd: RemotingCommand) -> None:
        """Delay a pull whose bucket is in debt, or refuse it past ``max_throttle``.  (A send
        is admitted by the send use case, :mod:`txmq.broker.messaging.admission`, which
        charges it its body: once for both front ends.)

        Raises:
            SystemBusyError: ``[TOO_MANY_REQUESTS]``, naming the account and the limit.
        """
        if cmd.code in _CONSUME_CODES:
            await self.throttle(key, "consume", 0)

    def rate_of(self, key: str, kind: str) -> int:
        """The byte rate of ``kind`` (``produce`` or ``consume``) in force for ``key`` (0:
        unlimited)."""
        limits = self.limits(key)
        rate = limits.produce_byte_rate if kind == "produce" else limits.consume_byte_rate
        return rate or 0

    async def throttle(self, key: str, kind: str, charge: int) -> None:
        """Delay a request of ``kind`` whose bucket is in debt, or refuse it past
        ``max_throttle``; then charge it ``charge`` bytes (a send's bodies; a receive is
        charged what it returns, with :meth:`charge`, afterwards).

        Raises:
            SystemBusyError: ``[TOO_MANY_REQUESTS]``, naming the account and the limit.
        """
        rate = self.rate_of(key, kind)
        if not rate:
            return
        bucket = self._bucket(key, kind, rate)
        now = self.clock()
        wait = bucket.debt_seconds(now)
        if wait > self.max_throttle:
            self.throttled.labels(key, kind).inc()
            name = "produceByteRate" if kind == "produce" else "consumeByteRate"
            raise SystemBusyError(
                f"[TOO_MANY_REQUESTS] {_who(key)} is over its {kind} quota ({name} {rate} "
                f"bytes/s): try again in {wait:.1f}s"
            )
        if charge:
            bucket.take(charge, now)
        if wait > 0:
            self.throttled.labels(key, kind).inc()
            await asyncio.sleep(wait)

    def after(self, key: str, cmd: RemotingCommand, resp: RemotingCommand | None) -> None:
        """Charge a pull the bytes of its answer."""
        if resp is None or cmd.code not in _CONSUME_CODES or not resp.body:
            return
        self.charge(key, "consume", len(resp.body))

    def charge(self, key: str, kind: str, n: int) -> None:
        """Take ``n`` bytes from ``key``'s ``kind`` bucket (a receive's answer)."""
        rate = self.rate_of(key, kind)
        if rate and n:
            self._bucket(key, kind, rate).take(n, self.clock())


def _who(key: str) -> str:
    if key.startswith("address:"):
        return f"client address {key[len('address:') :]}"
    return f"account {key!r}"

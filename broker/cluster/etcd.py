"""The broker's etcd session: one client over every member, a lease, atomic compare-and-put, and
a watched copy of a key prefix.

Why aetcd: it is an asyncio client (the broker runs on one event loop) built on grpcio, which the
gRPC front end already uses, and it exposes etcd's transactions, leases and watches directly.
It connects to one target; etcd's own clients balance over members, so here the target is a
gRPC ``ipv4:`` list of every member (pick-first: when the member in use dies, calls move to the
next one).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aetcd
import aetcd.exceptions
import structlog

log = structlog.get_logger(__name__)


class EtcdError(Exception):
    """etcd could not be reached or refused a call; the message says which and why."""


def grpc_target(endpoints: str) -> tuple[str, int]:
    """``"h1:2379,h2:2379"`` → the (host, port) pair aetcd joins into a gRPC ``ipv4:`` target
    listing every member (names resolved here: that scheme takes addresses)."""
    addrs: list[str] = []
    for ep in endpoints.split(","):
        ep = ep.strip().removeprefix("http://")
        if not ep:
            continue
        host, _, port = ep.rpartition(":")
        if not host or not port.isdigit():
            raise EtcdError(f"etcd endpoint {ep!r} is not host:port")
        try:
            ip = socket.gethostbyname(host)
        except OSError as exc:
            raise EtcdError(f"etcd endpoint {ep!r}: cannot resolve {host}: {exc}") from None
        addrs.append(f"{ip}:{port}")
    if not addrs:
        raise EtcdError("etcdEndpoints is empty")
    head, _, last_port = addrs[-1].rpartition(":")
    return "ipv4:" + ",".join([*addrs[:-1], head]), int(last_port)


@dataclass
class Entry:
    """One key of a watched prefix."""

    value: Any
    mod_revision: int
    lease: int


class EtcdSession:
    """A client with a per-call timeout; every failure becomes :class:`EtcdError`."""

    def __init__(self, endpoints: str, timeout: float = 3.0) -> None:
        host, port = grpc_target(endpoints)
        self.endpoints = endpoints
        self.timeout = timeout
        self.client = aetcd.Client(host=host, port=port, timeout=max(1, round(timeout)))

    async def connect(self) -> None:
        try:
            await self.client.connect()
        except Exception as exc:
            raise EtcdError(f"cannot connect to etcd at {self.endpoints}: {exc}") from exc

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.client.close(), self.timeout)
        except Exception as exc:  # closing a dead channel may fail; nothing is lost
            log.debug("etcd_close_failed", error=repr(exc))

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except aetcd.exceptions.ClientError as exc:
            raise EtcdError(f"etcd {what} failed: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            raise EtcdError(f"etcd {what} failed: {type(exc).__name__}: {exc}") from exc

    # -- reads and writes -------------------------------------------------------------------

    async def get(self, key: str) -> tuple[Any, int] | None:
        """(decoded JSON value, mod revision) or None."""
        r = await self._call(f"get {key}", self.client.get(key.encode()))
        if r is None:
            return None
        return json.loads(r.value), int(r.mod_revision)

    async def get_prefix(self, prefix: str) -> tuple[int, dict[str, Entry]]:
        """(store revision, every key under ``prefix``)."""
        r = await self._call(f"get {prefix}*", self.client.get_prefix(prefix.encode()))
        out: dict[str, Entry] = {}
        for kv in r:
            try:
                value = json.loads(kv.value)
            except ValueError:
                log.warning("etcd_value_unreadable", key=kv.key.decode(errors="replace"))
                continue
            out[kv.key.decode()] = Entry(value, int(kv.mod_revision), int(kv.lease))
        return int(r.header.revision), out

    async def put(self, key: str, value: Any, lease: int | None = None) -> None:
        await self._call(f"put {key}", self.client.put(key.encode(), _encode(value), lease=lease))

    async def delete(self, key: str) -> None:
        await self._call(f"delete {key}", self.client.delete(key.encode()))

    async def txn(
        self,
        what: str,
        compare: list[tuple[str, str, int]],
        puts: list[tuple[str, Any, int | None]],
        deletes: tuple[str, ...] = (),
    ) -> bool:
        """Atomically: if every ``(key, "version"|"mod", expected)`` holds, put every
        ``(key, value, lease)`` and delete every key of ``deletes``.  True if it did."""
        t = self.client.transactions
        cmp = []
        for key, kind, expected in compare:
            target = t.version(key.encode()) if kind == "version" else t.mod(key.encode())
            cmp.append(target == expected)
        ops = [t.put(k.encode(), _encode(v), lease=lease) for k, v, lease in puts]
        ops += [t.delete(k.encode()) for k in deletes]
        ok, _ = await self._call(
            what, self.client.transaction(compare=cmp, success=ops, failure=[])
        )
        return bool(ok)

    # -- leases ----------------------------------------------------------------------------

    async def grant(self, ttl: int) -> int:
        lease = await self._call("lease grant", self.client.lease(ttl))
        return int(lease.id)

    async def keepalive(self, lease_id: int) -> int:
        """Refresh the lease; returns its remaining TTL (0 or less: it is gone)."""
        reply = await self._call("lease keep-alive", self.client.refresh_lease(lease_id))
        return int(reply.TTL) if reply is not None else 0

    async def time_to_live(self, lease_id: int) -> tuple[int, int]:
        """``(granted TTL, seconds left)`` of a lease, as etcd's leader counts them; seconds
        left are whole seconds rounded down (etcd's answer), -1 for a lease that is gone."""
        reply = await self._call(
            "lease time-to-live", self.client.get_lease_info(lease_id, keys=False)
        )
        return int(reply.grantedTTL), int(reply.TTL)

    async def revoke(self, lease_id: int) -> None:
        await self._call("lease revoke", self.client.revoke_lease(lease_id))

    # -- watching ----------------------------------------------------------------------------

    async def watch_prefix(
        self,
        prefix: str,
        on_change: Callable[[dict[str, Entry]], None],
        *,
        retry: float = 0.5,
    ) -> None:
        """Keep ``on_change`` fed with the whole prefix: list it, then apply watch events;
        after any error (a member died, the stream broke) list again.  Runs until cancelled."""
        while True:
            try:
                rev, table = await self.get_prefix(prefix)
                on_change(dict(table))
                watch = await self._call(
                    f"watch {prefix}",
                    self.client.watch_prefix(prefix.encode(), start_revision=rev + 1),
                )
                try:
                    async for ev in watch:
                        key = ev.kv.key.decode()
                        if ev.kind == "DELETE":
                            table.pop(key, None)
                        else:
                            try:
                                value = json.loads(ev.kv.value)
                            except ValueError:
                                continue
                            table[key] = Entry(value, int(ev.kv.mod_revision), int(ev.kv.lease))
                        on_change(dict(table))
                finally:
                    try:
                        await asyncio.wait_for(watch.cancel(), self.timeout)
                    except Exception:
                        pass
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("etcd_watch_restarted", prefix=prefix, error=str(exc))
            await asyncio.sleep(retry)


def _encode(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

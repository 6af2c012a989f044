"""The client's side of one broker connection.

:class:`BrokerConnection` owns the TCP connection of one producer or consumer: it connects,
sends HEART_BEAT at connect, after every reconnect and every ``heartbeat_interval``, reconnects
with a doubling back-off when the connection drops (to a cluster: asks the group's replicas for
its leader every 0.15 s for 30 s first), sends requests with timeouts (waiting for a reconnect
within the request's own timeout; to a cluster, a write or route lookup unanswered for half a
second makes it ask the group's other replicas whether another one leads now, and drop the
connection if so),
and dispatches requests the broker sends to the client
(NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE) to processors registered by request code.

Public hooks for other parts of the SDK:

* :meth:`BrokerConnection.register_processor` -- handle a broker -> client request code;
* :meth:`BrokerConnection.on_reconnect` -- run a callback after every reconnect (after the
  heartbeat has been sent);
* :meth:`BrokerConnection.register_producer` / :meth:`register_consumer` -- what the heartbeat
  announces.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from txmq.protocol.aio import Connection, open_connection, wait_event
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    ConnectionClosedError,
    RequestTimeoutError,
    TxmqError,
    error_for_code,
)
from txmq.protocol.headers import Header, UnregisterClientRequestHeader

from .callbacks import ConnectionState, ConnectionStateCallback, call_hook
from .config import ClientConfig, parse_address
from .logs import get_logger

log = get_logger(__name__)

#: Handles one request the broker sent to this client; returns the response (ignored for
#: oneway requests) or None.
Processor = Callable[[RemotingCommand], Awaitable[RemotingCommand | None]]
#: Runs after a reconnect; may be a plain function or a coroutine function.
ReconnectCallback = Callable[[], Awaitable[None] | None]
#: Returns one entry of the heartbeat's ``consumerDataSet``.
ConsumerDataProvider = Callable[[], dict[str, Any]]

#: In a cluster, how often a lost connection asks the group's replicas for its leader (instead
#: of the doubling back-off): a new leader is used as soon as one of them names it.
CLUSTER_POLL_S = 0.15
#: ... for this long after the loss; then the usual doubling back-off.
CLUSTER_POLL_FOR_S = 30.0
#: In a cluster, a request of :data:`_WATCHED` unanswered this long makes the client ask the
#: group's other replicas,
#: every CLUSTER_POLL_S while it stays unanswered, whether another replica leads now: a paused
#: or cut-off leader keeps its TCP connection open, and its group replaces it in a second or
#: two, well before a request timeout.
STALLED_S = 0.5
#: The requests watched so: writes and route lookups, which a live leader answers at once (a
#: pull, for one, may wait long by design).
_WATCHED = frozenset(
    {
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        RequestCode.SEND_MESSAGE,
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.END_TRANSACTION,
    }
)


@functools.lru_cache(maxsize=1)
def local_ip() -> str:
    """The address this host uses for outgoing traffic (a UDP socket is connected, no packet
    is sent); 127.0.0.1 without a route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ip: str = s.getsockname()[0]
            return ip
    except OSError:
        return "127.0.0.1"


def make_client_id() -> str:
    """A client id in RocketMQ's ``ip@pid#random`` style, unique per client object."""
    return f"{local_ip()}@{os.getpid()}#{os.urandom(6).hex()}"


#: The connection a broker's request to this client (e.g. a transaction check) arrived on,
#: while its processor runs.
current_connection: contextvars.ContextVar[BrokerConnection | None] = contextvars.ContextVar(
    "txmq_current_connection", default=None
)


class BrokerConnection:
    """One client's connection to the broker.

    Args:
        address: ``"host:port"`` of the broker.
        config: timeouts and intervals.
        client_id: the id announced in heartbeats (made up when not given).
    """

    def __init__(
        self, address: str, config: ClientConfig | None = None, *, client_id: str | None = None
    ) -> None:
        self.address = address
        #: Every address given (``"h1:p1,h2:p2"``): brokers of one cluster to discover its
        #: leader through; a single address is a single broker (or any broker of a cluster).
        self.seeds = [parse_address(a) for a in address.split(",") if a.strip()]
        if not self.seeds:
            raise ValueError(f"broker address must look like 'host:port', got {address!r}")
        self.host, self.port = self.seeds[0]
        self.config = config or ClientConfig()
        self.client_id = client_id or make_client_id()
        self._conn: Connection | None = None
        self._connected: asyncio.Event | None = None
        self._closing = False
        self._started = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._processors: dict[int, Processor] = {}
        self._reconnect_callbacks: list[ReconnectCallback] = []
        self._state_callbacks: list[ConnectionStateCallback] = []
        self._producer_groups: set[str] = set()
        self._consumers: dict[str, ConsumerDataProvider] = {}
        credentials = self.config.credentials
        self._signer = credentials.sign if credentials is not None else None
        self._ssl = self.config.ssl_context
        #: How many times the connection was re-established (for tests and metrics).
        self.reconnects = 0
        #: Watched requests in flight in a cluster: when each was sent, on which connection.
        self._writes: dict[object, tuple[float, Connection]] = {}
        self._leader_watch: asyncio.Task[None] | None = None
        #: True once the broker said it is part of a cluster (then a request that times out
        #: drops the connection and the next one looks for the group's leader again).
        self.cluster = False
        #: The broker group (``brokerName``) of the leader connected to; None for a single
        #: broker.
        self.group_name: str | None = None
        #: Connections to the other groups of a cluster, made on first use by
        #: :meth:`for_group` (sharing this connection's registrations and client id).
        self._groups: dict[str, asyncio.Future[BrokerConnection]] = {}
        #: Each broker group's replica addresses, as the last route naming it listed them
        #: (:func:`~txmq.client.route.fetch_route` records them).
        self.group_addresses: dict[str, tuple[str, ...]] = {}

    # -- hooks ----------------------------------------------------------------------------------

    def register_processor(self, code: int, processor: Processor) -> None:
        """Handle requests with ``code`` that the broker sends to this client.

        Args:
            code: a :class:`~txmq.protocol.codes.RequestCode`.
            processor: coroutine function taking the request and returning the response (or
                None for oneway requests).  A :class:`TxmqError` it raises is answered with the
                error's code.
        """
        self._processors[int(code)] = processor

    def on_reconnect(self, callback: ReconnectCallback) -> None:
        """Run ``callback`` after every reconnect, once the heartbeat has been sent."""
        self._reconnect_callbacks.append(callback)

    def on_connection_state(self, callback: ConnectionStateCallback) -> None:
        """Call ``callback(address, state)`` when this connection (or one to another broker
        group of the cluster) is made, lost or made again (a :class:`ConnectionState`)."""
        self._state_callbacks.append(callback)

    def _state_changed(self, state: ConnectionState) -> None:
        for callback in list(self._state_callbacks):
            call_hook(callback, self.address, state)

    def register_producer(self, group: str) -> None:
        """Announce ``group`` in the heartbeat's ``producerDataSet``."""
        self._producer_groups.add(group)

    def register_consumer(self, group: str, provider: ConsumerDataProvider) -> None:
        """Announce a consumer group; ``provider`` builds its ``consumerDataSet`` entry each
        time a heartbeat is sent (so new subscriptions are picked up)."""
        self._consumers[group] = provider

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def start(self) -> None:
        """Connect, send the first heartbeat and start the heartbeat loop.

        Raises:
            ConnectionClosedError: the broker cannot be reached.
        """
        if self._started:
            return
        self._closing = False
        self._connected = asyncio.Event()
        conn = await self._open()
        try:
            await self._heartbeat_on(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._connected.set()
        self._started = True
        self._heartbeat_task = self._spawn(self._heartbeat_loop())
        log.debug("broker_connected", broker=self.address, client_id=self.client_id)
        self._state_changed(ConnectionState.CONNECTED)

    # -- the other broker groups of a cluster -------------------------------------------------

    async def for_group(self, group: str) -> BrokerConnection:
        """The connection to use for broker group ``group`` (a route's ``brokerName``).

        A single broker, or the group this connection serves, is this connection.  Another
        group of a cluster gets a connection of its own, opened on first use to the group's
        leader (found through its replicas as a route fetched here listed them) with this
        connection's client id, producer and consumer registrations and request handlers, so
        the broker sees one client; it heartbeats, reconnects and follows its group's leader
        by itself, and closes with this one.

        Raises:
            ConnectionClosedError: the group cannot be reached (or has no leader yet).
        """
        if self.group_name is None or group == self.group_name or not group:
            return self
        pending = self._groups.get(group)
        if pending is not None and pending.done() and pending.exception() is not None:
            pending = None  # the last attempt failed: try again
        if pending is None:
            addresses = self.group_addresses.get(group)
            if not addresses:
                raise ConnectionClosedError(f"no address known for broker group {group!r}")
            pending = asyncio.ensure_future(self._open_group(group, addresses))
            self._groups[group] = pending
        return await asyncio.shield(pending)

    async def _open_group(self, group: str, addresses: Sequence[str]) -> BrokerConnection:
        if self._closing:
            raise ConnectionClosedError(f"connection to broker {self.address} is closed")
        other = BrokerConnection(",".join(addresses), self.config, client_id=self.client_id)
        # Shared, not copied: a registration made later reaches every group.
        other._processors = self._processors
        other._producer_groups = self._producer_groups
        other._consumers = self._consumers
        other._reconnect_callbacks = self._reconnect_callbacks
        other._state_callbacks = self._state_callbacks
        await other.start()
        if self._closing:
            await other.close()
            raise ConnectionClosedError(f"connection to broker {self.address} is closed")
        log.info("broker_group_connected", group=group, broker=f"{other.host}:{other.port}")
        return other

    def _group_connections(self) -> list[BrokerConnection]:
        return [
            f.result()
            for f in self._groups.values()
            if f.done() and not f.cancelled() and f.exception() is None
        ]

    async def close(self) -> None:
        """Close the connection (and those to other groups) and stop the background tasks (no
        unregister; see :meth:`unregister`)."""
        self._closing = True
        others = self._group_connections()
        for f in self._groups.values():
            f.cancel()
        self._groups.clear()
        if others:
            await asyncio.gather(*(o.close() for o in others), return_exceptions=True)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=self.config.shutdown_timeout)
            if stuck:
                log.warning(
                    "connection_tasks_did_not_stop",
                    broker=self.address,
                    tasks=[t.get_name() for t in stuck],
                )
        conn, self._conn = self._conn, None
        if self._connected is not None:
            self._connected.set()  # wake requests waiting for a reconnect: they fail now
        if conn is not None:
            conn.close()
            await conn.wait_closed(self.config.shutdown_timeout)
        self._started = False

    async def unregister(
        self, *, producer_group: str | None = None, consumer_group: str | None = None
    ) -> None:
        """Send UNREGISTER_CLIENT for one group to every broker group connected to (best
        effort: failures are logged)."""
        if producer_group:
            self._producer_groups.discard(producer_group)
        if consumer_group:
            self._consumers.pop(consumer_group, None)
        others = self._group_connections()
        if others:
            await asyncio.gather(
                *(
                    o.unregister(producer_group=producer_group, consumer_group=consumer_group)
                    for o in others
                )
            )
        if not self.connected:
            return
        header = UnregisterClientRequestHeader(
            client_id=self.client_id, producer_group=producer_group, consumer_group=consumer_group
        )
        try:
            await self.invoke(
                RequestCode.UNREGISTER_CLIENT, header, timeout=self.config.request_timeout
            )
        except TxmqError as exc:
            log.warning(
                "unregister_failed",
                broker=self.address,
                error=str(exc),
                producer_group=producer_group,
                consumer_group=consumer_group,
            )

    # -- requests --------------------------------------------------------------------------------

    async def wait_connected(self, timeout: float) -> Connection:
        """The live connection, waiting up to ``timeout`` for a reconnect.

        Raises:
            ConnectionClosedError: not connected within ``timeout`` (or closed for good).
        """
        if self._closing or self._connected is None:
            raise ConnectionClosedError(f"connection to broker {self.address} is closed")
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        deadline = time.monotonic() + timeout
        while True:
            if self._connected.is_set() and (self._conn is None or self._conn.closed):
                # Closed by this side a moment ago; its close callback (which starts the
                # reconnect) has not run yet.
                self._connected.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await wait_event(self._connected, remaining):
                raise ConnectionClosedError(
                    f"not connected to broker {self.address} (reconnecting)"
                )
            conn = self._conn
            if self._closing:
                raise ConnectionClosedError(f"connection to broker {self.address} is closed")
            if conn is not None and not conn.closed:
                return conn

    async def request(self, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        """Send ``cmd`` and return the broker's response, whatever its code.

        Raises:
            ConnectionClosedError: no connection, or it closed before the answer.
            RequestTimeoutError: no answer within ``timeout``.
        """
        if timeout is None:
            timeout = self.config.request_timeout
        conn = self._conn
        if (
            conn is not None
            and not conn.closed
            and not self._closing
            and self._connected is not None
        ):
            remaining = timeout  # connected: no wait for a reconnect
        else:
            deadline = time.monotonic() + timeout
            conn = await self.wait_connected(timeout)
            remaining = max(deadline - time.monotonic(), 0.001)
        token = None
        if self.cluster and cmd.code in _WATCHED and len(self.seeds) > 1:
            token = object()
            self._writes[token] = (time.monotonic(), conn)
            if self._leader_watch is None or self._leader_watch.done():
                self._leader_watch = self._spawn(self._watch_leader())
        try:
            return await conn.request(cmd, remaining)
        except RequestTimeoutError:
            if self.cluster and conn is self._conn:
                # A leader that stopped answering (paused, cut off) keeps its TCP connection
                # open: drop it, so the next request finds the group's current leader.
                log.warning("broker_unresponsive", broker=f"{self.host}:{self.port}")
                conn.close()
            raise
        finally:
            if token is not None:
                del self._writes[token]

    async def _watch_leader(self) -> None:
        """While watched requests are in flight: when one has waited :data:`STALLED_S`,
        ask the group's other replicas who leads; one naming another leader means this
        connection's broker was deposed (paused, cut off): drop the connection (its requests
        fail as on a lost connection) and find the new leader."""
        while self._writes and not self._closing:
            await asyncio.sleep(CLUSTER_POLL_S)
            now = time.monotonic()
            conn = self._conn
            if conn is None or conn.closed:
                continue
            if not any(c is conn and now - t >= STALLED_S for t, c in self._writes.values()):
                continue
            leader = await self._leader_elsewhere()
            if leader is not None and conn is self._conn and not conn.closed:
                log.warning(
                    "broker_deposed",
                    broker=f"{self.host}:{self.port}",
                    leader=f"{leader[0]}:{leader[1]}",
                )
                conn.close()

    async def _leader_elsewhere(self) -> tuple[str, int] | None:
        """The leader another replica of the group names, if not the broker connected to."""
        here = (self.host, self.port)
        for seed in self.seeds:
            if seed == here:
                continue
            try:
                conn = await self._connect_quietly(*seed)
            except TxmqError:
                continue
            try:
                leader = await self._cluster_leader(conn)
            except TxmqError:
                leader = None
            finally:
                conn.close()
            if leader is not None and leader != here:
                return leader
        return None

    async def _connect_quietly(self, host: str, port: int) -> Connection:
        """A short-lived connection (no reconnect on its loss)."""
        return await open_connection(
            host,
            port,
            timeout=self.config.connect_timeout,
            signer=self._signer,
            ssl=self._ssl,
        )

    async def invoke(
        self,
        code: int,
        header: Header | dict[str, Any] | None = None,
        body: bytes = b"",
        *,
        timeout: float | None = None,
        accept: tuple[int, ...] = (ResponseCode.SUCCESS,),
    ) -> RemotingCommand:
        """Send a request built from a typed header and raise unless the response code is in
        ``accept``.

        Raises:
            BrokerResponseError: the subclass for the response code (see ``error_for_code``).
        """
        ext = header.to_ext_fields() if isinstance(header, Header) else dict(header or {})
        resp = await self.request(RemotingCommand.request(code, ext, body), timeout)
        if resp.code not in accept:
            raise error_for_code(resp.code, resp.remark)
        return resp

    async def send_oneway(self, cmd: RemotingCommand) -> None:
        """Send a oneway request (no answer).

        Raises:
            ConnectionClosedError: not connected within the request timeout.
        """
        conn = await self.wait_connected(self.config.request_timeout)
        conn.send_oneway(cmd)
        await conn.drain()

    # -- heartbeat ---------------------------------------------------------------------------------

    def heartbeat_data(self) -> dict[str, Any]:
        """RocketMQ's HeartbeatData for the groups registered now."""
        return {
            "clientID": self.client_id,
            "producerDataSet": [{"groupName": g} for g in sorted(self._producer_groups)],
            "consumerDataSet": [provider() for provider in self._consumers.values()],
        }

    async def send_heartbeat(self) -> None:
        """Send one HEART_BEAT now (to every broker group connected to).

        Raises:
            TxmqError: the broker refused it or did not answer.
        """
        conn = await self.wait_connected(self.config.request_timeout)
        await self._heartbeat_on(conn)
        for other in self._group_connections():
            await other.send_heartbeat()

    async def _heartbeat_on(self, conn: Connection) -> None:
        body = json.dumps(self.heartbeat_data(), separators=(",", ":")).encode("utf-8")
        resp = await conn.request(
            RemotingCommand.request(RequestCode.HEART_BEAT, body=body), self.config.request_timeout
        )
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_code(resp.code, resp.remark)

    async def _heartbeat_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.config.heartbeat_interval)
            conn = self._conn
            if conn is None or conn.closed:
                continue
            try:
                await self._heartbeat_on(conn)
            except TxmqError as exc:
                log.warning("heartbeat_failed", broker=self.address, error=str(exc))

    # -- connection management --------------------------------------------------------------------

    async def _connect(self, host: str, port: int) -> Connection:
        return await open_connection(
            host,
            port,
            self._handle,
            timeout=self.config.connect_timeout,
            on_close=self._on_close,
            signer=self._signer,
            ssl=self._ssl,
        )

    async def _open(self, *, last_leader_first: bool = True) -> Connection:
        """Connect to the broker to use: the address given, or in a cluster (brokers started
        with etcdEndpoints) the leader of its broker group, found by asking the given
        addresses in turn (the last leader first, or last after it was lost)."""
        others = [s for s in self.seeds if s != (self.host, self.port)]
        if last_leader_first:
            seeds = [(self.host, self.port), *others]
        else:
            seeds = [*others, (self.host, self.port)]
        last: TxmqError | None = None
        for host, port in seeds:
            try:
                conn = await self._connect(host, port)
            except TxmqError as exc:
                last = exc
                continue
            try:
                leader = await self._cluster_leader(conn)
            except RequestTimeoutError as exc:
                if len(self.seeds) == 1:
                    # One address: a busy broker, not a reason to fail the connection.
                    log.info("cluster_status_unanswered", broker=f"{host}:{port}", error=str(exc))
                    self.host, self.port = host, port
                    return conn
                conn.close()
                last = exc
                continue
            except TxmqError as exc:
                conn.close()
                last = exc
                continue
            if leader is None or leader == (host, port):
                self.host, self.port = host, port
                return conn
            conn.close()
            try:
                conn = await self._connect(*leader)
            except TxmqError as exc:
                last = exc
                continue
            self.host, self.port = leader
            return conn
        assert last is not None
        raise last

    async def _cluster_leader(self, conn: Connection) -> tuple[str, int] | None:
        """The leader of the broker group ``conn`` belongs to, None for a single broker.

        Raises:
            ConnectionClosedError: a cluster broker with no elected leader yet.
        """
        resp = await conn.request(
            RemotingCommand.request(RequestCode.TXMQ_CLUSTER_STATUS),
            # Several addresses: a broker that does not answer fast is skipped for the next.
            self.config.connect_timeout
            if len(self.seeds) > 1
            else max(self.config.connect_timeout, self.config.request_timeout),
        )
        if resp.code != ResponseCode.SUCCESS:
            return None  # a single broker (or one that does not say)
        self.cluster = True
        doc = json.loads(resp.body)
        group = doc.get("self", {}).get("group")
        self.group_name = str(group) if group else None
        info = doc.get("groups", {}).get(group) or {}
        leader = info.get("leader")
        if not leader:
            raise ConnectionClosedError(
                f"broker group {group!r} has no leader yet (asked {conn.peer[0]}:{conn.peer[1]})"
            )
        return parse_address(str(leader["addr"]))

    def _on_close(self, conn: Connection) -> None:
        if conn is not self._conn or self._closing:
            return
        self._conn = None
        if self._connected is not None:
            self._connected.clear()
        log.warning("broker_connection_lost", broker=self.address, client_id=self.client_id)
        self._state_changed(ConnectionState.LOST)
        if self._reconnect_task is None or self._reconnect_task.done():
            self._reconnect_task = self._spawn(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        delay = self.config.reconnect_backoff_initial
        attempt = 0
        lost_at = time.monotonic()
        while not self._closing:
            if self.cluster and len(self.seeds) > 1:
                # The group's replicas name the new leader as soon as it is elected: ask them
                # often, starting with the other replicas, rather than back off blindly.
                if time.monotonic() - lost_at < CLUSTER_POLL_FOR_S:
                    delay = min(delay, CLUSTER_POLL_S)
            await asyncio.sleep(delay)
            attempt += 1
            try:
                conn = await self._open(last_leader_first=not self.cluster)
            except TxmqError as exc:
                log.debug("reconnect_failed", broker=self.address, attempt=attempt, error=str(exc))
                delay = min(delay * 2, self.config.reconnect_backoff_max)
                continue
            if self._closing:
                conn.close()
                return
            try:
                await self._heartbeat_on(conn)
            except TxmqError as exc:
                if conn.closed:
                    delay = min(delay * 2, self.config.reconnect_backoff_max)
                    continue
                log.warning("heartbeat_failed", broker=self.address, error=str(exc))
            if conn.closed:
                continue
            self._conn = conn
            self.reconnects += 1
            assert self._connected is not None
            self._connected.set()
            log.info(
                "broker_reconnected",
                broker=self.address,
                attempts=attempt,
                client_id=self.client_id,
            )
            self._state_changed(ConnectionState.RECONNECTED)
            for callback in list(self._reconnect_callbacks):
                try:
                    result = callback()
                    if inspect.isawaitable(result):
                        await result
                except Exception as exc:  # one failing hook must not stop the others
                    log.warning("reconnect_callback_failed", error=repr(exc))
            return

    async def _handle(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        # A processor (and the tasks it starts) can tell which broker group asked.
        current_connection.set(self)
        processor = self._processors.get(cmd.code)
        if processor is None:
            log.warning("broker_request_refused", code=cmd.code)
            return cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f"request code {cmd.code} not supported by this client",
            )
        return await processor(cmd)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

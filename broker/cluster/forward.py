"""A follower's forwarding of writes to its group's leader.

Routes name each follower as a write-only broker of its own (``<group>@<replicaId>``, see
:meth:`~.view.ClusterView.route`).  A stock producer that cannot reach the leader retries its
send on another queue of its cached route, which then is such an entry; its request reaches a
follower, which sends it on to the replica leading now over one kept connection and answers
with the leader's answer.  The follower stores nothing: the request is an ordinary client
request to the leader of the current epoch, so the fences (in-sync set, lease, epoch) apply to
it exactly as to a direct send.

When there is no leader (an election is running), the leader refuses connections (its process
is gone and its lease not yet revoked) or does not answer in time, the request is answered at
once with SERVICE_NOT_AVAILABLE, which stock producers retry on another queue.  A request that
timed out may still be stored by the leader later (as with a direct send whose answer was
lost): the client's retry may then store the message twice (at least once, as RocketMQ).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl as _ssl
from collections.abc import Callable

import structlog

from txmq.protocol.aio import Connection, open_connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import ConnectionClosedError, TxmqError

from .view import ClusterView

log = structlog.get_logger(__name__)

#: The requests a follower forwards: sends, recalls of timer messages, the decision of a half sent through it (stock
#: producers send END_TRANSACTION to the broker the half's queue names) and the consumer list
#: (stock consumers ask a broker of the route picked at random, follower entries included).
FORWARDED = frozenset(
    {
        RequestCode.SEND_MESSAGE,
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.RECALL_MESSAGE,
        RequestCode.END_TRANSACTION,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP,
    }
)
#: Seconds to connect to the leader (a leader whose process is gone refuses at once).
CONNECT_TIMEOUT_S = 1.0
#: Seconds the leader has to answer a forwarded request: below stock producers' own send
#: timeout (3 s), so they get an answer to retry on rather than a timeout of their own.
FORWARD_TIMEOUT_S = 2.5


class WriteForwarder:
    """Forwards :data:`FORWARDED` requests from a follower of ``group`` to its leader.

    Args:
        view: the replica's watched copy of the cluster (who leads ``group`` now).
        group: the replica's broker group.
        replica: the replica's id (a request arriving while it is being elected is refused).
        client_ssl: the TLS context to reach the leader with (None: plain TCP), as the
            follower's replication uses.
        max_frame_size: the largest answer accepted from the leader.
    """

    def __init__(
        self,
        view: ClusterView,
        group: str,
        replica: int,
        client_ssl: Callable[[], _ssl.SSLContext | None],
        max_frame_size: int,
    ) -> None:
        self.view = view
        self.group = group
        self.replica = replica
        self._client_ssl = client_ssl
        self._max_frame_size = max_frame_size
        self._conn: Connection | None = None
        self._conn_addr = ""
        self._lock = asyncio.Lock()
        self._closed = False
        #: Requests answered by the leader, and refused here (for tests and logs).
        self.forwarded = 0
        self.refused = 0

    def _refuse(
        self, cmd: RemotingCommand, why: str, *, sent: bool = False
    ) -> RemotingCommand | None:
        """SERVICE_NOT_AVAILABLE for ``cmd``.  With ``sent`` the request reached the leader
        and was not answered in time: the remark does not say it was refused, since the
        leader may still store it."""
        self.refused += 1
        log.info("forward_failed", group=self.group, code=cmd.code, why=why, sent=sent)
        if cmd.is_oneway:
            return None
        if sent:
            remark = (
                f"forwarded to the leader of broker group {self.group!r} by a follower, "
                f"no answer: {why} (the leader may have stored it)"
            )
        else:
            remark = (
                f"this broker is a follower in broker group {self.group!r} and cannot forward "
                f"to its leader: {why}"
            )
        return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, remark)

    async def _connection(self, addr: str) -> Connection:
        async with self._lock:
            conn = self._conn
            if conn is not None and self._conn_addr == addr and not conn.closed:
                return conn
            if conn is not None:
                conn.close()
                self._conn = None
            if self._closed:
                raise ConnectionClosedError("the follower is stopping")
            host, _, port = addr.rpartition(":")
            conn = await open_connection(
                host,
                int(port),
                timeout=CONNECT_TIMEOUT_S,
                ssl=self._client_ssl(),
                max_frame_size=self._max_frame_size,
            )
            self._conn, self._conn_addr = conn, addr
            return conn

    async def forward(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """The leader's answer to ``cmd`` (its opaque is set by the caller's connection), or a
        SERVICE_NOT_AVAILABLE answer when no leader can be reached now; None for a oneway
        request."""
        leader = self.view.leader(self.group)
        if leader is None:
            return self._refuse(cmd, "no leader is elected yet")
        if leader.replica == self.replica:
            return self._refuse(cmd, "this replica is taking over the leadership")
        where = f"leader replica {leader.replica} at {leader.addr}"
        try:
            conn = await self._connection(leader.addr)
        except TxmqError as exc:
            return self._refuse(cmd, f"{where}: {exc}")
        # A copy: the request gets an opaque of this connection, the client's answer keeps the
        # client's.  Headers and body go unchanged (an ACL signature still verifies).
        out = dataclasses.replace(cmd, ext_fields=dict(cmd.ext_fields))
        if cmd.is_oneway:
            conn.send_oneway(out)
            self.forwarded += 1
            return None
        try:
            resp = await conn.request(out, FORWARD_TIMEOUT_S)
        except TxmqError as exc:
            return self._refuse(cmd, f"{where}: {exc}", sent=True)
        self.forwarded += 1
        return resp

    def leader_changed(self) -> None:
        """The watched view changed: if it no longer names the leader the kept connection goes
        to (deposed, or replaced), close that connection, so the requests forwarded on it are
        answered at once (refused; the remark says the old leader may have stored them)
        rather than after :data:`FORWARD_TIMEOUT_S` from a leader that went silent."""
        conn = self._conn
        if conn is None:
            return
        leader = self.view.leader(self.group)
        if leader is None or leader.addr != self._conn_addr:
            self._conn = None
            conn.close()

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                await self._conn.wait_closed(2.0)
                self._conn = None

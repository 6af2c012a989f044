"""Broker I/O for Spark tasks and driver-side callbacks.

Spark calls the connector from plain synchronous Python (executor tasks, the driver's planning
and commit workers).  Each call opens one :class:`BrokerSession` on a private event loop thread
of its own (:func:`run`, the SDK's sync-over-async bridge), does its requests, and closes the
connection and the loop again, so nothing outlives the task that opened it.

With TLS options the session builds its :class:`ssl.SSLContext` from the configured files where
it runs (a context cannot be pickled and shipped from the driver).

The session's connection announces **no producer group**: the broker only sends
CHECK_TRANSACTION_STATE to registered groups, so the sink's pending halves never use up a check
budget; they wait for the batch decision (TXMQ_DECIDE_BATCH) instead.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

from txmq.client import BrokerConnection, ClientConfig
from txmq.client.admin import ROLLBACK
from txmq.client.bridge import run_coroutine
from txmq.client.config import tls_context
from txmq.client.logs import get_logger
from txmq.client.pull_consumer import (
    PullResult,
    get_max_offset,
    get_min_offset,
    pull_messages,
    search_offset,
)
from txmq.client.route import TopicRoute, fetch_route
from txmq.protocol.acl import Credentials
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import ConnectionClosedError, error_for_code
from txmq.protocol.headers import DecideBatchRequestHeader, ForceDecideRequestHeader

from .options import TlsOptions, TxmqOptionError, queue_key, split_queue_key

log = get_logger(__name__)

T = TypeVar("T")

#: Consumer group named in the source's pull requests (nothing is committed for it).
READER_GROUP = "txmq-spark-reader"


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn()`` to completion on a private event loop thread and stop the loop again
    (:func:`txmq.client.bridge.run_coroutine`).

    Spark may call the connector from a thread that already has a running loop (never in its
    own workers, but possibly in a user's process); a private loop keeps the two apart.
    """

    async def call() -> T:
        return await fn()

    return run_coroutine(call())


def ssl_context(tls: TlsOptions | None) -> ssl.SSLContext | None:
    """The client TLS context of the ``tls*`` options (None: plain TCP).

    Raises:
        TxmqOptionError: a file cannot be read or does not hold what it should (naming the
            option and the file).
    """
    if tls is None:
        return None
    try:
        return tls_context(tls.ca_path, tls.cert_path, tls.key_path)
    except ValueError as exc:
        option = "tlsCaPath" if "CA file" in str(exc) else "tlsCertPath/tlsKeyPath"
        raise TxmqOptionError(f"option {option}: {exc}") from None


class BrokerSession:
    """One broker connection used by one Spark task or driver callback.

    Args:
        broker: ``host:port``.
        request_timeout: seconds to wait for each answer.
        credentials: the ACL account requests are signed with, or None.
        tls: TLS to the broker, or None for plain TCP.

    Use as ``async with BrokerSession(...) as session:``.

    Raises:
        TxmqOptionError: the TLS files cannot be loaded.
    """

    def __init__(
        self,
        broker: str,
        request_timeout: float = 30.0,
        credentials: Credentials | None = None,
        tls: TlsOptions | None = None,
    ) -> None:
        self.broker = broker
        self.request_timeout = request_timeout
        self.tls = tls
        context = ssl_context(tls)
        self.connection = BrokerConnection(
            broker,
            ClientConfig(
                request_timeout=request_timeout,
                connect_timeout=10.0,
                access_key=credentials.access_key if credentials else None,
                secret_key=credentials.secret_key if credentials else None,
                tls=context if context is not None else False,
            ),
        )

    async def __aenter__(self) -> BrokerSession:
        try:
            await self.connection.start()
        except ConnectionClosedError as exc:
            if self.tls is None or "TLS handshake" not in str(exc):
                raise
            trusted = (
                f"the CA file {self.tls.ca_path!r} (option tlsCaPath)"
                if self.tls.ca_path
                else "the system's CA store (no tlsCaPath given)"
            )
            raise ConnectionClosedError(
                f"{exc} -- the broker's certificate was checked against {trusted}; is that the "
                "CA that signed it?"
            ) from exc
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.connection.close()

    # -- transactions ----------------------------------------------------------------------------

    async def decide_batch(
        self,
        group: str,
        batch_key: str,
        commit: list[str] | None = None,
        *,
        query_only: bool = False,
        pipeline: str | None = None,
        start: str | None = None,
        end: str | None = None,
        run: str | None = None,
    ) -> dict[str, Any]:
        """TXMQ_DECIDE_BATCH: commit ``commit`` and roll back every other pending transaction of
        ``group`` tagged ``batch_key`` (or, with ``query_only``, only report the decision).

        With ``pipeline``, a decision records the input range ``[start, end)`` the batch
        consumed (canonical offset JSON, see :func:`.options.offsets_text`) and is refused
        unless ``start`` is where the pipeline's last decided batch ended; a query also answers
        ``pipeline``: where it is (``end``, ``batchKey``) and the ``next`` end after ``start``.
        A query with ``run`` announces that run of the pipeline: the broker rolls back the
        pending transactions of the pipeline's other runs first.

        Returns:
            The broker's JSON answer: ``decided``, ``committed``, ``rolledBack``, ``position``
            and ``first`` (or ``pending`` for a query).

        Raises:
            TxmqError: the broker refused (e.g. a listed transaction was rolled back already).
        """
        header = DecideBatchRequestHeader(
            producer_group=group, batch_key=batch_key, query_only=query_only
        )
        doc: dict[str, Any] = {} if query_only else {"commit": list(commit or [])}
        if pipeline is not None:
            doc["pipeline"] = pipeline
            given = (("start", start), ("end", end), ("run", run))
            doc.update((key, value) for key, value in given if value is not None)
        body = json.dumps(doc).encode() if doc else b""
        resp = await self.connection.invoke(RequestCode.TXMQ_DECIDE_BATCH, header, body)
        answer: dict[str, Any] = json.loads(resp.body.decode("utf-8"))
        return answer

    async def rollback(self, transaction_id: str) -> str:
        """Roll back one transaction (TXMQ_FORCE_DECIDE); repeating it is harmless.

        Raises:
            TxmqError: the broker refused (e.g. the transaction is committed already).
        """
        header = ForceDecideRequestHeader(
            transaction_id=transaction_id, commit_or_rollback=ROLLBACK
        )
        resp = await self.connection.invoke(RequestCode.TXMQ_FORCE_DECIDE, header)
        return resp.remark or ""

    # -- topics and offsets ---------------------------------------------------------------------

    async def route(self, topic: str) -> TopicRoute | None:
        """The topic's route, or None when it does not exist yet."""
        return await fetch_route(self.connection, topic)

    async def _queue(self, topic: str, queue: int | str) -> tuple[BrokerConnection, int]:
        """The connection to a queue's broker group and its id there; ``queue`` is an id or an
        offset-map key (``<group>:<id>`` for a topic in several groups of a cluster)."""
        broker, qid = split_queue_key(str(queue))
        if broker is None:
            return self.connection, qid
        if broker not in self.connection.group_addresses:
            await self.route(topic)
        return await self.connection.for_group(broker), qid

    async def max_offset(self, topic: str, queue: int | str) -> int:
        """The queue's next free offset."""
        conn, qid = await self._queue(topic, queue)
        return int(await get_max_offset(conn, topic, qid))

    async def min_offset(self, topic: str, queue: int | str) -> int:
        """The queue's oldest stored offset."""
        conn, qid = await self._queue(topic, queue)
        return int(await get_min_offset(conn, topic, qid))

    async def search_offset(self, topic: str, queue: int | str, ts_ms: int) -> int:
        """The first offset stored at or after ``ts_ms``."""
        conn, qid = await self._queue(topic, queue)
        return int(await search_offset(conn, topic, qid, ts_ms))

    async def queue_offsets(self, topic: str, *, latest: bool) -> dict[str, int]:
        """``{queue: offset}`` of every readable queue of ``topic`` (max offsets if ``latest``,
        else min offsets); empty when the topic does not exist yet.  Queues are keyed by id on a
        single broker, by ``<group>:<id>`` in a cluster."""
        route = await self.route(topic)
        if route is None or not route.readable:
            return {}
        if self.connection.group_name is not None:
            # A cluster: keyed by group even while the topic has one, so its keys stay the same
            # when the topic is placed on another group.
            keys = [queue_key(q.broker, q.queue_id) for q in route.read_queues]
        else:
            keys = [str(q) for q in route.read_queue_ids]
        get = self.max_offset if latest else self.min_offset
        values = await asyncio.gather(*(get(topic, q) for q in keys))
        return {q: int(v) for q, v in zip(keys, values, strict=True)}

    async def pull(self, topic: str, queue: int | str, offset: int, max_nums: int) -> PullResult:
        """One PULL_MESSAGE (no long polling, no offset commit)."""
        conn, queue_id = await self._queue(topic, queue)
        return await pull_messages(
            conn,
            READER_GROUP,
            topic,
            queue_id,
            offset,
            max_nums=max_nums,
            timeout=self.request_timeout,
        )


def check_success(code: int, remark: str | None, what: str) -> None:
    """Raise the error class of ``code`` unless it is SUCCESS, naming ``what`` failed.

    Raises:
        TxmqError: the subclass for ``code``.
    """
    if code != ResponseCode.SUCCESS:
        raise error_for_code(code, f"{what}: {remark or 'no remark'}")


__all__ = ["BrokerSession", "READER_GROUP", "check_success", "run", "ssl_context"]

"""Transactional producers: publish if and only if the local transaction commits.

Flow (RocketMQ's, with txmq's answered END_TRANSACTION):

1. :meth:`AsyncTransactionProducer.send_message_in_transaction` sends a *half* message; if it
   was not stored, it raises and no local transaction runs.
2. The listener's ``execute_local_transaction(message, arg)`` runs; an exception or ``None``
   means UNKNOW (the exception text goes in the END_TRANSACTION remark).
3. END_TRANSACTION carries the decision; the call returns once the broker has acknowledged it
   (a failed commit raises instead of being swallowed).
4. For UNKNOW (or a producer that died meanwhile) the broker later sends CHECK_TRANSACTION_STATE
   to any live producer of the group; ``check_local_transaction(message)`` answers it.

Check-back handling is bounded: at most ``check_threads`` listener calls run at once and at most
``check_queue_size`` checks wait.  A check beyond that is refused with SYSTEM_BUSY; the broker
does not count it and asks again next round, so no check is dropped silently.

A transaction across broker groups (``transaction(across_groups=True)``, a cluster only) tags its
halves with its id as batch key (``TXMQ_BATCH_KEY``) and is decided with TXMQ_DECIDE_BATCH: the
first group asked records the decision in etcd (create-if-absent, the first decision wins), every
group applies that record, so all groups commit or none does; check-back answers for it take the
same road.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING, Any

from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    BrokerSystemError,
    FencedError,
    TransactionFailedError,
    TxmqError,
    error_for_code,
)
from txmq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    DecideBatchRequestHeader,
    EndTransactionRequestHeader,
    ListTransactionsRequestHeader,
)
from txmq.protocol.message import (
    Message,
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_message,
    decode_offset_msg_id,
)
from txmq.protocol.txn_offsets import TXN_OFFSETS_TOPIC, QueueOffset, TxnOffsets

from . import telemetry
from .config import DEFAULT_BROKER, ClientConfig
from .errors import InvalidMessageError
from .lifecycle import AsyncClient
from .logs import get_logger
from .producer import AsyncProducer, SendResult, SendStatus, new_uniq_id
from .remoting import BrokerConnection, current_connection
from .sync import _SyncClient, blocking
from .two_phase import PreparedResolver, PreparedTransaction, PreparedTransactionUnknownError

if TYPE_CHECKING:
    from .consumer import ProcessQueue
    from .orderly import AsyncOrderlyPushConsumer

log = get_logger(__name__)

_END_TRANSACTION = int(RequestCode.END_TRANSACTION)

#: Default bound on concurrent ``check_local_transaction`` calls.
DEFAULT_CHECK_THREADS = 4
#: Default bound on checks accepted but not yet answered.
DEFAULT_CHECK_QUEUE_SIZE = 2000
#: Default time a transaction across broker groups keeps asking a group (through its leader
#: changes) to take its decision before the outcome is reported in doubt.
DEFAULT_DECISION_TIMEOUT = 30.0

#: Test seam: with ``TXMQ_TXN_PAUSE_AT=<step>[,<step>...]`` and ``TXMQ_TXN_PAUSE_FILE=<path>`` in
#: the environment, a transaction across broker groups stops at each step named
#: (``commit-point``, ``after-commit-point``, ``group:<name>``), writes ``<path>.<step>.paused``
#: and goes on once ``<path>.<step>.go`` exists (or after five minutes), so that a test can
#: kill a leader at that step.
PAUSE_AT_ENV = "TXMQ_TXN_PAUSE_AT"
PAUSE_FILE_ENV = "TXMQ_TXN_PAUSE_FILE"


async def _pause_point(step: str) -> None:
    steps = os.environ.get(PAUSE_AT_ENV)
    path = os.environ.get(PAUSE_FILE_ENV)
    if not steps or not path or step not in steps.split(","):
        return
    with open(f"{path}.{step}.paused", "w") as f:
        f.write(step)
    log.warning("transaction_paused", step=step)
    deadline = time.monotonic() + 300.0
    while not os.path.exists(f"{path}.{step}.go") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


class TransactionInDoubtError(TxmqError):
    """The decision of a transaction across broker groups could not be confirmed: it may or may
    not have been recorded.  Nothing is lost and the groups still agree: a recorded decision is
    applied by every group's leader by itself; an unrecorded one is settled by check-back (the
    groups ask the producer group, and the first answer is recorded and applied everywhere)."""


class CrossGroupUnavailableError(TxmqError, ValueError):
    """A transaction across broker groups was asked of a single broker (no etcd to record its
    decision in): use a plain ``transaction()``."""


class LocalTransactionState(enum.Enum):
    """The outcome of a local transaction (RocketMQ's spelling; ``UNKNOWN`` is an alias)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"
    UNKNOWN = "UNKNOW"  # alias of UNKNOW

    @property
    def wire_value(self) -> int:
        return {
            "COMMIT_MESSAGE": MessageSysFlag.TRANSACTION_COMMIT_TYPE,
            "ROLLBACK_MESSAGE": MessageSysFlag.TRANSACTION_ROLLBACK_TYPE,
        }.get(self.value, MessageSysFlag.TRANSACTION_NOT_TYPE)


#: ``state.wire_value`` of each state, without the property's call.
_WIRE_VALUES = {s: s.wire_value for s in LocalTransactionState}


class _TransactionBlock:
    """``async with producer.transaction()``: the transaction is made on entry (a transaction
    across groups checks for a cluster then), committed after a clean exit, rolled back after
    an exception, which then goes on (what an ``asynccontextmanager`` around a ``yield``
    does, without a generator per transaction)."""

    __slots__ = ("_producer", "_transaction_id", "_across_groups", "_two_phase", "_txn")

    def __init__(
        self,
        producer: AsyncTransactionProducer,
        transaction_id: str | None,
        across_groups: bool,
        two_phase: bool = False,
    ) -> None:
        self._producer = producer
        self._transaction_id = transaction_id
        self._across_groups = across_groups
        self._two_phase = two_phase
        self._txn: AsyncTransaction | None = None

    async def __aenter__(self) -> AsyncTransaction:
        if self._across_groups:
            self._producer.require_cluster()
        self._txn = AsyncTransaction(
            self._producer,
            self._transaction_id or new_uniq_id(),
            across_groups=self._across_groups,
            two_phase=self._two_phase,
        )
        return self._txn

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> bool:
        assert self._txn is not None
        if exc_type is not None and exc is None:
            exc = exc_type()
        await self._txn.finish(exc)
        return False  # an exception goes on


def end_transaction_fields(
    group: str,
    half: SendResult,
    state: LocalTransactionState,
    from_check: bool = False,
    transaction_id: str | None = None,
) -> dict[str, Any]:
    """The END_TRANSACTION fields deciding ``half``: what
    ``EndTransactionRequestHeader(...).to_ext_fields()`` gives (same keys, order and values;
    ``tests/client/test_client_send_path.py`` compares them), without the typed header."""
    _, offset = decode_offset_msg_id(half.offset_msg_id)
    return {
        "producerGroup": group,
        "tranStateTableOffset": half.queue_offset,
        "commitLogOffset": offset,
        "commitOrRollback": _WIRE_VALUES[state],
        "fromTransactionCheck": from_check,
        "msgId": half.msg_id,
        "transactionId": transaction_id or half.transaction_id or half.msg_id,
    }


class TransactionListener:
    """Implement both methods; either may be a coroutine function.  Sync methods run in a
    thread pool, never on the event loop."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        raise NotImplementedError

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        raise NotImplementedError


class RollbackOnCheck(TransactionListener):
    """The listener of a consume-transform-produce producer (only ``transaction()`` blocks,
    no ``send_message_in_transaction``): a transaction the broker asks about was never
    confirmed, so it is rolled back and its input is handled again by the queue's owner."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.ROLLBACK_MESSAGE


@dataclass
class TransactionSendResult(SendResult):
    """A :class:`SendResult` plus the local transaction's outcome."""

    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW

    @classmethod
    def of(
        cls, half: SendResult, transaction_id: str, state: LocalTransactionState
    ) -> TransactionSendResult:
        """The half message's send result with the transaction id and the local outcome."""
        sent = {f.name: getattr(half, f.name) for f in fields(SendResult)}
        sent["transaction_id"] = transaction_id
        return cls(**sent, local_transaction_state=state)


async def _call(fn: Any, *args: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.get_running_loop().run_in_executor(None, partial(fn, *args))
    if inspect.isawaitable(result):
        return await result
    return result


def _as_state(value: Any) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    if value is None:
        return LocalTransactionState.UNKNOW
    if isinstance(value, str) and value.upper() in LocalTransactionState.__members__:
        return LocalTransactionState[value.upper()]
    raise TypeError(f"a transaction listener must return a LocalTransactionState, got {value!r}")


class AsyncTransactionProducer(AsyncClient):
    """Sends transactional messages; every method is a coroutine.

    Args:
        group: the producer group; any live producer of the group may answer its checks.
        listener: a :class:`TransactionListener`.
        broker: ``"host:port"``.
        check_threads: at most this many check-back listener calls run at once.
        check_queue_size: at most this many checks wait; more are refused (the broker asks
            again next round).
        decision_timeout: how long the decision of a transaction across broker groups is
            retried (through a group's leader change) before it is reported in doubt.
        prepared_resolver: answers check-backs of two-phase transactions (see
            :meth:`set_prepared_resolver`).
        config, **settings: client settings, as for :class:`AsyncProducer`.
    """

    _kind = "producer"

    def __init__(
        self,
        group: str,
        listener: TransactionListener,
        broker: str = DEFAULT_BROKER,
        *,
        check_threads: int = DEFAULT_CHECK_THREADS,
        check_queue_size: int = DEFAULT_CHECK_QUEUE_SIZE,
        decision_timeout: float = DEFAULT_DECISION_TIMEOUT,
        prepared_resolver: PreparedResolver | None = None,
        config: ClientConfig | None = None,
        **settings: Any,
    ) -> None:
        if listener is None:
            raise ValueError("a transaction producer needs a TransactionListener")
        if check_threads < 1 or check_queue_size < 1:
            raise ValueError("check_threads and check_queue_size must be at least 1")
        super().__init__()
        self.group = group
        self.listener = listener
        self.producer = AsyncProducer(group, broker, config=config, **settings)
        self.check_threads = check_threads
        self.check_queue_size = check_queue_size
        self.decision_timeout = decision_timeout
        self.prepared_resolver = prepared_resolver
        self._check_sem = asyncio.Semaphore(check_threads)
        self._checks_waiting = 0
        self._check_tasks: set[asyncio.Task[None]] = set()
        #: Checks received, answered, and refused because the bound was reached.
        self.checks_received = 0
        self.checks_answered = 0
        self.checks_refused = 0

    async def _start(self) -> None:
        """Start the producer and answer the broker's transaction checks."""
        await self.producer.start()
        self.producer.connection.register_processor(
            RequestCode.CHECK_TRANSACTION_STATE, self._on_check
        )

    async def _shutdown(self) -> None:
        """Cancel the running checks and shut the producer down."""
        for t in list(self._check_tasks):
            t.cancel()
        await asyncio.gather(*self._check_tasks, return_exceptions=True)
        await self.producer.shutdown()

    # -- sending ------------------------------------------------------------------------------

    async def _send_half(
        self, msg: Message, extra: dict[str, str] | None = None, **kw: Any
    ) -> SendResult:
        props = {MessageConst.TRAN_MSG: "true", MessageConst.PGROUP: self.group}
        props.update(extra or {})
        result = await self.producer.send_message(
            msg, sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE, extra_properties=props, **kw
        )
        return result

    async def send_message_in_transaction(
        self,
        msg: Message,
        arg: Any = None,
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        timeout: float | None = None,
        check_immunity_seconds: int | None = None,
    ) -> TransactionSendResult:
        """Send ``msg`` as a half message, run the local transaction, and deliver the decision.

        ``check_immunity_seconds`` delays the first check-back of this transaction (RocketMQ's
        ``CHECK_IMMUNITY_TIME_IN_SECONDS``) when the local transaction is known to take long.

        Raises:
            TxmqError: the half message was not stored (no local transaction ran), or the
                broker refused or failed the decision.
        """
        extra = (
            {MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: str(int(check_immunity_seconds))}
            if check_immunity_seconds is not None
            else None
        )
        result = await self._send_half(
            msg, extra, queue_id=queue_id, sharding_key=sharding_key, timeout=timeout
        )
        txid = result.transaction_id or result.msg_id
        if result.status is not SendStatus.SEND_OK:
            await self.end_transaction(
                result,
                LocalTransactionState.ROLLBACK_MESSAGE,
                f"half message not stored durably: {result.status.value}",
            )
            raise TransactionFailedError(
                f"the half message was not flushed in time ({result.status.value}); the "
                "transaction was rolled back and no local transaction ran"
            )
        remark = None
        try:
            state = _as_state(await _call(self.listener.execute_local_transaction, msg, arg))
        except Exception as exc:
            state = LocalTransactionState.UNKNOW
            remark = f"executeLocalTransactionBranch exception: {type(exc).__name__}: {exc}"
            log.warning("local_transaction_failed", transaction_id=txid, error=repr(exc))
        await self.end_transaction(result, state, remark)
        return TransactionSendResult.of(result, txid, state)

    async def end_transaction(
        self,
        half: SendResult,
        state: LocalTransactionState,
        remark: str | None = None,
        *,
        from_check: bool = False,
        transaction_id: str | None = None,
    ) -> None:
        """Send END_TRANSACTION for the half ``half`` and wait for the broker's answer."""
        fields = end_transaction_fields(self.group, half, state, from_check, transaction_id)
        if telemetry.AVAILABLE:
            with telemetry.end_transaction_span(
                half.topic,
                self.group,
                half.msg_id,
                transaction_id or half.transaction_id,
                state.value,
            ):
                await self._end_fields(half, fields, remark)
        else:
            await self._end_fields(half, fields, remark)

    async def _end_fields(
        self, half: SendResult, fields: dict[str, Any], remark: str | None
    ) -> None:
        # The decision goes to the broker group that stored the half.
        conn = self.producer.connection
        if conn.group_name is not None and half.broker_name != conn.group_name:
            conn = await self.producer.connection_for_group(half.broker_name)
        cmd = RemotingCommand(_END_TRANSACTION, remark=remark, ext_fields=fields)
        resp = await conn.request(cmd)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_code(resp.code, resp.remark)
        if self.producer._trace is not None:
            self.producer._trace.ended(
                EndTransactionRequestHeader.from_ext_fields(fields), conn.address
            )

    async def _end(
        self, header: EndTransactionRequestHeader, remark: str | None, conn: BrokerConnection
    ) -> None:
        if telemetry.AVAILABLE:
            decision = {v: k.value for k, v in _WIRE_VALUES.items()}.get(
                header.commit_or_rollback, str(header.commit_or_rollback)
            )
            with telemetry.end_transaction_span(
                None, self.group, header.msg_id or "", header.transaction_id, decision
            ):
                await self._end_request(header, remark, conn)
        else:
            await self._end_request(header, remark, conn)

    async def _end_request(
        self, header: EndTransactionRequestHeader, remark: str | None, conn: BrokerConnection
    ) -> None:
        cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_ext_fields())
        cmd.remark = remark
        resp = await conn.request(cmd)
        if resp.code != ResponseCode.SUCCESS:
            raise error_for_code(resp.code, resp.remark)
        if self.producer._trace is not None:
            self.producer._trace.ended(header, conn.address)

    # -- multi-message transactions -----------------------------------------------------------

    def transaction(
        self,
        transaction_id: str | None = None,
        *,
        across_groups: bool = False,
        two_phase: bool = False,
    ) -> _TransactionBlock:
        """Several messages, one decision: commit on a clean exit, roll back on an exception.

        By default every half goes to the broker group of the first one (one END_TRANSACTION
        decides them).  With ``across_groups=True`` (a cluster only) each half goes where a
        plain send would, and the decision is recorded in etcd and applied by every group
        holding halves: all of them commit or none does.

        With ``two_phase=True`` an outside coordinator decides: the block ends with
        ``handle = await txn.prepare()`` and the coordinator later calls :meth:`commit` or
        :meth:`rollback` with the handle (see :mod:`txmq.client.two_phase`).  An exception
        before ``prepare()`` rolls the transaction back; after it the block does nothing
        (the handle's owner decides); a block left without ``prepare()`` is rolled back and
        raises :class:`~txmq.client.TransactionFailedError`.

        Example::

            async with producer.transaction() as txn:
                await txn.send(m1)
                await txn.send(m2)

        Raises:
            CrossGroupUnavailableError: ``across_groups`` with a single broker.
            TransactionInDoubtError: (at the commit) the decision across groups could not be
                confirmed; see the class.
            ValueError: ``two_phase`` with ``across_groups``.
        """
        if two_phase and across_groups:
            raise ValueError(
                "a two-phase transaction stays in one broker group (its handle names one half); "
                "across_groups is not available with two_phase"
            )
        return _TransactionBlock(self, transaction_id, across_groups, two_phase)

    # -- two-phase commit: an outside coordinator decides ---------------------------------------

    def set_prepared_resolver(self, resolver: PreparedResolver | None) -> None:
        """Answer check-backs of two-phase transactions with ``resolver(handle)``: the
        coordinator's decision (COMMIT_MESSAGE, ROLLBACK_MESSAGE, or UNKNOW while it has none).

        A check of a two-phase transaction never goes to the listener (whose answer could be a
        blind rollback); without a resolver it is answered UNKNOW and the broker asks again
        (it never parks a two-phase transaction for its check budget)."""
        self.prepared_resolver = resolver

    async def commit(self, handle: PreparedTransaction | str, remark: str | None = None) -> None:
        """Commit the prepared transaction ``handle`` (or its text) names; from any producer of
        its group, also after the preparing process died or the broker restarted.

        Idempotent: a transaction committed before is answered with success.

        Raises:
            IllegalOperationError: the transaction was rolled back; it stays rolled back.
            PreparedTransactionUnknownError: the broker does not know the transaction (decided
                longer ago than ``transactionBatchRetention``, or another broker's handle).
            ValueError: the handle is of another producer group, or not a handle.
        """
        await self._decide_prepared(handle, LocalTransactionState.COMMIT_MESSAGE, remark)

    async def rollback(self, handle: PreparedTransaction | str, remark: str | None = None) -> None:
        """Roll back the prepared transaction ``handle`` names; as :meth:`commit` (a rollback
        repeated succeeds; one of a committed transaction raises IllegalOperationError)."""
        await self._decide_prepared(handle, LocalTransactionState.ROLLBACK_MESSAGE, remark)

    async def _decide_prepared(
        self,
        handle: PreparedTransaction | str,
        state: LocalTransactionState,
        remark: str | None,
    ) -> None:
        h = PreparedTransaction.parse(handle)
        if h.producer_group != self.group:
            raise ValueError(
                f"transaction {h.transaction_id} was prepared by producer group "
                f"{h.producer_group}; decide it with a producer of that group, not {self.group}"
            )
        fields = {
            "producerGroup": self.group,
            "tranStateTableOffset": h.queue_offset,
            "commitLogOffset": h.commit_log_offset,
            "commitOrRollback": _WIRE_VALUES[state],
            "fromTransactionCheck": False,
            "msgId": h.msg_id,
            "transactionId": h.transaction_id,
        }
        conn = self.producer.connection
        if conn.group_name is not None and h.broker and h.broker != conn.group_name:
            if h.broker not in conn.group_addresses:  # a fresh process: no route named it yet
                await self._cluster_groups()
            conn = await self.producer.connection_for_group(h.broker)
        cmd = RemotingCommand(_END_TRANSACTION, remark=remark, ext_fields=fields)
        resp = await conn.request(cmd)
        if resp.code == ResponseCode.SUCCESS:
            log.info(
                "prepared_transaction_decided",
                transaction_id=h.transaction_id,
                decision=state.value,
                answer=resp.remark,
            )
            return
        if resp.code == ResponseCode.SYSTEM_ERROR and (resp.remark or "").startswith(
            "Find prepared transaction message failed"
        ):
            raise PreparedTransactionUnknownError(
                f"broker {conn.address} does not know prepared transaction {h.transaction_id}: "
                "it was decided longer ago than the broker remembers decisions of two-phase "
                "transactions (transactionBatchRetention; the decision is final either way), or "
                "the handle is of another broker"
            )
        raise error_for_code(resp.code, resp.remark)

    async def _cluster_groups(self) -> list[str]:
        """The broker groups of the cluster (TXMQ_CLUSTER_STATUS of the connected broker); the
        addresses of those no route named yet are learnt from it (leader first)."""
        conn = self.producer.connection
        status = await conn.invoke(RequestCode.TXMQ_CLUSTER_STATUS)
        groups: dict[str, Any] = json.loads(status.body).get("groups") or {}
        for name, info in groups.items():
            if name in conn.group_addresses:
                continue
            leader = (info.get("leader") or {}).get("addr")
            members = [str(a) for _, a in sorted((info.get("members") or {}).items())]
            addresses = ([str(leader)] if leader else []) + [a for a in members if a != leader]
            if addresses:
                conn.group_addresses[name] = tuple(addresses)
        return sorted(groups)

    async def recover(
        self, broker_groups: list[str] | None = None, *, limit: int = 100_000
    ) -> list[PreparedTransaction]:
        """The handles of this producer group's two-phase transactions that are still
        undecided (PENDING, or DISCARDED: parked past ``fileReservedTime``), oldest first: what
        a coordinator's recovery decides from its own state.

        ``broker_groups``: in a cluster, the broker groups to ask (default: every group of the
        cluster, as the connected broker knows them); a single broker is asked alone.
        """
        conn = self.producer.connection
        header = ListTransactionsRequestHeader(
            producer_group=self.group,
            state="PENDING,DISCARDED",
            limit=limit,
            two_phase=True,
        )
        targets: list[BrokerConnection] = [conn]
        if conn.group_name is not None:
            groups = await self._cluster_groups()
            targets = [
                await self.producer.connection_for_group(g)
                for g in (groups if broker_groups is None else broker_groups)
            ]
        out: list[tuple[int, PreparedTransaction]] = []
        for target in targets:
            resp = await target.invoke(RequestCode.TXMQ_LIST_TRANSACTIONS, header)
            rows = json.loads(resp.body.decode("utf-8")) if resp.body else []
            for row in rows:
                if row.get("halves"):
                    age = min(int(x["storeTimestamp"]) for x in row["halves"])
                    out.append(
                        (age, PreparedTransaction.from_listing(row, target.group_name or ""))
                    )
        out.sort(key=lambda x: x[0])
        return [h for _, h in out]

    def require_cluster(self) -> None:
        """Raise unless the producer is connected to a cluster (brokers with etcd).

        Raises:
            CrossGroupUnavailableError: a single broker.
        """
        conn = self.producer.connection
        if conn.group_name is None:
            raise CrossGroupUnavailableError(
                f"broker {conn.address} is a single broker, not a cluster of broker groups "
                "(brokers started with etcdEndpoints): a transaction across groups needs etcd "
                "to record its decision; use transaction() without across_groups"
            )

    async def decide_across(
        self,
        conn: BrokerConnection,
        transaction_id: str,
        commit: bool,
        timeout: float | None = None,
    ) -> bool:
        """TXMQ_DECIDE_BATCH for the transaction across groups ``transaction_id`` on ``conn``'s
        broker group: the decision in force there (True: committed), the first one recorded."""
        committed, _ = await self._decide_across_answer(conn, transaction_id, commit, timeout)
        return committed

    async def _decide_across_answer(
        self,
        conn: BrokerConnection,
        transaction_id: str,
        commit: bool,
        timeout: float | None = None,
        offsets: bool = False,
    ) -> tuple[bool, str | None]:
        """:meth:`decide_across`, and why the group fenced the transaction's consumer offsets
        when that recorded its rollback; ``offsets``: the group must hold the transaction's
        offsets half (a commit without it is recorded as a rollback)."""
        header = DecideBatchRequestHeader(producer_group=self.group, batch_key=transaction_id)
        doc: dict[str, Any] = {"commit": [transaction_id] if commit else []}
        if offsets:
            doc["offsets"] = True
        body = json.dumps(doc).encode()
        resp = await conn.invoke(RequestCode.TXMQ_DECIDE_BATCH, header, body, timeout=timeout)
        answer = json.loads(resp.body.decode("utf-8"))
        fenced = answer.get("fenced")
        return transaction_id in (answer.get("committed") or []), (
            None if fenced is None else str(fenced)
        )

    # -- check-back ---------------------------------------------------------------------------

    async def _on_check(self, cmd: RemotingCommand) -> RemotingCommand:
        self.checks_received += 1
        if self._checks_waiting >= self.check_queue_size:
            self.checks_refused += 1
            return cmd.response(
                ResponseCode.SYSTEM_BUSY,
                f"check queue full ({self.check_queue_size}); ask again later",
            )
        try:
            header = CheckTransactionStateRequestHeader.from_ext_fields(cmd.ext_fields)
            msg = decode_message(cmd.body)
        except TxmqError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad check request: {exc}")
        self._checks_waiting += 1
        # The answer goes back to the broker group that asked.
        origin = current_connection.get() or self.producer.connection
        task = asyncio.get_running_loop().create_task(self._run_check(header, msg, origin))
        self._check_tasks.add(task)
        task.add_done_callback(self._check_tasks.discard)
        return cmd.response()

    async def _run_check(
        self, header: CheckTransactionStateRequestHeader, msg: MessageExt, conn: BrokerConnection
    ) -> None:
        try:
            async with self._check_sem:
                remark = None
                if msg.properties.get(MessageConst.TXMQ_2PC) == "1":
                    # An outside coordinator decides: its resolver answers, never the listener.
                    handle = PreparedTransaction(
                        header.transaction_id or msg.transaction_id or "",
                        self.group,
                        conn.group_name or "",
                        header.commit_log_offset,
                        header.tran_state_table_offset,
                        header.msg_id or "",
                    )
                    await self._answer_prepared_check(header, handle, conn)
                    return
                try:
                    state = _as_state(await _call(self.listener.check_local_transaction, msg))
                except Exception as exc:
                    state = LocalTransactionState.UNKNOW
                    remark = f"checkLocalTransaction exception: {type(exc).__name__}: {exc}"
                    log.warning(
                        "check_listener_failed",
                        transaction_id=header.transaction_id,
                        error=repr(exc),
                    )
                txid = header.transaction_id or msg.transaction_id or ""
                if txid and msg.properties.get(MessageConst.TXMQ_BATCH_KEY) == txid:
                    await self._answer_check_across(txid, state, conn)
                    return
                end = EndTransactionRequestHeader(
                    producer_group=self.group,
                    tran_state_table_offset=header.tran_state_table_offset,
                    commit_log_offset=header.commit_log_offset,
                    commit_or_rollback=state.wire_value,
                    from_transaction_check=True,
                    msg_id=header.msg_id,
                    transaction_id=header.transaction_id or msg.transaction_id,
                )
                try:
                    await self._end(end, remark, conn)
                    self.checks_answered += 1
                except TxmqError as exc:
                    # the broker checks again next round if this did not land
                    log.info(
                        "check_answer_failed", transaction_id=end.transaction_id, error=str(exc)
                    )
        finally:
            self._checks_waiting -= 1

    async def _answer_prepared_check(
        self,
        header: CheckTransactionStateRequestHeader,
        handle: PreparedTransaction,
        conn: BrokerConnection,
    ) -> None:
        """A check of a two-phase transaction: the prepared resolver's answer (UNKNOW without
        one, or when it fails: the broker asks again)."""
        remark = None
        resolver = self.prepared_resolver
        if resolver is None:
            state = LocalTransactionState.UNKNOW
            remark = "no prepared resolver in this producer"
            log.warning(
                "prepared_check_without_resolver",
                transaction_id=handle.transaction_id,
                action="answered UNKNOW; set_prepared_resolver() lets the coordinator decide",
            )
        else:
            try:
                state = _as_state(await _call(resolver, handle))
            except Exception as exc:
                state = LocalTransactionState.UNKNOW
                remark = f"prepared resolver exception: {type(exc).__name__}: {exc}"
                log.warning(
                    "prepared_resolver_failed",
                    transaction_id=handle.transaction_id,
                    error=repr(exc),
                )
        end = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset,
            commit_or_rollback=state.wire_value,
            from_transaction_check=True,
            msg_id=header.msg_id,
            transaction_id=handle.transaction_id,
        )
        try:
            await self._end(end, remark, conn)
            self.checks_answered += 1
        except TxmqError as exc:
            log.info("check_answer_failed", transaction_id=end.transaction_id, error=str(exc))

    async def _answer_check_across(
        self, txid: str, state: LocalTransactionState, conn: BrokerConnection
    ) -> None:
        """A check of a transaction across groups is answered as its producer decides: through
        the decision recorded in etcd, so every group gets the same outcome (the first one
        recorded, which may be an earlier decision than this answer)."""
        if state is LocalTransactionState.UNKNOW:
            self.checks_answered += 1  # nothing to record: the groups ask again
            return
        want = state is LocalTransactionState.COMMIT_MESSAGE
        try:
            committed = await self.decide_across(conn, txid, want)
        except TxmqError as exc:
            log.info("check_answer_failed", transaction_id=txid, error=str(exc))
            return
        self.checks_answered += 1
        if committed != want:
            log.warning(
                "check_answer_overruled",
                transaction_id=txid,
                answer=state.value,
                decided="COMMIT" if committed else "ROLLBACK",
            )


@dataclass
class _PendingHalf:
    msg: Message
    queue_id: int | None
    sharding_key: str | None
    result: asyncio.Future[SendResult]
    #: The broker group this half must go to (the offsets half: the consumed queues' group).
    broker: str | None = None


def _fail_halves(halves: list[_PendingHalf], exc: BaseException) -> None:
    """Halves that were not sent: their senders get ``exc`` (or are cancelled with the task)."""
    for p in halves:
        if isinstance(exc, asyncio.CancelledError):
            p.result.cancel()
        elif not p.result.done():
            p.result.set_exception(exc)


class AsyncTransaction:
    """A multi-message transaction; made by :meth:`AsyncTransactionProducer.transaction`.

    Halves sent concurrently (e.g. ``asyncio.gather(txn.send(m1), txn.send(m2))``) travel in
    one SEND_BATCH_MESSAGE per topic and queue choice: one acknowledged round trip for all of
    them instead of one each.  Each ``send`` still returns once its half is stored.

    With ``across_groups`` the halves are not kept in one broker group: each goes where a plain
    send would, tagged with the transaction id as batch key, and :meth:`commit` /
    :meth:`rollback` decide them through the decision record of the cluster (see
    :meth:`_decide_across`).
    """

    def __init__(
        self,
        producer: AsyncTransactionProducer,
        transaction_id: str,
        *,
        across_groups: bool = False,
        two_phase: bool = False,
    ) -> None:
        self.producer = producer
        self.transaction_id = transaction_id
        self.across_groups = across_groups
        #: Decided by an outside coordinator: its halves carry ``TXMQ_2PC``; see :meth:`prepare`.
        self.two_phase = two_phase
        #: The handle :meth:`prepare` returned (a two-phase transaction once prepared).
        self.handle: PreparedTransaction | None = None
        self.halves: list[SendResult] = []
        self.state: LocalTransactionState | None = None
        self._pending: list[_PendingHalf] = []
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: The broker group holding this transaction's halves: the first half's, chosen as a
        #: plain send would; the others follow it, so one decision covers them all.
        self.broker: str | None = None
        self._pinning: asyncio.Future[str | None] | None = None
        #: Consumer offsets committed with this transaction (:meth:`send_offsets`).
        self._offsets_consumer: AsyncOrderlyPushConsumer | None = None
        self._offsets_generation = 0
        self._offsets_client_id = ""
        #: per queue: its process queue, the committed offset it started from, the next offset
        self._offsets: dict[tuple[str, str, int], tuple[ProcessQueue, int, int]] = {}

    def send_offsets(self, consumer: AsyncOrderlyPushConsumer, msg: MessageExt) -> None:
        """Commit ``consumer``'s offset past ``msg`` with this transaction (Kafka's
        ``sendOffsetsToTransaction``): it moves if and only if the transaction commits.

        ``consumer`` is an orderly push consumer made with ``transactional_offsets=True``.
        At commit the broker refuses (and rolls back the whole transaction, raising
        :class:`~txmq.client.FencedError`) when the group rebalanced since the consumer took
        the queue, when the consumer left the group, or when the queue's committed offset is
        no longer the one this step started from.

        In a cluster the offsets go to the broker group holding the consumed queues.  A plain
        ``transaction()`` keeps everything in one group, so its outputs must be in that group
        too; with outputs in other groups use ``transaction(across_groups=True)``: the offsets
        and the outputs are decided together by one decision record in etcd, fenced there per
        queue (see docs/transactions.md).  The consumed queues of one transaction are in one
        broker group.

        Raises:
            FencedError: the consumer does not hold ``msg``'s queue (any more).
            ValueError: a two-phase transaction; another consumer than the transaction's;
                a queue in another broker group than the transaction's other consumed queues.
        """
        if self.state is not None:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} is already {self.state.value}"
            )
        if self.two_phase:
            raise ValueError(
                "consumer offsets cannot be committed in a two-phase transaction (its "
                "coordinator's decision does not check them); use transaction()"
            )
        if self._offsets_consumer is not None and self._offsets_consumer is not consumer:
            raise ValueError("one transaction commits the offsets of one consumer")
        pq, generation = consumer.transactional_position(msg)
        for other, _, _ in self._offsets.values():
            if other.broker != pq.broker:
                raise ValueError(
                    f"the consumed queues of one transaction are in one broker group: "
                    f"{msg.topic}:{msg.queue_id} is in {pq.broker}, {other.topic}:"
                    f"{other.queue_id} in {other.broker}; commit them in separate transactions"
                )
        self._offsets_client_id = consumer.client_id or ""
        if self._offsets_consumer is None:
            self._offsets_generation = generation
        else:
            self._offsets_generation = min(self._offsets_generation, generation)
        self._offsets_consumer = consumer
        key = (pq.topic, pq.broker, pq.queue_id)
        start = self._offsets[key][1] if key in self._offsets else pq.committed
        self._offsets[key] = (pq, -1 if start is None else start, msg.queue_offset + 1)

    async def send(
        self, msg: Message, *, queue_id: int | None = None, sharding_key: str | None = None
    ) -> SendResult:
        return await self._send(msg, None, queue_id=queue_id, sharding_key=sharding_key)

    async def _send(
        self,
        msg: Message,
        broker: str | None,
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
    ) -> SendResult:
        if self.state is not None:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} is already {self.state.value}"
            )
        if self.handle is not None:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} is prepared; no message can join it"
            )
        pending = _PendingHalf(
            msg, queue_id, sharding_key, asyncio.get_running_loop().create_future(), broker
        )
        self._pending.append(pending)
        if not self._flush_scheduled:
            # Sends started in this turn of the loop are sent together once it ends: the first
            # one waits for the next turn and sends them (its own half from this task when it
            # is alone, as ``await txn.send(m)`` is: no task, no extra turn).
            self._flush_scheduled = True
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                pending.result.cancel()
                self._flush()  # the others still go
                raise
            if len(self._pending) == 1 and not self.across_groups:
                self._flush_scheduled = False
                self._pending = []
                await self._send_group([pending])
            else:
                self._flush()
        result = await pending.result
        if result.status is not SendStatus.SEND_OK:
            raise TransactionFailedError(
                f"half message of transaction {self.transaction_id} not stored durably "
                f"({result.status.value})"
            )
        self.halves.append(result)
        return result

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        groups: dict[tuple[str, int | None, str | None], list[_PendingHalf]] = {}
        for p in pending:
            if not p.result.done():  # its sender was cancelled meanwhile
                groups.setdefault((p.msg.topic, p.queue_id, p.sharding_key), []).append(p)
        for group in groups.values():
            task = asyncio.get_running_loop().create_task(self._send_group(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _batchable(self, msg: Message) -> bool:
        over = self.producer.producer.config.compress_over
        return not (over and len(msg.payload) >= over)

    async def _pin(self, first: _PendingHalf) -> str | None:
        """The broker group of this transaction, chosen with its first half."""
        if self.across_groups:
            self.producer.require_cluster()
            return None  # each half goes where a plain send would
        if self._pinning is None:
            if self.producer.producer.connection.group_name is None:  # one broker: no choice
                return None
            self._pinning = asyncio.ensure_future(self._choose_broker(first))
        self.broker = await asyncio.shield(self._pinning)
        return self.broker

    async def _choose_broker(self, first: _PendingHalf) -> str | None:
        producer = self.producer.producer
        conn = producer.connection
        if conn.group_name is None:
            return None  # a single broker
        route = await producer._route_for(first.msg.topic)
        if not route.exists:
            return conn.group_name  # created on its first send, in the connected group
        mq = producer._select_queue(
            route, first.msg, first.queue_id, first.sharding_key, None, None, None
        )
        return mq.broker

    async def _send_group(self, group: list[_PendingHalf]) -> None:
        extra = {MessageConst.TRANSACTION_ID: self.transaction_id}
        if self.across_groups:
            # The transaction is a batch of one: its id is the key of its decision record.
            extra[MessageConst.TXMQ_BATCH_KEY] = self.transaction_id
        if self.two_phase:
            # The broker keeps it pending for its coordinator; checks go to the resolver.
            extra[MessageConst.TXMQ_2PC] = "1"
        first = group[0]
        try:
            broker = (
                first.broker
                if first.broker is not None and self.across_groups
                else await self._pin(first)
            )
        except (asyncio.CancelledError, Exception) as exc:
            _fail_halves(group, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if len(group) == 1:
            await self._send_one(first, extra, broker)
            return
        batch: list[_PendingHalf] = []
        single: list[_PendingHalf] = []
        for p in group:
            (batch if self._batchable(p.msg) else single).append(p)
        if len(batch) == 1:
            single, batch = [*single, *batch], []
        if batch:
            await self._send_batch(batch, extra, first.queue_id, first.sharding_key, broker)
        for p in single:
            await self._send_one(p, extra, broker)

    async def _send_one(self, p: _PendingHalf, extra: dict[str, str], broker: str | None) -> None:
        try:
            result = await self.producer._send_half(
                p.msg, extra, queue_id=p.queue_id, sharding_key=p.sharding_key, broker=broker
            )
        except asyncio.CancelledError:
            p.result.cancel()
            raise
        except Exception as exc:
            if not p.result.done():
                p.result.set_exception(exc)
            return
        if not p.result.done():
            p.result.set_result(result)

    async def _send_batch(
        self,
        batch: list[_PendingHalf],
        extra: dict[str, str],
        queue_id: int | None,
        sharding_key: str | None,
        broker: str | None,
    ) -> None:
        tx = self.producer
        props = {MessageConst.TRAN_MSG: "true", MessageConst.PGROUP: tx.group, **extra}
        try:
            result = await tx.producer.send_messages(
                [p.msg for p in batch],
                queue_id=queue_id,
                sharding_key=sharding_key,
                sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
                extra_properties=props,
                broker=broker,
            )
        except InvalidMessageError:
            # e.g. the halves together exceed the size limit: send them one by one
            for p in batch:
                await self._send_one(p, extra, broker)
            return
        except (asyncio.CancelledError, Exception) as exc:
            _fail_halves(batch, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        offset_ids = result.offset_msg_ids
        for i, p in enumerate(batch):
            if p.result.done():
                continue
            oid = offset_ids[i] if i < len(offset_ids) else ""
            p.result.set_result(
                SendResult(
                    status=result.status,
                    msg_id=result.msg_ids[i],
                    offset_msg_id=oid,
                    topic=result.topic,
                    queue_id=result.queue_id,
                    # the halves of one request are stored consecutively in one half queue
                    queue_offset=result.queue_offset + i,
                    transaction_id=result.transaction_id,
                    msg_ids=[result.msg_ids[i]],
                    offset_msg_ids=[oid] if oid else [],
                    broker_name=result.broker_name,
                )
            )

    async def commit(self) -> None:
        await self._decide(LocalTransactionState.COMMIT_MESSAGE, None)

    async def prepare(self) -> PreparedTransaction:
        """First phase of a two-phase transaction (``transaction(two_phase=True)``): its halves
        are stored durably (each :meth:`send` returned once its half was); the handle names
        them for :meth:`AsyncTransactionProducer.commit` / ``rollback`` from any process of the
        producer group.  No message can join it afterwards.  Preparing again returns the
        same handle.

        Raises:
            ValueError: not a two-phase transaction, or no message was sent in it.
            TransactionFailedError: it was decided already.
        """
        if not self.two_phase:
            raise ValueError("prepare() is for transaction(two_phase=True)")
        if self.handle is not None:
            return self.handle
        if self.state is not None:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} is already {self.state.value}"
            )
        if self._pending:
            raise ValueError("prepare() while sends of the transaction are still running")
        if not self.halves:
            raise ValueError(
                f"transaction {self.transaction_id} has no message to prepare (send one first)"
            )
        half = self.halves[0]
        _, offset = decode_offset_msg_id(half.offset_msg_id)
        in_cluster = self.producer.producer.connection.group_name is not None
        self.handle = PreparedTransaction(
            self.transaction_id,
            self.producer.group,
            # the broker group to decide it in; a single broker needs none
            half.broker_name if in_cluster else "",
            offset,
            half.queue_offset,
            half.msg_id,
        )
        log.info(
            "transaction_prepared", transaction_id=self.transaction_id, handle=str(self.handle)
        )
        return self.handle

    async def finish(self, exc: BaseException | None) -> None:
        """End of a ``transaction()`` block: commit after a clean exit; after an exception,
        roll back (a failed rollback is logged, the original exception wins).  A prepared
        two-phase transaction is left to its coordinator; one never prepared is rolled back
        (and, after a clean exit, :class:`TransactionFailedError` says so)."""
        if self.state is not None or self.handle is not None:
            return
        if self.two_phase and exc is None:
            if self.halves:
                await self.rollback("two-phase transaction block ended without prepare()")
            raise TransactionFailedError(
                f"two-phase transaction {self.transaction_id} ended without prepare(); "
                "it was rolled back"
            )
        if not (self.halves or self._offsets):
            return
        if exc is None:
            await self._decide(LocalTransactionState.COMMIT_MESSAGE, None)
            return
        try:
            await self.rollback(f"rolled back on {type(exc).__name__}: {exc}")
        except TxmqError as rb_exc:
            log.warning(
                "transaction_rollback_failed", transaction_id=self.transaction_id, error=str(rb_exc)
            )

    async def rollback(self, remark: str | None = None) -> None:
        await self._decide(LocalTransactionState.ROLLBACK_MESSAGE, remark)

    async def _decide(self, state: LocalTransactionState, remark: str | None) -> None:
        committing = state is LocalTransactionState.COMMIT_MESSAGE
        if committing and self._offsets:
            await self._send_offsets_half()
        if not self.halves:
            self.state = state
            return
        if self.across_groups:
            await self._decide_across(state)
            return
        await self.producer.end_transaction(
            self.halves[0], state, remark, transaction_id=self.transaction_id
        )
        self.state = state
        if committing:
            self._offsets_committed()

    def _offsets_committed(self) -> None:
        for pq, start, offset in self._offsets.values():
            if pq.committed == start or pq.committed is None:
                pq.committed = offset

    @property
    def groups(self) -> list[str]:
        """The broker groups holding this transaction's halves, in the order of their first
        half."""
        return list(dict.fromkeys(h.broker_name for h in self.halves))

    async def _decide_across(self, state: LocalTransactionState) -> None:
        """Decide a transaction across broker groups.

        1. The first group holding a half is asked (TXMQ_DECIDE_BATCH, the transaction id as
           batch key): its leader records the decision in etcd, create-if-absent, which is the
           commit point (the first decision recorded wins, whoever made it: this call or a
           check-back answer), and applies it to its halves.
        2. Every other group holding halves is asked in turn; each leader also applies a
           recorded decision by itself (from its watch of etcd, and a new leader after a
           failover), so a group not reached here still gets it.

        Each request is repeated through a group's leader change for up to the producer's
        ``decision_timeout`` (a repeat returns the decision in force).

        Raises:
            TransactionInDoubtError: the first group could not be reached: the decision may or
                may not be recorded.
            TransactionFailedError: another decision was recorded first (e.g. a check-back
                answer rolled the transaction back): it holds in every group.
        """
        tx = self.producer
        want = state is LocalTransactionState.COMMIT_MESSAGE
        groups = self.groups
        offsets_group = self._offsets_group()
        if offsets_group in groups:
            # The group holding the consumed queues records the decision: it fences their
            # offsets in the same etcd transaction.
            groups.remove(offsets_group)
            groups.insert(0, offsets_group)
        deadline = time.monotonic() + tx.decision_timeout
        await _pause_point("commit-point")
        fenced: str | None = None
        try:
            committed, fenced = await self._decide_in(
                groups[0], want, deadline, offsets=offsets_group == groups[0]
            )
        except TxmqError as exc:
            raise TransactionInDoubtError(
                f"the {'commit' if want else 'rollback'} of transaction {self.transaction_id} "
                f"(halves in broker groups {', '.join(groups)}) is in doubt: broker group "
                f"{groups[0]} did not confirm it ({exc}). If the decision was recorded, every "
                "group's leader applies it by itself; if not, the groups ask producer group "
                f"{tx.group} (check-back) and its first answer is recorded and applied in every "
                "group"
            ) from exc
        self.state = (
            LocalTransactionState.COMMIT_MESSAGE
            if committed
            else LocalTransactionState.ROLLBACK_MESSAGE
        )
        await _pause_point("after-commit-point")
        for group in groups[1:]:
            await _pause_point(f"group:{group}")
            try:
                await self._decide_in(group, committed, max(deadline, time.monotonic() + 1.0))
            except TxmqError as exc:
                # Recorded already: the group's leader applies it from the record by itself.
                log.warning(
                    "transaction_group_unconfirmed",
                    transaction_id=self.transaction_id,
                    group=group,
                    decided="COMMIT" if committed else "ROLLBACK",
                    error=str(exc),
                )
        if committed and self._offsets:
            self._offsets_committed()
        if fenced is not None and not committed:
            raise FencedError(
                f"fenced: {fenced}; transaction {self.transaction_id} was rolled back in every "
                "broker group"
            )
        if committed != want:
            raise TransactionFailedError(
                f"transaction {self.transaction_id} was "
                f"{'committed' if committed else 'rolled back'} before this "
                f"{'commit' if want else 'rollback'} (an earlier decision, e.g. a check-back "
                "answer, was recorded first); that outcome holds in every broker group"
            )

    async def _decide_in(
        self, group: str, commit: bool, deadline: float, *, offsets: bool = False
    ) -> tuple[bool, str | None]:
        """Ask broker group ``group`` to take the decision, again (through its leader's
        changes) until ``deadline``; the decision in force there, and why it fenced the
        consumer offsets if that rolled the transaction back."""
        tx = self.producer
        wait = 0.2
        while True:
            remaining = deadline - time.monotonic()
            try:
                conn = await tx.producer.connection_for_group(group)
                timeout = max(min(tx.producer.config.request_timeout, remaining), 0.5)
                return await tx._decide_across_answer(
                    conn, self.transaction_id, commit, timeout, offsets
                )
            except TxmqError as exc:
                # A repeat is harmless (the first decision recorded wins): repeat what may
                # pass later (no leader, a leader change, etcd not reached), until the deadline.
                again = exc.retriable or isinstance(exc, BrokerSystemError)
                if not again or time.monotonic() + wait >= deadline:
                    raise
                log.info(
                    "transaction_decision_retried",
                    transaction_id=self.transaction_id,
                    group=group,
                    error=str(exc),
                )
            await asyncio.sleep(wait)
            wait = min(wait * 2, 1.0)

    def _offsets_group(self) -> str | None:
        """The broker group holding the consumed queues of :meth:`send_offsets` (the queues'
        ``brokerName``; None without offsets)."""
        for pq, _, _ in self._offsets.values():
            return pq.broker or None
        return None

    async def _send_offsets_half(self) -> None:
        consumer = self._offsets_consumer
        assert consumer is not None
        where = self._offsets_group()
        doc = TxnOffsets(
            group=consumer.group,
            generation=self._offsets_generation,
            client_id=self._offsets_client_id,
            offsets=tuple(
                QueueOffset(pq.topic, pq.broker, pq.queue_id, offset, start)
                for pq, start, offset in self._offsets.values()
            ),
        )
        try:
            in_cluster = self.producer.producer.connection.group_name is not None
            if not self.across_groups and not in_cluster:
                where = None  # a single broker: no choice
            if where is not None and not self.across_groups:
                if self._pinning is None:  # nothing sent yet: the offsets choose the group
                    self._pinning = asyncio.get_running_loop().create_future()
                    self._pinning.set_result(where)
                elif self.broker is not None and self.broker != where:
                    raise ValueError(
                        f"transaction {self.transaction_id} consumed queues of broker group "
                        f"{where} and wrote to broker group {self.broker}: a plain "
                        "transaction() stays in one group; use "
                        "transaction(across_groups=True) to commit the offsets and the "
                        "outputs together across groups"
                    )
            conn = self.producer.producer.connection
            if (
                where is not None
                and conn.group_name not in (None, where)
                and where not in conn.group_addresses
            ):
                await self.producer._cluster_groups()  # no route named the group to this producer
            # the offsets topic has one queue
            await self._send(Message(TXN_OFFSETS_TOPIC, doc.encode()), where, queue_id=0)
        except BaseException as exc:
            if self.halves:
                await self.finish(exc)
            raise


# --- the sync facade --------------------------------------------------------------------------


class TransactionProducer(_SyncClient):
    """The blocking transactional producer; see :class:`AsyncTransactionProducer`.

    Example::

        with TransactionProducer("order-tx", OrderListener(), broker="127.0.0.1:10911") as p:
            r = p.send_message_in_transaction(Message("orders", b"..."), arg=order)
    """

    def __init__(
        self, group: str, listener: TransactionListener, broker: str = DEFAULT_BROKER, **kwargs: Any
    ) -> None:
        super().__init__()
        self._core = self.core = AsyncTransactionProducer(group, listener, broker, **kwargs)

    send_message_in_transaction = blocking(AsyncTransactionProducer.send_message_in_transaction)
    commit = blocking(AsyncTransactionProducer.commit)
    rollback = blocking(AsyncTransactionProducer.rollback)
    recover = blocking(AsyncTransactionProducer.recover)

    def set_prepared_resolver(self, resolver: PreparedResolver | None) -> None:
        """:meth:`AsyncTransactionProducer.set_prepared_resolver`."""
        self.core.set_prepared_resolver(resolver)

    @contextmanager
    def transaction(
        self,
        transaction_id: str | None = None,
        *,
        across_groups: bool = False,
        two_phase: bool = False,
    ) -> Iterator[Transaction]:
        """The blocking form of :meth:`AsyncTransactionProducer.transaction`."""
        if two_phase and across_groups:
            self.core.transaction(across_groups=True, two_phase=True)  # raises ValueError
        if across_groups:
            self.core.require_cluster()
        core = AsyncTransaction(
            self.core,
            transaction_id or new_uniq_id(),
            across_groups=across_groups,
            two_phase=two_phase,
        )
        txn = Transaction(self, core)
        try:
            yield txn
        except BaseException as exc:
            self._run(txn.core.finish(exc))
            raise
        else:
            self._run(txn.core.finish(None))


class Transaction:
    def __init__(self, producer: TransactionProducer, core: AsyncTransaction) -> None:
        self.producer = producer
        self.core = core

    @property
    def transaction_id(self) -> str:
        return self.core.transaction_id

    def send(self, msg: Message, **kwargs: Any) -> SendResult:
        return self.producer._run(self.core.send(msg, **kwargs))

    def prepare(self) -> PreparedTransaction:
        """:meth:`AsyncTransaction.prepare`."""
        return self.producer._run(self.core.prepare())

    def send_offsets(self, consumer: Any, msg: MessageExt) -> None:
        """:meth:`AsyncTransaction.send_offsets`; ``consumer`` is an
        :class:`~txmq.client.OrderlyPushConsumer` (or its async core)."""
        self.core.send_offsets(getattr(consumer, "core", consumer), msg)

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
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import TransactionFailedError, TxmqError, error_for_code
from txmq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    DecideBatchRequestHeader,
    EndTransactionRequestHeader,
    ListTransactionsRequestHeader,
)
from txmq.protocol.message import Message, MessageConst, MessageExt, MessageSysFlag, decode_message

from . import telemetry
from ._txn_common import (
    _END_TRANSACTION,
    _WIRE_VALUES,
    DEFAULT_CHECK_QUEUE_SIZE,
    DEFAULT_CHECK_THREADS,
    DEFAULT_DECISION_TIMEOUT,
    CrossGroupUnavailableError,
    LocalTransactionState,
    TransactionListener,
    TransactionSendResult,
    _ask,
    end_transaction_fields,
)
from ._txn_object import AsyncTransaction, _TransactionBlock, new_transaction
from .config import DEFAULT_BROKER, ClientConfig
from .lifecycle import AsyncClient
from .logs import get_logger
from .producer import AsyncProducer, SendResult, SendStatus
from .remoting import BrokerConnection, current_connection
from .sync import _SyncClient, blocking
from .two_phase import PreparedResolver, PreparedTransaction, PreparedTransactionUnknownError

log = get_logger(__name__)


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
        state, remark = await _ask(
            self.listener.execute_local_transaction,
            msg,
            arg,
            name="executeLocalTransactionBranch",
            event="local_transaction_failed",
            transaction_id=txid,
        )
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
                state, remark = await _ask(
                    self.listener.check_local_transaction,
                    msg,
                    name="checkLocalTransaction",
                    event="check_listener_failed",
                    transaction_id=header.transaction_id,
                )
                txid = header.transaction_id or msg.transaction_id or ""
                if txid and msg.properties.get(MessageConst.TXMQ_BATCH_KEY) == txid:
                    await self._answer_check_across(txid, state, conn)
                    return
                await self._answer_check(
                    header, state, header.transaction_id or msg.transaction_id, remark, conn
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
        resolver = self.prepared_resolver
        remark: str | None
        if resolver is None:
            state = LocalTransactionState.UNKNOW
            remark = "no prepared resolver in this producer"
            log.warning(
                "prepared_check_without_resolver",
                transaction_id=handle.transaction_id,
                action="answered UNKNOW; set_prepared_resolver() lets the coordinator decide",
            )
        else:
            state, remark = await _ask(
                resolver,
                handle,
                name="prepared resolver",
                event="prepared_resolver_failed",
                transaction_id=handle.transaction_id,
            )
        await self._answer_check(header, state, handle.transaction_id, remark, conn)

    async def _answer_check(
        self,
        header: CheckTransactionStateRequestHeader,
        state: LocalTransactionState,
        transaction_id: str | None,
        remark: str | None,
        conn: BrokerConnection,
    ) -> None:
        """Answer the check ``header`` with END_TRANSACTION ``state`` (from a check)."""
        end = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset,
            commit_or_rollback=state.wire_value,
            from_transaction_check=True,
            msg_id=header.msg_id,
            transaction_id=transaction_id,
        )
        try:
            await self._end(end, remark, conn)
            self.checks_answered += 1
        except TxmqError as exc:
            # the broker checks again next round if this did not land
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
        txn = Transaction(
            self, new_transaction(self.core, transaction_id, across_groups, two_phase)
        )
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


__all__ = [
    "DEFAULT_CHECK_QUEUE_SIZE",
    "DEFAULT_CHECK_THREADS",
    "DEFAULT_DECISION_TIMEOUT",
    "AsyncTransaction",
    "AsyncTransactionProducer",
    "CrossGroupUnavailableError",
    "LocalTransactionState",
    "Transaction",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "end_transaction_fields",
]

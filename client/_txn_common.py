"""The parts of a transactional producer its other modules share: the local transaction's
states and listener, the errors, the END_TRANSACTION fields, and the test seam that pauses a
transaction across broker groups (see :mod:`txmq.client.transaction`)."""

from __future__ import annotations

import asyncio
import enum
import inspect
import os
import time
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from txmq.protocol.codes import RequestCode
from txmq.protocol.errors import TxmqError
from txmq.protocol.message import Message, MessageExt, MessageSysFlag, decode_offset_msg_id

from .logs import get_logger
from .producer import (
    SendResult,
    SendStatus,  # noqa: F401 - the API docs resolve the inherited fields of TransactionSendResult here
)

# The transaction module's logger: an application's settings for it cover these events too.
log = get_logger("txmq.client.transaction")

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


async def _ask(
    fn: Any, *args: Any, name: str, event: str, transaction_id: str | None
) -> tuple[LocalTransactionState, str | None]:
    """``fn(*args)``'s answer as a state (no remark); UNKNOW when ``fn`` raised, with the
    END_TRANSACTION remark naming ``fn`` (as ``name``) and its exception, logged as ``event``."""
    try:
        return _as_state(await _call(fn, *args)), None
    except Exception as exc:
        log.warning(event, transaction_id=transaction_id, error=repr(exc))
        return LocalTransactionState.UNKNOW, f"{name} exception: {type(exc).__name__}: {exc}"

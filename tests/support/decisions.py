"""What transaction tests share: the local transaction states a listener answers with, by their
initials, and the wall clock in epoch ms."""

from __future__ import annotations

import time

from txmq.client.transaction import LocalTransactionState

C, R, U = (
    LocalTransactionState.COMMIT_MESSAGE,
    LocalTransactionState.ROLLBACK_MESSAGE,
    LocalTransactionState.UNKNOWN,
)


def now_ms() -> int:
    return int(time.time() * 1000)

"""Transaction listeners tests share: a producer whose local transactions stay undecided, so
that the broker's check-back decides them."""

from __future__ import annotations

from typing import Any

from txmq.client import LocalTransactionState, Message, MessageExt, TransactionListener


class CheckBack(TransactionListener):
    """Leaves every local transaction unknown, and answers each check-back with ``answer``
    (commit unless told); keeps the messages checked, in order."""

    def __init__(
        self, answer: LocalTransactionState = LocalTransactionState.COMMIT_MESSAGE
    ) -> None:
        self.answer = answer
        self.checked: list[MessageExt] = []

    @property
    def checks(self) -> int:
        """How many check-backs were answered."""
        return len(self.checked)

    @property
    def bodies(self) -> list[str]:
        """The checked messages' bodies, as text."""
        return [m.body.decode() for m in self.checked]

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(message)
        return self.answer

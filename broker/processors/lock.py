"""LOCK_BATCH_MQ and UNLOCK_BATCH_MQ: orderly consumers lock the queues they consume."""

from __future__ import annotations

from dataclasses import dataclass

from txmq.protocol.aio import Connection
from txmq.protocol.command import RemotingCommand
from txmq.protocol.locks import LockBatchRequest, encode_lock_response

from ..messaging.locks import QueueLockTable


@dataclass(eq=False)
class LockProcessor:
    locks: QueueLockTable

    async def lock_batch_mq(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Lock or renew the queues of the body for its client; the answer lists those the
        client holds now (a queue locked by another live client is left out)."""
        req = LockBatchRequest.decode(cmd.body, "LOCK_BATCH_MQ")
        granted = self.locks.try_lock_batch(req.consumer_group, req.mq_set, req.client_id, conn)
        return cmd.response(body=encode_lock_response(granted))

    async def unlock_batch_mq(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Free those queues of the body that its client holds (others' locks stay)."""
        req = LockBatchRequest.decode(cmd.body, "UNLOCK_BATCH_MQ")
        self.locks.unlock_batch(req.consumer_group, req.mq_set, req.client_id)
        return cmd.response()

"""A thin client over the wire protocol for broker tests that must not depend on the SDK."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from txmq.protocol.acl import Credentials
from txmq.protocol.aio import Connection, Handler, open_connection
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.frame import encode_frame
from txmq.protocol.headers import (
    EndTransactionRequestHeader,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from txmq.protocol.message import (
    MessageConst,
    MessageExt,
    UniqIdGenerator,
    decode_messages,
    properties_to_string,
)

_ids = UniqIdGenerator()


class RawClient:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.client_id = f"raw@{os.getpid()}#{id(self)}"

    @classmethod
    async def connect(
        cls,
        address: str,
        handler: Handler | None = None,
        *,
        credentials: Credentials | None = None,
    ) -> RawClient:
        """Connect; with ``credentials`` every request is signed (the broker's ACL)."""
        host, _, port = address.rpartition(":")
        signer = credentials.sign if credentials is not None else None
        return cls(await open_connection(host, int(port), handler, signer=signer))

    async def close(self) -> None:
        self.conn.close()
        await self.conn.wait_closed()

    async def call(
        self,
        code: int,
        ext: dict[str, Any] | None = None,
        body: bytes = b"",
        st: SerializeType = SerializeType.MSGPACK,
        timeout: float = 5.0,
        remark: str | None = None,
    ) -> RemotingCommand:
        cmd = RemotingCommand.request(code, ext, body, serialize_type=st)
        cmd.remark = remark
        return await self.conn.request(cmd, timeout)

    async def heartbeat(
        self,
        producer_groups: Sequence[str] = (),
        consumer_groups: dict[str, dict[str, str]] | None = None,
        expression_type: str | None = None,
    ) -> None:
        """HEART_BEAT registering the producer groups and the consumer groups' subscriptions
        (group -> topic -> expression; ``expression_type``: ``SQL92`` or ``TAG`` on each,
        none given when None)."""
        kind = {} if expression_type is None else {"expressionType": expression_type}
        data = {
            "clientID": self.client_id,
            "producerDataSet": [{"groupName": g} for g in producer_groups],
            "consumerDataSet": [
                {
                    "groupName": g,
                    "subscriptionDataSet": [
                        {"topic": t, "subString": e, **kind} for t, e in subs.items()
                    ],
                }
                for g, subs in (consumer_groups or {}).items()
            ],
        }
        resp = await self.call(RequestCode.HEART_BEAT, body=json.dumps(data).encode())
        assert resp.code == ResponseCode.SUCCESS, resp.remark

    async def create_topic(self, topic: str, queues: int) -> None:
        """UPDATE_AND_CREATE_TOPIC: ``topic`` with ``queues`` read and write queues, readable and
        writable, as an operator tool creates it; fails the test unless the broker agrees."""
        resp = await self.call(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6},
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark

    async def check_client_config(
        self, group: str, topic: str, expression: str, kind: str = "SQL92"
    ) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG: whether the broker takes this client's subscription of ``group``
        to ``topic`` with ``expression`` (``kind``: SQL92 or TAG); the broker's answer."""
        body = {
            "clientId": self.client_id,
            "group": group,
            "subscriptionData": {"topic": topic, "subString": expression, "expressionType": kind},
        }
        return await self.call(RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode())

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        group: str = "raw-producer",
        props: dict[str, str] | None = None,
        queue_id: int = 0,
        transactional: bool = False,
        v2: bool = True,
        st: SerializeType = SerializeType.MSGPACK,
    ) -> RemotingCommand:
        p = {MessageConst.UNIQ_KEY: _ids.next_id(), **(props or {})}
        sys_flag = 0
        if transactional:
            p[MessageConst.TRAN_MSG] = "true"
            p[MessageConst.PGROUP] = group
            sys_flag = 0x4
        h = SendMessageRequestHeader(
            producer_group=group,
            topic=topic,
            queue_id=queue_id,
            sys_flag=sys_flag,
            born_timestamp=int(time.time() * 1000),
            properties=properties_to_string(p),
        )
        if v2:
            return await self.call(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext_fields(), body, st)
        return await self.call(RequestCode.SEND_MESSAGE, h.to_ext_fields(), body, st)

    @staticmethod
    def send_header(resp: RemotingCommand) -> SendMessageResponseHeader:
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        return SendMessageResponseHeader.from_ext_fields(resp.ext_fields)

    async def pull(
        self,
        topic: str,
        queue_id: int = 0,
        offset: int = 0,
        *,
        group: str = "raw-consumer",
        expression: str = "*",
        max_nums: int = 32,
        suspend_ms: int = 0,
    ) -> tuple[RemotingCommand, list[MessageExt]]:
        h = PullMessageRequestHeader(
            consumer_group=group,
            topic=topic,
            queue_id=queue_id,
            queue_offset=offset,
            max_msg_nums=max_nums,
            sys_flag=0x4 | (0x2 if suspend_ms else 0),
            suspend_timeout_millis=suspend_ms,
            subscription=expression,
        )
        resp = await self.call(
            RequestCode.PULL_MESSAGE, h.to_ext_fields(), timeout=5.0 + suspend_ms / 1000
        )
        msgs = decode_messages(resp.body) if resp.code == ResponseCode.SUCCESS else []
        return resp, msgs

    async def pull_all(self, topic: str, queues: int = 4, **kw: Any) -> list[MessageExt]:
        out: list[MessageExt] = []
        for q in range(queues):
            offset = 0
            while True:
                resp, msgs = await self.pull(topic, q, offset, **kw)
                if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                    return out
                if not msgs:
                    break
                out.extend(msgs)
                offset = int(resp.ext_fields["nextBeginOffset"])
        return out

    async def end_transaction(
        self,
        group: str,
        send_resp: RemotingCommand,
        decision: int,
        *,
        from_check: bool = False,
        txid: str | None = None,
        **overrides: Any,
    ) -> RemotingCommand:
        """END_TRANSACTION for the half ``send_resp`` answered (``overrides``: header fields
        set to other values)."""
        eh = end_header(group, send_resp, decision, from_check=from_check, txid=txid)
        for k, v in overrides.items():
            setattr(eh, k, v)
        return await self.call(RequestCode.END_TRANSACTION, eh.to_ext_fields())

    async def end_transaction_oneway(
        self, group: str, send_resp: RemotingCommand, decision: int, *, from_check: bool = False
    ) -> None:
        """:meth:`end_transaction` sent oneway, as RocketMQ's producers send it."""
        eh = end_header(group, send_resp, decision, from_check=from_check)
        self.conn.send_oneway(
            RemotingCommand.request(RequestCode.END_TRANSACTION, eh.to_ext_fields())
        )


def end_header(
    group: str,
    send_resp: RemotingCommand,
    decision: int,
    *,
    from_check: bool = False,
    txid: str | None = None,
) -> EndTransactionRequestHeader:
    """The END_TRANSACTION header of ``group``'s producer for the half ``send_resp`` answered
    (``decision``: 8 commit, 12 roll back, 0 unknown)."""
    from txmq.protocol.message import decode_offset_msg_id

    h = RawClient.send_header(send_resp)
    _, offset = decode_offset_msg_id(h.msg_id)
    return EndTransactionRequestHeader(
        producer_group=group,
        tran_state_table_offset=h.queue_offset,
        commit_log_offset=offset,
        commit_or_rollback=decision,
        from_transaction_check=from_check,
        msg_id=h.msg_id,
        transaction_id=txid or h.transaction_id,
    )


async def unread_pulls(c: RawClient, topic: str, count: int = 200) -> bytes:
    """What a client that never reads its socket sends: 64 messages of 4 KB stored in queue 0
    of ``topic`` (through ``c``), then ``count`` PULL_MESSAGE frames for them back to back,
    each answered with about 128 KiB."""
    for i in range(64):
        assert (await c.send(topic, bytes(4000) + str(i).encode(), queue_id=0)).code == 0
    pull = PullMessageRequestHeader(
        consumer_group="g",
        topic=topic,
        queue_id=0,
        queue_offset=0,
        max_msg_nums=32,
        sys_flag=0x4,
        subscription="*",
    )
    frame = encode_frame(RemotingCommand.request(RequestCode.PULL_MESSAGE, pull.to_ext_fields()))
    return frame * count


def long_poll(group: str, topic: str, queue_id: int = 0) -> RemotingCommand:
    """A PULL_MESSAGE from offset 0 that the broker parks up to 60 s while nothing comes."""
    h = PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        queue_offset=0,
        max_msg_nums=1,
        sys_flag=0x4 | 0x2,
        suspend_timeout_millis=60_000,
        subscription="*",
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, h.to_ext_fields())


@contextlib.asynccontextmanager
async def connected(
    address: str, handler: Handler | None = None, *, credentials: Credentials | None = None
) -> AsyncIterator[RawClient]:
    """:meth:`RawClient.connect` for a block: the client is closed when it ends."""
    c = await RawClient.connect(address, handler, credentials=credentials)
    try:
        yield c
    finally:
        await c.close()

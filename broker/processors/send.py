"""SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK: the remoting
headers translated to and from the messaging core (:class:`~txmq.broker.messaging.MessagingCore`)."""

from __future__ import annotations

from txmq.protocol.aio import Connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    InvalidParameterError,
    MessageIllegalError,
    ProtocolError,
    QueryNotFoundError,
)
from txmq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    SendMessageRequestHeader,
)
from txmq.protocol.message import MessageExt, MessageSysFlag, string_to_properties

from ..acl import CONTEXT_KEY as ACL_KEY
from ..acl import code_name
from ..messaging.admission import Caller
from ..messaging.core import MessagingCore, SendOutcome
from ..quota import CONTEXT_KEY as QUOTA_KEY

#: A half's sys flag: its send needs PUB on the producer group too.
_PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE


class SendMessageProcessor:
    def __init__(self, core: MessagingCore) -> None:
        self.core = core

    @staticmethod
    def _header(cmd: RemotingCommand) -> SendMessageRequestHeader:
        if cmd.code == RequestCode.SEND_MESSAGE_V2 or (
            cmd.code == RequestCode.SEND_BATCH_MESSAGE and "b" in cmd.ext_fields
        ):
            return SendMessageRequestHeader.from_v2_ext_fields(cmd.ext_fields)
        return SendMessageRequestHeader.from_ext_fields(cmd.ext_fields)

    @staticmethod
    def _caller(conn: Connection, cmd: RemotingCommand) -> Caller:
        """Who sends, as the dispatch authenticated it (see :mod:`..messaging.admission`)."""
        context = conn.context
        ak, qk = context.get(ACL_KEY), context.get(QUOTA_KEY)
        host, port = conn.peer
        return Caller(
            ak if isinstance(ak, str) else None,
            qk if isinstance(qk, str) else None,
            f"request code {code_name(cmd.code)}",
            {"peer": f"{host}:{port}", "code": cmd.code},
            len(cmd.body),
        )

    async def _admit(self, caller: Caller | None, h: SendMessageRequestHeader) -> None:
        """Admit a send read from its header, before its topic is looked up."""
        if caller is not None:
            group = h.producer_group if h.sys_flag & _PREPARED else ""
            await self.core.admit(caller, [h.topic], group)

    @staticmethod
    def _answer(cmd: RemotingCommand, outcome: SendOutcome) -> RemotingCommand:
        """One answer for a request's receipts (a batch: its message ids joined by commas, the
        first message's queue offset)."""
        msg_ids, queue_id, queue_offset, txid = outcome.answer()
        # SendMessageResponseHeader's fields, in its order, made here (no header object).
        ext: dict[str, object] = {
            "msgId": msg_ids,
            "queueId": queue_id,
            "queueOffset": queue_offset,
        }
        if txid is not None:
            ext["transactionId"] = txid
        if outcome.batch is None and cmd.code != RequestCode.SEND_BATCH_MESSAGE:
            receipts = outcome.receipts
            if len(receipts) == 1 and receipts[0].recall_handle:
                ext["recallHandle"] = receipts[0].recall_handle  # a timer message's
        if outcome.flush_error is not None:
            return cmd.response(ResponseCode.FLUSH_DISK_TIMEOUT, str(outcome.flush_error), ext)
        return cmd.response(ResponseCode.SUCCESS, None, ext)

    async def send_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        core = self.core
        caller = self._caller(conn, cmd) if core.admission is not None else None
        # The send use case as the request came: a direct path stores it when one can (the
        # same record and answer as below); else the header is translated for the generic one.
        outcome = await core.send_direct(
            cmd.code == RequestCode.SEND_MESSAGE_V2, cmd.ext_fields, cmd.body, conn.peer, caller
        )
        if outcome is not None:
            return self._answer(cmd, outcome)
        h = self._header(cmd)
        if h.batch:
            return await self.send_batch(conn, cmd, h, caller)
        await self._admit(caller, h)
        core.check_body(cmd.body)
        tc = await core.topic_for_send(h.topic, h.default_topic_queue_nums)
        try:
            props = string_to_properties(h.properties)
        except ProtocolError as exc:
            raise MessageIllegalError(f"bad properties: {exc}") from None
        msg = MessageExt(
            topic=h.topic,
            body=cmd.body,
            queue_id=core.queue_id(h.queue_id, tc.write_queue_nums, h.topic),
            flag=h.flag,
            sys_flag=h.sys_flag,
            born_timestamp=h.born_timestamp,
            born_host=conn.peer,
            reconsume_times=h.reconsume_times or 0,
            properties=props,
        )
        return self._answer(cmd, await core.send([msg], h.producer_group, caller))

    async def send_batch(
        self,
        conn: Connection,
        cmd: RemotingCommand,
        h: SendMessageRequestHeader | None = None,
        caller: Caller | None = None,
    ) -> RemotingCommand:
        core = self.core
        if h is None:
            h = self._header(cmd)
            caller = self._caller(conn, cmd) if core.admission is not None else None
        await self._admit(caller, h)
        tc = await core.topic_for_send(h.topic, h.default_topic_queue_nums)
        qid = core.queue_id(h.queue_id, tc.write_queue_nums, h.topic)
        return self._answer(cmd, await core.send_batch(h, qid, cmd.body, conn.peer, caller))

    async def recall_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """RECALL_MESSAGE (RocketMQ 5.3's ``RecallMessageRequestHeader``: ``producerGroup``,
        ``topic``, ``recallHandle``): the pending timer message the handle names is never
        delivered; answered with its ``msgId`` once the recall is durable."""
        ext = cmd.ext_fields
        topic, handle = ext.get("topic"), ext.get("recallHandle")
        if not topic or not handle:
            raise InvalidParameterError("RECALL_MESSAGE needs the topic and recallHandle fields")
        msg_id = await self.core.recall(str(topic), str(handle))
        return cmd.response(ResponseCode.SUCCESS, None, {"msgId": msg_id})

    async def consumer_send_msg_back(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """A consumer could not process a message: re-deliver it later through
        ``%RETRY%<group>`` with growing delays, or park it in ``%DLQ%<group>``."""
        h = ConsumerSendMsgBackRequestHeader.from_ext_fields(cmd.ext_fields)
        try:
            orig = self.core.ctx.store.lookup_message(h.offset)
        except (QueryNotFoundError, KeyError):
            raise QueryNotFoundError(f"look message by offset failed, {h.offset}") from None
        await self.core.send_back(
            h.group,
            orig,
            delay_level=h.delay_level,
            max_reconsume_times=h.max_reconsume_times
            if h.max_reconsume_times is not None
            else self.core.ctx.groups.effective(h.group).retry_max_times,
            origin_msg_id=h.origin_msg_id,
        )
        return cmd.response()

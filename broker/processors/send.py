"""SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import structlog

from txmq.protocol.aio import Connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    FlushDiskTimeoutError,
    MessageIllegalError,
    ProtocolError,
    QueryNotFoundError,
)
from txmq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from txmq.protocol.message import (
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_batch,
    string_to_properties,
)

from ..store import PutMessageResult
from ..topics import SCHEDULE_TOPIC, dlq_topic, retry_topic
from .plain_batch import plain_batch_records

if TYPE_CHECKING:
    from ..server import BrokerController

log = structlog.get_logger(__name__)


class SendMessageProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    # -- helpers --------------------------------------------------------------------------------

    def _header(self, cmd: RemotingCommand) -> SendMessageRequestHeader:
        if cmd.code == RequestCode.SEND_MESSAGE_V2 or (
            cmd.code == RequestCode.SEND_BATCH_MESSAGE and "b" in cmd.ext_fields
        ):
            return SendMessageRequestHeader.from_v2_ext_fields(cmd.ext_fields)
        return SendMessageRequestHeader.from_ext_fields(cmd.ext_fields)

    def _check_body(self, body: bytes) -> None:
        limit = self.broker.config.max_message_size
        if len(body) > limit:
            raise MessageIllegalError(
                f"message body size {len(body)} exceeds the limit of {limit} bytes (maxMessageSize)"
            )

    def _queue_id(self, requested: int, write_queues: int, topic: str) -> int:
        if requested < 0:
            return random.randrange(write_queues)
        if requested >= write_queues:
            raise MessageIllegalError(
                f"request queueId[{requested}] is illegal, topic {topic} has {write_queues} "
                "write queues"
            )
        return requested

    def delay_to_schedule(self, msg: MessageExt) -> None:
        """Route a message with a DELAY level to the schedule topic (RocketMQ's scheme)."""
        level_s = msg.properties.get(MessageConst.DELAY)
        if not level_s:
            return
        try:
            level = int(level_s)
        except ValueError:
            raise MessageIllegalError(f"DELAY property {level_s!r} is not a level number") from None
        if level <= 0:
            msg.properties.pop(MessageConst.DELAY, None)
            return
        level = min(level, len(self.broker.delay_levels))
        msg.properties[MessageConst.DELAY] = str(level)
        msg.properties[MessageConst.REAL_TOPIC] = msg.topic
        msg.properties[MessageConst.REAL_QID] = str(msg.queue_id)
        msg.topic = SCHEDULE_TOPIC
        msg.queue_id = level - 1

    async def _store(self, msg: MessageExt) -> PutMessageResult:
        result = self.broker.put_message(msg)
        await self.broker.flush.wait_durable(result.end_offset)
        return result

    # -- SEND_MESSAGE / V2 ----------------------------------------------------------------------

    async def send_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = self._header(cmd)
        if h.batch:
            return await self.send_batch(conn, cmd, h)
        self._check_body(cmd.body)
        tc = self.broker.topics.for_send(h.topic, h.default_topic_queue_nums)
        if self.broker.topics.table.dirty:  # this send created the topic: make that durable
            await self.broker.persist_topics()
        try:
            props = string_to_properties(h.properties)
        except ProtocolError as exc:
            raise MessageIllegalError(f"bad properties: {exc}") from None
        msg = MessageExt(
            topic=h.topic,
            body=cmd.body,
            queue_id=self._queue_id(h.queue_id, tc.write_queue_nums, h.topic),
            flag=h.flag,
            sys_flag=h.sys_flag,
            born_timestamp=h.born_timestamp,
            born_host=conn.peer,
            reconsume_times=h.reconsume_times or 0,
            properties=props,
        )
        tx = self.broker.transactions
        if props.get(MessageConst.TRAN_MSG, "").lower() == "true":
            tx.prepare_half(msg, h.producer_group)  # may raise NoPermissionError
        else:
            if (
                MessageSysFlag.transaction_value(msg.sys_flag)
                != MessageSysFlag.TRANSACTION_NOT_TYPE
            ):
                raise MessageIllegalError("sysFlag marks a transaction but TRAN_MSG is not set")
            self.delay_to_schedule(msg)
        result = self.broker.put_message(msg)
        if msg.topic == tx.half_topic:
            tx.on_half_stored(msg, result)
        resp_header = SendMessageResponseHeader(
            msg_id=result.offset_msg_id,
            queue_id=int(msg.properties.get(MessageConst.REAL_QID, msg.queue_id))
            if msg.topic in (tx.half_topic, SCHEDULE_TOPIC)
            else msg.queue_id,
            queue_offset=result.queue_offset,
            transaction_id=tx.transaction_id_of(props) if msg.topic == tx.half_topic else None,
        )
        try:
            await self.broker.flush.wait_durable(result.end_offset)
        except FlushDiskTimeoutError as exc:
            return cmd.response(
                ResponseCode.FLUSH_DISK_TIMEOUT, str(exc), resp_header.to_ext_fields()
            )
        return cmd.response(ResponseCode.SUCCESS, None, resp_header.to_ext_fields())

    # -- SEND_BATCH_MESSAGE ---------------------------------------------------------------------

    #: Stores a batch of plain messages straight from the request body (None: the generic
    #: path stores it).
    plain_batch_records = staticmethod(plain_batch_records)

    async def send_batch(
        self, conn: Connection, cmd: RemotingCommand, h: SendMessageRequestHeader | None = None
    ) -> RemotingCommand:
        h = h or self._header(cmd)
        tc = self.broker.topics.for_send(h.topic, h.default_topic_queue_nums)
        if self.broker.topics.table.dirty:
            await self.broker.persist_topics()
        qid = self._queue_id(h.queue_id, tc.write_queue_nums, h.topic)
        tx = self.broker.transactions
        stored = tx.put_batch_halves(h, qid, cmd.body, conn.peer)
        if stored is not None:  # one transaction's halves, stored without message objects
            header = SendMessageResponseHeader(
                msg_id=",".join(stored[1]),
                queue_id=qid,
                queue_offset=stored[2],
                transaction_id=stored[0],
            )
            return await self._batch_stored(cmd, header, stored[3])
        records = self.plain_batch_records(
            h, qid, cmd.body, conn.peer, self.broker.config.max_message_size
        )
        if records is not None:  # plain messages, stored without message objects
            res = self.broker.put_encoded(records)
            prefix = self.broker.store.msg_id_prefix
            header = SendMessageResponseHeader(
                msg_id=",".join([f"{prefix}{phy:016X}" for phy, _n, _qo in res.placed]),
                queue_id=qid,
                queue_offset=res.placed[0][2],
            )
            return await self._batch_stored(cmd, header, res.end_offset)
        msgs, txid = self.batch_messages(h, qid, cmd.body, conn.peer)
        results = self.broker.put_messages(msgs)
        if txid is not None:
            tx.on_halves_stored(msgs, results)
        header = SendMessageResponseHeader(
            msg_id=",".join(r.offset_msg_id for r in results),
            queue_id=qid,
            queue_offset=results[0].queue_offset,
            transaction_id=txid,
        )
        return await self._batch_stored(cmd, header, results[-1].end_offset)

    def batch_messages(
        self,
        h: SendMessageRequestHeader,
        qid: int,
        data: bytes,
        born_host: tuple[str, int],
    ) -> tuple[list[MessageExt], str | None]:
        """The messages of a SEND_BATCH_MESSAGE body as they are stored (halves prepared),
        and the transaction id when they are the halves of one transaction.

        Raises:
            MessageIllegalError: the body is malformed, empty or mixes plain messages and
                halves (or halves of several transactions), a body is too large, or a plain
                message has a delay.
        """
        tx = self.broker.transactions
        try:
            entries = decode_batch(data)
        except ProtocolError as exc:
            raise MessageIllegalError(f"bad batch body: {exc}") from None
        if not entries:
            raise MessageIllegalError("the batch is empty")
        transactional = entries[0][2].get(MessageConst.TRAN_MSG, "").lower() == "true"
        txid = tx.transaction_id_of(entries[0][2]) if transactional else None
        msgs = []
        for body, flag, props in entries:
            self._check_body(body)
            if (props.get(MessageConst.TRAN_MSG, "").lower() == "true") != transactional or (
                transactional and tx.transaction_id_of(props) != txid
            ):
                raise MessageIllegalError(
                    "a batch is either plain or the half messages of one transaction (same "
                    "transaction id); this one mixes them"
                )
            if props.get(MessageConst.DELAY) and not transactional:
                raise MessageIllegalError("delayed messages cannot be sent as a batch")
            msg = MessageExt(
                topic=h.topic,
                body=body,
                queue_id=qid,
                flag=flag,
                sys_flag=h.sys_flag & ~0xC,
                born_timestamp=h.born_timestamp,
                born_host=born_host,
                reconsume_times=h.reconsume_times or 0,
                properties=props,
            )
            if transactional:
                tx.prepare_half(msg, h.producer_group)
            msgs.append(msg)
        return msgs, txid

    async def _batch_stored(
        self, cmd: RemotingCommand, header: SendMessageResponseHeader, end: int
    ) -> RemotingCommand:
        try:
            await self.broker.flush.wait_durable(end)
        except FlushDiskTimeoutError as exc:
            return cmd.response(ResponseCode.FLUSH_DISK_TIMEOUT, str(exc), header.to_ext_fields())
        return cmd.response(ResponseCode.SUCCESS, None, header.to_ext_fields())

    # -- CONSUMER_SEND_MSG_BACK -----------------------------------------------------------------

    async def consumer_send_msg_back(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        """A consumer could not process a message: re-deliver it later through
        ``%RETRY%<group>`` with growing delays, or park it in ``%DLQ%<group>``."""
        h = ConsumerSendMsgBackRequestHeader.from_ext_fields(cmd.ext_fields)
        try:
            orig = self.broker.store.lookup_message(h.offset)
        except (QueryNotFoundError, KeyError):
            raise QueryNotFoundError(f"look message by offset failed, {h.offset}") from None
        max_times = (
            h.max_reconsume_times
            if h.max_reconsume_times is not None
            else self.broker.config.max_reconsume_times
        )
        props = dict(orig.properties)
        props.setdefault(MessageConst.RETRY_TOPIC, orig.topic)
        props.setdefault(MessageConst.ORIGIN_MESSAGE_ID, h.origin_msg_id or orig.msg_id)
        props.pop(MessageConst.DELAY, None)
        times = orig.reconsume_times + 1
        if times > max_times or h.delay_level < 0:
            topic = dlq_topic(h.group)
            self.broker.topics.ensure(topic, 1)
            log.warning(
                "message_dead_lettered",
                group=h.group,
                msg_id=orig.msg_id,
                reconsume_times=orig.reconsume_times,
            )
        else:
            topic = retry_topic(h.group)
            self.broker.topics.ensure(topic, 1)
            level = h.delay_level if h.delay_level > 0 else 3 + orig.reconsume_times
            props[MessageConst.DELAY] = str(level)
        await self.broker.persist_topics()
        msg = MessageExt(
            topic=topic,
            body=orig.body,
            queue_id=0,
            flag=orig.flag,
            sys_flag=orig.sys_flag & ~0xC,
            born_timestamp=orig.born_timestamp,
            born_host=orig.born_host,
            reconsume_times=times,
            properties=props,
        )
        self.delay_to_schedule(msg)
        await self._store(msg)
        return cmd.response()

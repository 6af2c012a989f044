"""POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME and BATCH_ACK_MESSAGE: RocketMQ 5's
remoting pop consumers, translated to and from the core's POP consumption
(:mod:`txmq.broker.messaging.pop`), the same state gRPC ReceiveMessage uses.

A pop consumer builds each message's ``extraInfo`` from the answer's header (``popTime``,
``invisibleTime``, ``reviveQid``, per queue the first offset and the offsets handed out) and
sends it back with its ack.  Here ``popTime`` is the nonce of the handles the pop gave (never the
same twice), so an ack names exactly one delivery: an ack from a delivery the broker has since
replaced is refused (NO_MESSAGE, with the reason), as gRPC refuses an expired receipt handle.
``reviveQid`` is always 0 (txmq has no revive topic: the state is replayed from the commit log).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from txmq.protocol.aio import Connection
from txmq.protocol.codes import ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError
from txmq.protocol.headers import (
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
)
from txmq.protocol.message import encode_message
from txmq.protocol.topics import RETRY_GROUP_TOPIC_PREFIX

from ..messaging.core import MessagingCore
from ..messaging.pop import Delivery, ReceiptHandleError
from ..messaging.read import FilterSyntaxError, read_filter
from ..sql_filter import SUBSCRIPTION_PARSE_FAILED

#: The most a pop is held, whatever the client asks (ms).
MAX_POLL_MS = 60_000
#: Invisible times accepted (ms), as for gRPC's ReceiveMessage.
MIN_INVISIBLE_MS, MAX_INVISIBLE_MS = 1_000, 12 * 3600 * 1000
#: Most messages one pop returns.
MAX_POP_NUMS = 32


def _retry_mark(topic: str) -> str:
    """ExtraInfo's topic type: 0 a normal topic, 1 a retry topic."""
    return "1" if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else "0"


def _handle(queue_id: int, offset: int, extra_info: str) -> str:
    """The receipt handle an ack's ``extraInfo`` and offset name (its ``popTime`` is the
    nonce).

    Raises:
        ReceiptHandleError: ``extraInfo`` is not what a pop of this broker gave.
    """
    parts = extra_info.split(" ")
    if len(parts) < 7 or not parts[1].isascii() or not parts[1].isdigit():
        raise ReceiptHandleError(f"invalid extraInfo {extra_info!r}")
    return f"{queue_id}-{offset}-{parts[1]}"


def _field(doc: dict[str, Any], short: str, long: str) -> Any:
    """A BatchAck field by its JSON name or its Java name.

    Raises:
        KeyError: neither is there."""
    if short in doc:
        return doc[short]
    return doc[long]


class PopMessageProcessor:
    def __init__(self, core: MessagingCore) -> None:
        self.core = core
        self.pop = core.pop

    async def pop_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = PopMessageRequestHeader.from_ext_fields(cmd.ext_fields)
        if not MIN_INVISIBLE_MS <= h.invisible_time <= MAX_INVISIBLE_MS:
            raise InvalidParameterError(
                f"invisibleTime {h.invisible_time} ms is out of range "
                f"[{MIN_INVISIBLE_MS}, {MAX_INVISIBLE_MS}]"
            )
        if h.max_msg_nums <= 0:
            raise InvalidParameterError(f"maxMsgNums {h.max_msg_nums} must be positive")
        cfg = self.core.ctx.config
        try:
            read = read_filter(h.exp_type, h.exp, cfg.enable_property_filter)
        except FilterSyntaxError as exc:
            return cmd.response(
                SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription failed: {exc}"
            )
        pop_time = self.pop.pop_time()
        found = await self.pop.receive(
            h.consumer_group,
            h.topic,
            batch=min(h.max_msg_nums, MAX_POP_NUMS),
            invisible_ms=h.invisible_time,
            poll_s=max(0, min(h.poll_time, MAX_POLL_MS)) / 1000.0,
            filter=read,
            stopping=lambda: self.core.ctx.lifecycle.shutting_down,
            queue_id=h.queue_id,
            nonce=str(pop_time),
        )
        header = PopMessageResponseHeader(
            pop_time=pop_time, invisible_time=h.invisible_time, revive_qid=0, rest_num=0
        )
        if not found:
            code = ResponseCode.POLLING_TIMEOUT if h.poll_time > 0 else ResponseCode.PULL_NOT_FOUND
            return cmd.response(code, "no new message", header.to_ext_fields())
        # per queue, in offset order: the client pairs the body's messages with msgOffsetInfo
        # by their position among the queue's offsets, sorted
        found.sort(key=lambda d: (d.queue_id, d.message.queue_offset))
        by_queue: dict[int, list[Delivery]] = {}
        for d in found:
            by_queue.setdefault(d.queue_id, []).append(d)
        mark = _retry_mark(h.topic)
        header.start_offset_info = ";".join(
            f"{mark} {q} {ds[0].message.queue_offset}" for q, ds in by_queue.items()
        )
        header.msg_offset_info = ";".join(
            f"{mark} {q} " + ",".join(str(d.message.queue_offset) for d in ds)
            for q, ds in by_queue.items()
        )
        if h.order:
            header.order_count_info = ";".join(
                f"{mark} {q} {ds[0].attempts - 1}" for q, ds in by_queue.items()
            )
        for d in found:  # a message handed out again says how often it was before
            d.message.reconsume_times = max(d.message.reconsume_times, d.attempts - 1)
        body = b"".join(encode_message(d.message) for d in found)
        return cmd.response(ResponseCode.SUCCESS, None, header.to_ext_fields(), body)

    async def ack_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = AckMessageRequestHeader.from_ext_fields(cmd.ext_fields)
        handle = _handle(h.queue_id, h.offset, h.extra_info)
        [why] = self.pop.ack(h.consumer_group, h.topic, [handle], [""])
        if why:
            return cmd.response(ResponseCode.NO_MESSAGE, why)
        return cmd.response()

    async def change_invisible_time(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand:
        h = ChangeInvisibleTimeRequestHeader.from_ext_fields(cmd.ext_fields)
        if not 0 <= h.invisible_time <= MAX_INVISIBLE_MS:
            raise InvalidParameterError(
                f"invisibleTime {h.invisible_time} ms is out of range [0, {MAX_INVISIBLE_MS}]"
            )
        handle = _handle(h.queue_id, h.offset, h.extra_info)
        pop_time = self.pop.pop_time()
        try:
            self.pop.change_invisible(
                h.consumer_group, h.topic, handle, h.invisible_time, nonce=str(pop_time)
            )
        except ReceiptHandleError as exc:
            return cmd.response(ResponseCode.NO_MESSAGE, str(exc))
        header = ChangeInvisibleTimeResponseHeader(
            pop_time=pop_time, invisible_time=h.invisible_time, revive_qid=0
        )
        return cmd.response(ResponseCode.SUCCESS, None, header.to_ext_fields())

    async def batch_ack_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """A ``BatchAckMessageRequestBody``: per ``BatchAck`` (group ``c``, topic ``t``, first
        offset ``so``, queue ``q``, pop time ``pt``), the offsets whose bit is set in ``b`` (a
        Java ``BitSet``'s bytes, base64).  Handles that no longer name a delivery are skipped,
        as RocketMQ does; the answer says how many."""
        try:
            doc = json.loads(cmd.body or b"{}")
            acks: list[dict[str, Any]] = doc.get("acks") or []
        except (ValueError, AttributeError) as exc:
            raise InvalidParameterError(
                f"BATCH_ACK_MESSAGE body is not valid JSON: {exc}"
            ) from None
        refused = 0
        for a in acks:
            try:
                group = str(_field(a, "c", "consumerGroup"))
                topic = str(_field(a, "t", "topic"))
                start = int(_field(a, "so", "startOffset"))
                qid = int(_field(a, "q", "queueId"))
                pop_time = int(_field(a, "pt", "popTime"))
                bits = base64.b64decode(a.get("b", a.get("bitSet")) or "")
            except (TypeError, ValueError, KeyError) as exc:
                raise InvalidParameterError(f"a BatchAck is malformed: {exc}") from None
            offsets = [
                start + byte * 8 + bit
                for byte, value in enumerate(bits)
                for bit in range(8)
                if value >> bit & 1
            ]
            handles = [f"{qid}-{o}-{pop_time}" for o in offsets]
            results = self.pop.ack(group, topic, handles, [""] * len(handles))
            refused += sum(1 for why in results if why)
        if refused:
            return cmd.response(ResponseCode.SUCCESS, f"{refused} acks named no live delivery")
        return cmd.response()


__all__ = ["PopMessageProcessor"]

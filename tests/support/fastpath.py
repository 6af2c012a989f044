"""Two brokers fed the same requests, one with a fast path switched off: what the tests of the
broker's fast paths compare."""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from tests.support.raw import RawClient
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    BatchBody,
    MessageConst,
    MessageExt,
    decode_message,
    decode_offset_msg_id,
    properties_to_string,
)

#: The ``path`` labels of the fast paths in ``txmq_send_path_total``.
FAST_PATHS = ("plain", "halves")
#: Fields that differ between two brokers (their ports and clocks) for the same requests.
PER_BROKER = ("born_host", "store_host", "store_timestamp")
#: The delay levels a broker ships with (level 18 is two hours).
SHIPPED_DELAY_LEVELS = BrokerConfig().message_delay_level


class BrokerPair:
    """``fast`` as shipped, ``generic`` with ``fastPathEnable`` off; ``used`` records, per
    call on ``fast``, whether a fast path took the request (from ``txmq_send_path_total``)."""

    def __init__(self, fast: BrokerController, generic: BrokerController) -> None:
        self.fast, self.generic = fast, generic
        self.used: list[bool] = []
        self.clients: list[RawClient] = []

    def fast_batches(self) -> float:
        """Batches the fast broker stored through a fast path so far."""
        snap = self.fast.metrics.snapshot()
        return float(sum(snap.get(f"txmq_send_path_total{{path={p}}}", 0.0) for p in FAST_PATHS))

    async def call(
        self, code: int, ext: dict[str, Any], body: bytes
    ) -> tuple[RemotingCommand, RemotingCommand]:
        a, b = self.clients
        before = self.fast_batches()
        ra = await a.call(code, ext, body)
        if code == RequestCode.SEND_BATCH_MESSAGE:
            self.used.append(self.fast_batches() > before)
        return ra, await b.call(code, ext, body)


@contextlib.asynccontextmanager
async def broker_pair(make_broker_config: Any, **config: Any) -> AsyncIterator[BrokerPair]:
    """A started :class:`BrokerPair` with a raw client on each broker; both stopped at the
    end.  The delay levels are the shipped ones (1 s to 2 h), not the tests' short ones: a
    delayed message that fired during a comparison would be stored by one broker between two
    sends and not yet by the other, and the two logs would differ for a reason of timing."""
    config.setdefault("message_delay_level", SHIPPED_DELAY_LEVELS)
    brokers: list[BrokerController] = []
    clients: list[RawClient] = []
    try:
        for fast in (True, False):
            b = BrokerController(make_broker_config(fast_path_enable=fast, **config))
            await b.start()
            brokers.append(b)
        pair = BrokerPair(brokers[0], brokers[1])
        for b in brokers:
            clients.append(await RawClient.connect(b.address))
        pair.clients = clients
        yield pair
    finally:
        for c in clients:
            await c.close()
        for b in brokers:
            await b.shutdown()


def batch_body(rows: list[tuple[bytes, int, bytes]]) -> bytes:
    """A SEND_BATCH_MESSAGE body of (body, flag, properties in wire form) entries."""
    buf = BatchBody()
    for body, flag, props in rows:
        buf.add(body, props, flag)
    return buf.encode()


def comparable(m: MessageExt) -> dict[str, Any]:
    """``m``'s fields but those that differ between two brokers, properties in order."""
    d = {k: v for k, v in m.to_dict().items() if k not in PER_BROKER}
    d["properties"] = list(m.properties.items())
    return d


def batch_header(group: str, topic: str, qid: int, sys_flag: int) -> dict[str, Any]:
    """The SEND_BATCH_MESSAGE header (V2 keys) a producer of ``group`` sends for ``topic``."""
    return SendMessageRequestHeader(
        producer_group=group,
        topic=topic,
        default_topic_queue_nums=4,
        queue_id=qid,
        sys_flag=sys_flag,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=properties_to_string({MessageConst.WAIT_STORE_MSG_OK: "true"}),
        batch=True,
        reconsume_times=0,
    ).to_v2_ext_fields()


def single_header(
    group: str, v2: bool, topic: str, props: str | None, qid: int, sys_flag: int, **more: Any
) -> dict[str, Any]:
    """The SEND_MESSAGE_V2 (``v2``) or SEND_MESSAGE header of one message a producer of
    ``group`` sends (``more``: other header fields, ``flag`` among them)."""
    h = SendMessageRequestHeader(
        producer_group=group,
        topic=topic,
        queue_id=qid,
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_123,
        flag=more.pop("flag", 0),
        properties=props,
        **more,
    )
    return h.to_v2_ext_fields() if v2 else h.to_ext_fields()


def sent_by_path(b: BrokerController, path: str) -> int:
    """Sends ``b`` counted under ``path`` in ``txmq_send_path_total``."""
    return int(b.metrics.snapshot().get(f"txmq_send_path_total{{path={path}}}", 0))


#: The bytes of a stored record that differ between two brokers for the same request
#: (BORNHOST, STORETIMESTAMP, STOREHOST).
PER_BROKER_BYTES = slice(48, 72)


def record_bytes(b: BrokerController, offset: int) -> bytes:
    """The record stored at ``offset``, its per-broker bytes zeroed."""
    raw = bytearray(b.store.read_message_bytes(offset))
    raw[PER_BROKER_BYTES] = bytes(24)
    return bytes(raw)


def same_record(pair: BrokerPair, offset: int) -> None:
    """Both brokers stored the same record at ``offset`` (bytes and decoded fields)."""
    assert record_bytes(pair.fast, offset) == record_bytes(pair.generic, offset)
    assert comparable(decode_message(pair.fast.store.read_message_bytes(offset))) == comparable(
        decode_message(pair.generic.store.read_message_bytes(offset))
    )


async def send_to_both(
    pair: BrokerPair,
    v2: bool,
    ext: dict[str, Any],
    body: bytes,
    taken: Callable[[BrokerController], int],
) -> tuple[RemotingCommand, bool, int | None, dict[str, Any]]:
    """Send one SEND_MESSAGE(_V2) to both brokers and check that they answer alike (code,
    remark, the commit-log offset in the msgId, whose host part is each broker's own, and every
    other field); ``taken`` counts a broker's direct-path sends, which the generic broker never
    takes. Returns the fast broker's answer, whether its direct path took the request, and for
    a stored message its commit-log offset and the answer's other fields."""
    code = RequestCode.SEND_MESSAGE_V2 if v2 else RequestCode.SEND_MESSAGE
    before = taken(pair.fast)
    a, b = await pair.call(code, ext, body)
    took = taken(pair.fast) > before
    assert taken(pair.generic) == 0
    assert (a.code, a.remark) == (b.code, b.remark), (ext, body[:20])
    if a.code != ResponseCode.SUCCESS:
        return a, took, None, {}
    ea, eb = dict(a.ext_fields), dict(b.ext_fields)
    (_, off), (_, off_b) = (
        decode_offset_msg_id(ea.pop("msgId")),
        decode_offset_msg_id(eb.pop("msgId")),
    )
    # A timer message's recall handle holds its delivery time, which a relative delay makes
    # each broker's clock ahead: the rest of it is compared.
    ha, hb = ea.pop("recallHandle", None), eb.pop("recallHandle", None)
    assert [_handle_but_time(h) for h in (ha, hb)] == [_handle_but_time(hb)] * 2, (ha, hb)
    assert (off, ea) == (off_b, eb), (
        "the brokers stored it apart",
        ext,
        a.ext_fields,
        b.ext_fields,
    )
    return a, took, off, ea


def _handle_but_time(handle: object) -> list[str] | None:
    if handle is None:
        return None
    items = base64.urlsafe_b64decode(str(handle)).decode().split(" ")
    return items[:3] + items[4:]

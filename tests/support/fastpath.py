"""Two brokers fed the same requests, one with a fast path switched off: what the tests of the
broker's fast paths compare."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from tests.support.raw import RawClient
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import BatchBody, MessageConst, MessageExt, properties_to_string

#: The ``path`` labels of the fast paths in ``txmq_batch_path_total``.
FAST_PATHS = ("plain", "halves")
#: Fields that differ between two brokers (their ports and clocks) for the same requests.
PER_BROKER = ("born_host", "store_host", "store_timestamp")


class BrokerPair:
    """``fast`` as shipped, ``generic`` with ``batchFastPathEnable`` off; ``used`` records, per
    call on ``fast``, whether a fast path took the request (from ``txmq_batch_path_total``)."""

    def __init__(self, fast: BrokerController, generic: BrokerController) -> None:
        self.fast, self.generic = fast, generic
        self.used: list[bool] = []
        self.clients: list[RawClient] = []

    def fast_batches(self) -> float:
        """Batches the fast broker stored through a fast path so far."""
        snap = self.fast.metrics.snapshot()
        return float(sum(snap.get(f"txmq_batch_path_total{{path={p}}}", 0.0) for p in FAST_PATHS))

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
    end."""
    brokers: list[BrokerController] = []
    clients: list[RawClient] = []
    try:
        for fast in (True, False):
            b = BrokerController(make_broker_config(batch_fast_path_enable=fast, **config))
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

"""Consumer offsets committed inside a producer's transaction (consume-transform-produce).

The SDK adds one more half to a transaction whose real topic is :data:`TXN_OFFSETS_TOPIC`; its
body (JSON, :class:`TxnOffsets`) names the consumer group, the group generation the consumer
rebalanced under, the consumer's client id and, per consumed queue, the next offset and the
committed offset the step started from.  When the
transaction commits, the broker checks the generation and the membership and applies the
offsets to the group's committed offsets; see ``docs/transactions.md``.

Broker and SDK read and write the body here, so its shape is spelt once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .errors import MALFORMED_DOCUMENT, ProtocolError
from .topics import TXN_OFFSETS_TOPIC

#: The real topic of a transaction's offsets half; its committed copies are the durable record
#: of transactional offset commits, replayed at start.

#: The remark prefix of END_TRANSACTION answers refusing a fenced commit.
FENCED_PREFIX = "fenced: "


@dataclass(frozen=True)
class QueueOffset:
    topic: str
    broker_name: str
    queue_id: int
    #: The next offset the group consumes from the queue.
    offset: int
    #: The group's committed offset the consumer started this step from; the commit is refused
    #: when the broker's is not this one any more (another attempt committed first).  -1: not
    #: checked.
    expect: int = -1


@dataclass(frozen=True)
class TxnOffsets:
    group: str
    generation: int
    client_id: str
    offsets: tuple[QueueOffset, ...] = field(default_factory=tuple)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "group": self.group,
                "generation": self.generation,
                "clientId": self.client_id,
                "offsets": [
                    {
                        "topic": q.topic,
                        "brokerName": q.broker_name,
                        "queueId": q.queue_id,
                        "offset": q.offset,
                        "expect": q.expect,
                    }
                    for q in self.offsets
                ],
            },
            separators=(",", ":"),
        ).encode("utf-8")

    @classmethod
    def decode(cls, body: bytes) -> TxnOffsets:
        """Raises:
        ProtocolError: not an offsets body."""
        try:
            doc = json.loads(bytes(body).decode("utf-8"))
            return cls(
                group=str(doc["group"]),
                generation=int(doc["generation"]),
                client_id=str(doc["clientId"]),
                offsets=tuple(
                    QueueOffset(
                        str(q["topic"]),
                        str(q.get("brokerName") or ""),
                        int(q["queueId"]),
                        int(q["offset"]),
                        int(q.get("expect", -1)),
                    )
                    for q in doc["offsets"]
                ),
            )
        except MALFORMED_DOCUMENT as exc:
            raise ProtocolError(f"not a transactional offsets body: {exc}") from None


__all__ = ["FENCED_PREFIX", "TXN_OFFSETS_TOPIC", "QueueOffset", "TxnOffsets"]

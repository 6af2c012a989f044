"""A transaction's op record, encoded from its constant parts once, is what the general
encoder makes of the same record."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.broker.server import BrokerController
from txmq.broker.store import encode_for_store
from txmq.broker.transaction.state import OP_TAG
from txmq.protocol.message import MessageConst, MessageExt


async def test_op_records_encode_as_the_general_encoder(broker: BrokerController) -> None:
    tx = broker.transactions

    @settings(max_examples=200, deadline=None)
    @given(body=st.binary(max_size=300), born=st.integers(0, (1 << 63) - 1))
    def check(body: bytes, born: int) -> None:
        plain = encode_for_store(
            MessageExt(
                topic=tx.op_topic,
                body=body,
                queue_id=0,
                born_timestamp=born,
                born_host=broker.ctx.store_host,
                properties={MessageConst.TAGS: OP_TAG},
            )
        )
        assert tx.op_record(body, born) == plain

    check()

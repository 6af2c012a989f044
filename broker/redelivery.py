"""A stored message written again to the topic and queue it was meant for: a delayed message
when its time comes (``SCHEDULE_TOPIC_XXXX`` to its real topic), a timer message when it fires
(``rmq_sys_wheel_timer`` to its real topic), a half message when it is committed
(``RMQ_SYS_TRANS_HALF_TOPIC`` to its real topic)."""

from __future__ import annotations

from txmq.protocol.message import MessageExt


def redelivered(
    m: MessageExt,
    topic: str,
    queue_id: int,
    properties: dict[str, str],
    *,
    sys_flag: int | None = None,
    prepared_transaction_offset: int = 0,
) -> MessageExt:
    """``m`` as a new message of ``topic`` and ``queue_id``: its body, flag, system flag
    (unless ``sys_flag`` is given), birth and reconsume count carry over; the store sets where
    and when it is stored."""
    return MessageExt(
        topic=topic,
        body=m.body,
        queue_id=queue_id,
        flag=m.flag,
        sys_flag=m.sys_flag if sys_flag is None else sys_flag,
        born_timestamp=m.born_timestamp,
        born_host=m.born_host,
        reconsume_times=m.reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset,
        properties=properties,
    )


__all__ = ["redelivered"]

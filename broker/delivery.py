"""When a message asks to be delivered: the timer properties and their rules.

Pure rules on a message's properties, below both the messaging use cases and the transaction
service (a half may ask for a delivery time; its committed message waits in the timer): which
properties ask for a time, what time they ask for, the longest wait the broker accepts, and how
a message becomes a timer message.  The timer itself -- its index, firing and recall -- is
:mod:`txmq.broker.messaging.timer`.
"""

from __future__ import annotations

from txmq.protocol.errors import MessageIllegalError
from txmq.protocol.message import MessageConst, MessageExt

from .topics import TIMER_TOPIC

#: Properties that ask for delivery at a time rather than at a delay level: RocketMQ 5's timer
#: (absolute ms, relative s, relative ms) and ONS's start-deliver time (absolute ms).
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
START_DELIVER_TIME = "__STARTDELIVERTIME"
TIMER_PROPERTIES = (TIMER_DELIVER_MS, START_DELIVER_TIME, TIMER_DELAY_SEC, TIMER_DELAY_MS)

#: The timer topic's queue of pending timer messages.
TIMER_QUEUE = 0
#: RocketMQ 5's timer cancellation property: ``<real topic>+<UNIQ_KEY>`` of the timer message
#: a marker recalls (set on the recall log's records too).
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"


class DeliveryTimeError(MessageIllegalError):
    """A delivery time the broker cannot honour (malformed, or later than it can wait)."""


def timer_deliver_ms(props: dict[str, str], now_ms: int) -> int | None:
    """The delivery time (epoch ms) a message's timer properties ask for, or None; relative ones
    count from ``now_ms``.

    Raises:
        DeliveryTimeError: the property is not a number.
    """
    for key, scale, relative in (
        (TIMER_DELIVER_MS, 1, False),
        (START_DELIVER_TIME, 1, False),
        (TIMER_DELAY_SEC, 1000, True),
        (TIMER_DELAY_MS, 1, True),
    ):
        value = props.get(key)
        if value is None:
            continue
        try:
            n = int(value)
        except ValueError:
            raise DeliveryTimeError(f"{key} property {value!r} is not a number") from None
        return now_ms + n * scale if relative else n
    return None


def check_timer_delay(deliver_ms: int, now_ms: int, max_delay_sec: int) -> None:
    """Refuse a delivery time further ahead than ``timerMaxDelaySec``.

    Raises:
        DeliveryTimeError: it is.
    """
    wait = deliver_ms - now_ms
    if wait > max_delay_sec * 1000:
        raise DeliveryTimeError(
            f"delivery in {wait / 1000:.0f}s is beyond the longest timer delay of "
            f"{max_delay_sec}s (timerMaxDelaySec)"
        )


def route_to_timer(msg: MessageExt, deliver_ms: int) -> None:
    """Make ``msg`` a timer message: stored in the timer queue until ``deliver_ms``."""
    props = msg.properties
    props[TIMER_DELIVER_MS] = str(deliver_ms)
    props[MessageConst.REAL_TOPIC] = msg.topic
    props[MessageConst.REAL_QID] = str(msg.queue_id)
    msg.topic = TIMER_TOPIC
    msg.queue_id = TIMER_QUEUE


__all__ = [
    "START_DELIVER_TIME",
    "TIMER_DELAY_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELIVER_MS",
    "TIMER_DEL_UNIQKEY",
    "TIMER_PROPERTIES",
    "TIMER_QUEUE",
    "DeliveryTimeError",
    "check_timer_delay",
    "route_to_timer",
    "timer_deliver_ms",
]

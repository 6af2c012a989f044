"""What a half's committed message is: the half's properties and sys flag, less what only the
half carries.  Used where a half is stored (generic path and direct paths alike) to encode, at
once, the message its commit will append."""

from __future__ import annotations

from txmq.protocol.message import MessageConst, MessageSysFlag

#: The sys flag bits the stored form drops (IPv6 hosts are stored as IPv4).
HOST_V6_BITS = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6
#: Properties of a half that its committed message does not carry.
HALF_ONLY_PROPERTIES = (
    MessageConst.REAL_TOPIC,
    MessageConst.REAL_QID,
    MessageConst.TRAN_MSG,
    MessageConst.TRANSACTION_CHECK_TIMES,
    MessageConst.TXMQ_BATCH_KEY,
)


def committed_properties(props: dict[str, str]) -> dict[str, str]:
    """A half's properties without the half-only ones (order kept)."""
    out = dict(props)
    pop = out.pop
    for key in HALF_ONLY_PROPERTIES:
        pop(key, None)
    return out


def committed_sys_flag(sys_flag: int) -> int:
    return MessageSysFlag.reset_transaction_value(
        sys_flag & ~HOST_V6_BITS, MessageSysFlag.TRANSACTION_COMMIT_TYPE
    )


def check_immunity_ms(props: dict[str, str]) -> int | None:
    """A half's ``CHECK_IMMUNITY_TIME_IN_SECONDS`` in ms (None: absent or not a number)."""
    immunity = props.get(MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS)
    try:
        return int(float(immunity) * 1000) if immunity else None
    except ValueError:
        return None


__all__ = [
    "HALF_ONLY_PROPERTIES",
    "HOST_V6_BITS",
    "check_immunity_ms",
    "committed_properties",
    "committed_sys_flag",
]

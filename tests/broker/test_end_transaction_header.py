"""END_TRANSACTION's header read without the typed header's converters (its fields already of
their types) is the typed header's reading, or the same error."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.broker.processors.transaction import end_transaction_header
from txmq.protocol.errors import InvalidParameterError
from txmq.protocol.headers import EndTransactionRequestHeader

_value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.text(max_size=6),
    st.sampled_from(["", "0", "8", "12", "true", "false", "-1"]),
)
_typed = {
    "producerGroup": st.text(min_size=1, max_size=8),
    "tranStateTableOffset": st.integers(0, 1 << 40),
    "commitLogOffset": st.integers(0, 1 << 50),
    "commitOrRollback": st.sampled_from([0, 8, 12, 4]),
    "fromTransactionCheck": st.booleans(),
    "msgId": st.text(max_size=32),
    "transactionId": st.text(max_size=32),
}


def _outcome(read: Any, ext: dict[str, Any]) -> object:
    try:
        return read(ext)
    except InvalidParameterError as exc:
        return ("error", str(exc))


@settings(max_examples=300, deadline=None)
@given(
    typed=st.fixed_dictionaries(_typed),
    spoiled=st.dictionaries(st.sampled_from([*_typed, "extra"]), _value, max_size=3),
    drop=st.lists(st.sampled_from(list(_typed)), max_size=2),
)
def test_end_transaction_header_reads_as_the_typed_header(
    typed: dict[str, Any], spoiled: dict[str, Any], drop: list[str]
) -> None:
    for ext in (typed, {**typed, **spoiled}, {k: v for k, v in typed.items() if k not in drop}):
        fast = _outcome(end_transaction_header, ext)
        assert fast == _outcome(EndTransactionRequestHeader.from_ext_fields, ext)
    # the shortcut's own case: every field of its type
    assert end_transaction_header(typed) == EndTransactionRequestHeader.from_ext_fields(typed)


def test_stock_clients_string_fields_are_read_by_the_typed_header() -> None:
    ext = {
        "producerGroup": "g",
        "tranStateTableOffset": "3",
        "commitLogOffset": "4096",
        "commitOrRollback": "8",
        "fromTransactionCheck": "false",
        "msgId": "A",
        "transactionId": "T",
    }
    assert end_transaction_header(ext) == EndTransactionRequestHeader(
        "g", 3, 4096, 8, False, "A", "T"
    )

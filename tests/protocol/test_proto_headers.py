"""Typed headers <-> extFields: every header class, native and stringified, V2 single letters,
and precise errors for missing or ill-typed fields."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txmq.protocol import headers as H
from txmq.protocol.codes import RequestCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError
from txmq.protocol.frame import decode_frame, encode_frame

HEADER_CLASSES: list[type[H.Header]] = sorted(
    (
        obj
        for obj in vars(H).values()
        if inspect.isclass(obj) and issubclass(obj, H.Header) and obj is not H.Header
    ),
    key=lambda c: c.__name__,
)

text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)


def test_header_classes_found() -> None:
    # Guards the discovery above: a rename must not silently empty the parametrisation.
    names = {c.__name__ for c in HEADER_CLASSES}
    assert {
        "SendMessageRequestHeader",
        "SendMessageResponseHeader",
        "PullMessageRequestHeader",
        "PullMessageResponseHeader",
        "QueryConsumerOffsetRequestHeader",
        "UpdateConsumerOffsetRequestHeader",
        "EndTransactionRequestHeader",
        "CheckTransactionStateRequestHeader",
    } <= names


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(int | str | bool, optional?)"""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _value_strategy(tp: Any) -> st.SearchStrategy[Any]:
    base, optional = _base_type(tp)
    inner: st.SearchStrategy[Any] = {
        int: st.integers(-(2**63), 2**63 - 1),
        str: text,
        bool: st.booleans(),
    }[base]
    return st.none() | inner if optional else inner


def header_instances(cls: type[H.Header]) -> st.SearchStrategy[H.Header]:
    hints = typing.get_type_hints(cls)
    return st.builds(
        cls, **{f.name: _value_strategy(hints[f.name]) for f in dataclasses.fields(cls)}
    )


def _stringified(ext: dict[str, Any]) -> dict[str, str]:
    return {
        k: ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in ext.items()
    }


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_native_and_stringified(cls: type[H.Header], data: st.DataObject) -> None:
    header = data.draw(header_instances(cls))
    ext = header.to_ext_fields()
    # to_ext_fields leaves out None and uses the camelCase wire names.
    assert all(v is not None for v in ext.values())
    assert all("_" not in k for k in ext)
    # msgpack delivers native values ...
    assert cls.from_ext_fields(ext) == header
    # ... JSON and ROCKETMQ deliver strings.
    assert cls.from_ext_fields(_stringified(ext)) == header


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("st_type", list(SerializeType), ids=lambda s: s.name)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_through_real_frames(
    cls: type[H.Header], st_type: SerializeType, data: st.DataObject
) -> None:
    header = data.draw(header_instances(cls))
    cmd = RemotingCommand(
        code=RequestCode.SEND_MESSAGE, ext_fields=header.to_ext_fields(), serialize_type=st_type
    )
    decoded = decode_frame(encode_frame(cmd))
    assert cls.from_ext_fields(decoded.ext_fields) == header


def test_wire_names_are_rocketmq_camel_case() -> None:
    ext = H.SendMessageRequestHeader(
        producer_group="pg",
        topic="T",
        queue_id=2,
        sys_flag=4,
        born_timestamp=9,
        properties="a\x01b\x02",
        max_reconsume_times=16,
    ).to_ext_fields()
    assert ext["producerGroup"] == "pg"
    assert ext["queueId"] == 2
    assert ext["sysFlag"] == 4
    assert ext["bornTimestamp"] == 9
    assert ext["maxReconsumeTimes"] == 16
    assert ext["defaultTopic"] == "TBW102"
    assert "reconsumeTimes" not in ext  # None is left out

    end = H.EndTransactionRequestHeader(
        producer_group="pg",
        tran_state_table_offset=1,
        commit_log_offset=2,
        commit_or_rollback=8,
        from_transaction_check=True,
        msg_id="M",
        transaction_id="X",
    ).to_ext_fields()
    assert end == {
        "producerGroup": "pg",
        "tranStateTableOffset": 1,
        "commitLogOffset": 2,
        "commitOrRollback": 8,
        "fromTransactionCheck": True,
        "msgId": "M",
        "transactionId": "X",
    }
    # RocketMQ spells this one with capitals.
    assert H.UnregisterClientRequestHeader(client_id="c").to_ext_fields() == {"clientID": "c"}


# --- V2 ---------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(header=header_instances(H.SendMessageRequestHeader))
def test_v2_single_letter_round_trip(header: H.SendMessageRequestHeader) -> None:
    assert isinstance(header, H.SendMessageRequestHeader)
    v2 = header.to_v2_ext_fields()
    assert all(len(k) == 1 and "a" <= k <= "n" for k in v2)
    assert H.SendMessageRequestHeader.from_v2_ext_fields(v2) == header
    assert H.SendMessageRequestHeader.from_v2_ext_fields(_stringified(v2)) == header


def test_v2_letters_match_rocketmq() -> None:
    # SendMessageRequestHeaderV2: a producerGroup, b topic, c defaultTopic, d defaultTopicQueueNums,
    # e queueId, f sysFlag, g bornTimestamp, h flag, i properties, j reconsumeTimes, k unitMode,
    # l maxReconsumeTimes, m batch, n brokerName.
    header = H.SendMessageRequestHeader(
        producer_group="pg",
        topic="T",
        default_topic="D",
        default_topic_queue_nums=8,
        queue_id=3,
        sys_flag=4,
        born_timestamp=5,
        flag=6,
        properties="p",
        reconsume_times=7,
        unit_mode=False,
        batch=True,
        max_reconsume_times=9,
        broker_name="b",
    )
    assert header.to_v2_ext_fields() == {
        "a": "pg",
        "b": "T",
        "c": "D",
        "d": 8,
        "e": 3,
        "f": 4,
        "g": 5,
        "h": 6,
        "i": "p",
        "j": 7,
        "k": False,
        "l": 9,
        "m": True,
        "n": "b",
    }


def test_v2_missing_producer_group_names_the_v1_field() -> None:
    with pytest.raises(InvalidParameterError, match="producerGroup"):
        H.SendMessageRequestHeader.from_v2_ext_fields({"b": "T"})


# --- errors -----------------------------------------------------------------------------------


def _required(cls: type[H.Header]) -> list[tuple[str, str, Any]]:
    hints = typing.get_type_hints(cls)
    return [
        (f.name, wire, hints[f.name])
        for f, wire, _ in cls._fields()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def _sample(tp: Any) -> Any:
    base, _ = _base_type(tp)
    return {int: 1, str: "x", bool: True}[base]


def _full_ext(cls: type[H.Header]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {wire: _sample(hints[f.name]) for f, wire, _ in cls._fields()}


REQUIRED_CASES = [(cls, wire) for cls in HEADER_CLASSES for _, wire, _ in _required(cls)]


@pytest.mark.parametrize(
    ("cls", "wire"), REQUIRED_CASES, ids=[f"{c.__name__}.{w}" for c, w in REQUIRED_CASES]
)
def test_missing_required_field_names_it(cls: type[H.Header], wire: str) -> None:
    ext = _full_ext(cls)
    cls.from_ext_fields(ext)  # complete: decodes
    del ext[wire]
    with pytest.raises(InvalidParameterError) as info:
        cls.from_ext_fields(ext)
    assert wire in str(info.value)
    # A null counts as missing too.
    with pytest.raises(InvalidParameterError, match=wire):
        cls.from_ext_fields({**ext, wire: None})


INT_CASES = [
    (cls, wire)
    for cls in HEADER_CLASSES
    for f, wire, tp in cls._fields()
    if _base_type(typing.get_type_hints(cls)[f.name])[0] is int
]


@pytest.mark.parametrize(
    ("cls", "wire"), INT_CASES, ids=[f"{c.__name__}.{w}" for c, w in INT_CASES]
)
@pytest.mark.parametrize("bad", ["abc", "1.5", True, 2.5], ids=repr)
def test_bad_int_names_the_field(cls: type[H.Header], wire: str, bad: Any) -> None:
    ext = {**_full_ext(cls), wire: bad}
    with pytest.raises(InvalidParameterError) as info:
        cls.from_ext_fields(ext)
    assert wire in str(info.value)


@pytest.mark.parametrize("bad", ["yes", "2", 2, 1.0])
def test_bad_bool_names_the_field(bad: Any) -> None:
    ext = {**_full_ext(H.EndTransactionRequestHeader), "fromTransactionCheck": bad}
    with pytest.raises(InvalidParameterError, match="fromTransactionCheck"):
        H.EndTransactionRequestHeader.from_ext_fields(ext)


def test_bool_accepts_java_strings_and_01() -> None:
    base = _full_ext(H.EndTransactionRequestHeader)
    for raw, want in [("true", True), ("FALSE", False), (1, True), (0, False), (True, True)]:
        got = H.EndTransactionRequestHeader.from_ext_fields({**base, "fromTransactionCheck": raw})
        assert got.from_transaction_check is want


def test_str_field_accepts_numbers_and_keeps_strings() -> None:
    got = H.GetRouteInfoRequestHeader.from_ext_fields({"topic": 123})
    assert got.topic == "123"
    with pytest.raises(InvalidParameterError, match="topic"):
        H.GetRouteInfoRequestHeader.from_ext_fields({"topic": True})


def test_empty_string_for_optional_int_means_absent() -> None:
    ext = {**_full_ext(H.SendMessageRequestHeader), "reconsumeTimes": ""}
    assert H.SendMessageRequestHeader.from_ext_fields(ext).reconsume_times is None


def test_unknown_keys_are_ignored() -> None:
    got = H.GetRouteInfoRequestHeader.from_ext_fields({"topic": "T", "acceptStandardJsonOnly": "1"})
    assert got == H.GetRouteInfoRequestHeader(topic="T")


def test_invalid_parameter_error_has_the_response_code() -> None:
    with pytest.raises(InvalidParameterError) as info:
        H.GetRouteInfoRequestHeader.from_ext_fields({})
    assert info.value.code == 29

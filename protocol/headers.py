"""Typed request/response headers <-> ``extFields``.

Python code uses snake_case attributes; the wire uses RocketMQ's camelCase names (derived from
the attribute name, e.g. ``producer_group`` <-> ``producerGroup``).  This is the one place that
converts.  Decoding accepts native values (msgpack) and strings (JSON, ROCKETMQ); encoding
produces native values, and :func:`~txmq.protocol.frame.encode_header` stringifies them for the
string encodings.

A missing required field or a value of the wrong type raises
:class:`~txmq.protocol.errors.InvalidParameterError` naming the field, so a sender learns
exactly what was wrong.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from .errors import InvalidParameterError
from .topics import AUTO_CREATE_TOPIC_KEY_TOPIC

H = TypeVar("H", bound="Header")

_MISSING = dataclasses.MISSING


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


_BOOL_SPELLINGS = {"true": True, "false": False, "1": True, "0": False}

#: ``convert(value, wire_name)``: one header field's value as its declared type, or
#: :class:`InvalidParameterError`.
Converter = Callable[[Any, str], Any]


def _invalid(value: Any, wire: str) -> Any:
    raise InvalidParameterError(f"header field {wire!r} has an invalid value {value!r}")


def _to_bool(value: Any, wire: str) -> Any:
    if value is True or value is False:
        return value
    if isinstance(value, str):
        # Java sends "true"/"false"; the C++ client sends "0"/"1".
        spelled = _BOOL_SPELLINGS.get(value.strip().lower())
        if spelled is not None:
            return spelled
    elif isinstance(value, int) and value in (0, 1):
        return bool(value)
    return _invalid(value, wire)


def _to_int(value: Any, wire: str) -> Any:
    if type(value) is int:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    return _invalid(value, wire)


def _to_str(value: Any, wire: str) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return _invalid(value, wire)


_SCALAR_CONVERTERS: dict[Any, Converter] = {bool: _to_bool, int: _to_int, str: _to_str}


def _optional(inner: Converter, empty_is_none: bool) -> Converter:
    if empty_is_none:

        def convert(value: Any, wire: str) -> Any:
            if value is None or value == "":
                return None
            return inner(value, wire)

    else:

        def convert(value: Any, wire: str) -> Any:
            return None if value is None else inner(value, wire)

    return convert


def _converter(tp: Any) -> Converter:
    """The converter of a field annotated ``tp``, resolved once per header class (not per
    field per request): ``X | None`` accepts None, and "" for a non-str ``X``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _optional(_converter(args[0]), args[0] is not str)
    return _SCALAR_CONVERTERS.get(tp, _invalid)


def _coerce(value: Any, tp: Any, wire: str) -> Any:
    """``value`` (native or a string) as the type ``tp`` of the header field ``wire``."""
    return _converter(tp)(value, wire)


_FIELDS_CACHE: dict[type, list[tuple[dataclasses.Field[Any], str, Any]]] = {}
#: Per header class, what decoding needs of each field: attribute name, wire name, converter,
#: and whether the field is required.
_DECODE_PLAN: dict[type, list[tuple[str, str, Converter, bool]]] = {}
#: Per header class, (attribute name, wire name) of each field, for encoding.
_ENCODE_PLAN: dict[type, list[tuple[str, str]]] = {}


@dataclass
class Header:
    """Base of the typed headers.  Subclasses are dataclasses; ``WIRE_NAMES`` overrides the
    derived camelCase name of an attribute where RocketMQ spells it differently."""

    WIRE_NAMES: ClassVar[dict[str, str]] = {}

    @classmethod
    def _fields(cls) -> list[tuple[dataclasses.Field[Any], str, Any]]:
        # Resolved once per class: typing.get_type_hints() evaluates the string annotations
        # again on every call, which cost ~150 us per header on every request and response.
        cached = _FIELDS_CACHE.get(cls)
        if cached is None:
            hints = typing.get_type_hints(cls)
            cached = [
                (f, cls.WIRE_NAMES.get(f.name, camel(f.name)), hints[f.name])
                for f in dataclasses.fields(cls)
            ]
            _FIELDS_CACHE[cls] = cached
        return cached

    @classmethod
    def _decode_plan(cls) -> list[tuple[str, str, Converter, bool]]:
        plan = _DECODE_PLAN.get(cls)
        if plan is None:
            plan = [
                (
                    f.name,
                    wire,
                    _converter(tp),
                    f.default is _MISSING and f.default_factory is _MISSING,
                )
                for f, wire, tp in cls._fields()
            ]
            _DECODE_PLAN[cls] = plan
        return plan

    @classmethod
    def _encode_plan(cls) -> list[tuple[str, str]]:
        plan = _ENCODE_PLAN.get(cls)
        if plan is None:
            plan = [(f.name, wire) for f, wire, _ in cls._fields()]
            _ENCODE_PLAN[cls] = plan
        return plan

    def to_ext_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, wire in self._encode_plan():
            v = getattr(self, name)
            if v is not None:
                out[wire] = v
        return out

    @classmethod
    def from_ext_fields(cls: type[H], ext: dict[str, Any]) -> H:
        kwargs: dict[str, Any] = {}
        get = ext.get
        for name, wire, convert, required in cls._decode_plan():
            v = get(wire)
            if v is not None:
                kwargs[name] = convert(v, wire)
            elif required:
                raise InvalidParameterError(f"the custom field <{wire}> is null")
        return cls(**kwargs)


# --- send -------------------------------------------------------------------------------------


@dataclass
class SendMessageRequestHeader(Header):
    producer_group: str
    topic: str
    default_topic: str = AUTO_CREATE_TOPIC_KEY_TOPIC
    default_topic_queue_nums: int = 4
    queue_id: int = -1
    sys_flag: int = 0
    born_timestamp: int = 0
    flag: int = 0
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool | None = None
    batch: bool | None = None
    max_reconsume_times: int | None = None
    broker_name: str | None = None

    #: SEND_MESSAGE_V2's single-letter keys (``SendMessageRequestHeaderV2``).
    V2_KEYS: ClassVar[dict[str, str]] = {
        "producerGroup": "a",
        "topic": "b",
        "defaultTopic": "c",
        "defaultTopicQueueNums": "d",
        "queueId": "e",
        "sysFlag": "f",
        "bornTimestamp": "g",
        "flag": "h",
        "properties": "i",
        "reconsumeTimes": "j",
        "unitMode": "k",
        "maxReconsumeTimes": "l",
        "batch": "m",
        "brokerName": "n",
    }

    #: The reverse of :attr:`V2_KEYS`.
    V2_NAMES: ClassVar[dict[str, str]] = {v: k for k, v in V2_KEYS.items()}

    def to_v2_ext_fields(self) -> dict[str, Any]:
        keys = self.V2_KEYS
        return {keys[k]: v for k, v in self.to_ext_fields().items()}

    @classmethod
    def from_v2_ext_fields(cls, ext: dict[str, Any]) -> SendMessageRequestHeader:
        back = cls.V2_NAMES
        return cls.from_ext_fields({back.get(k, k): v for k, v in ext.items()})


@dataclass
class SendMessageResponseHeader(Header):
    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    batch_uniq_id: str | None = None


# --- pull -------------------------------------------------------------------------------------


@dataclass
class PullMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int = 32
    sys_flag: int = 0
    commit_offset: int = 0
    suspend_timeout_millis: int = 0
    subscription: str | None = None
    sub_version: int = 0
    expression_type: str | None = None


@dataclass
class PullMessageResponseHeader(Header):
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int = 0


# --- pop consumption --------------------------------------------------------------------------


@dataclass
class PopMessageRequestHeader(Header):
    """POP_MESSAGE: up to ``max_msg_nums`` messages of ``topic`` (``queue_id`` -1: any queue),
    invisible for ``invisible_time`` ms, long-polled up to ``poll_time`` ms."""

    consumer_group: str
    topic: str
    queue_id: int
    max_msg_nums: int
    invisible_time: int
    poll_time: int
    born_time: int
    init_mode: int
    exp_type: str | None = None
    exp: str | None = None
    order: bool = False
    attempt_id: str | None = None


@dataclass
class PopMessageResponseHeader(Header):
    """What a pop consumer builds each message's ``extraInfo`` from: the pop time, the
    invisible time, the revive queue, and per queue the first offset and the offsets handed
    out (``"<retry> <queueId> <offset>;..."``, ``"<retry> <queueId> <o1>,<o2>;..."``)."""

    pop_time: int
    invisible_time: int
    revive_qid: int
    rest_num: int
    start_offset_info: str | None = None
    msg_offset_info: str | None = None
    order_count_info: str | None = None


@dataclass
class AckMessageRequestHeader(Header):
    """ACK_MESSAGE: the message at ``offset`` of the queue, named by the ``extraInfo`` its pop
    gave (``"<startOffset> <popTime> <invisibleTime> <reviveQid> <retry> <brokerName>
    <queueId> <offset>"``)."""

    consumer_group: str
    topic: str
    queue_id: int
    extra_info: str
    offset: int


@dataclass
class ChangeInvisibleTimeRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    extra_info: str
    offset: int
    invisible_time: int


@dataclass
class ChangeInvisibleTimeResponseHeader(Header):
    pop_time: int
    invisible_time: int
    revive_qid: int


# --- offsets ----------------------------------------------------------------------------------


@dataclass
class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    #: RocketMQ's answer for a group without an offset: 0 when the queue still starts at 0
    #: (None/True), or QUERY_NOT_FOUND regardless (False; what the txmq SDK asks for, so its
    #: ``consume_from`` decides).
    set_zero_if_not_found: bool | None = None


@dataclass
class QueryConsumerOffsetResponseHeader(Header):
    offset: int


@dataclass
class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int


@dataclass
class GetMaxOffsetRequestHeader(Header):
    topic: str
    queue_id: int


@dataclass
class GetMinOffsetRequestHeader(Header):
    topic: str
    queue_id: int


@dataclass
class GetOffsetResponseHeader(Header):
    offset: int


@dataclass
class SearchOffsetRequestHeader(Header):
    topic: str
    queue_id: int
    timestamp: int


# --- clients ----------------------------------------------------------------------------------


@dataclass
class UnregisterClientRequestHeader(Header):
    WIRE_NAMES: ClassVar[dict[str, str]] = {"client_id": "clientID"}
    client_id: str
    producer_group: str | None = None
    consumer_group: str | None = None


@dataclass
class GetConsumerListByGroupRequestHeader(Header):
    consumer_group: str


@dataclass
class GetRouteInfoRequestHeader(Header):
    topic: str


@dataclass
class CreateTopicRequestHeader(Header):
    topic: str
    default_topic: str = AUTO_CREATE_TOPIC_KEY_TOPIC
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False


@dataclass
class ConsumerSendMsgBackRequestHeader(Header):
    offset: int
    group: str
    delay_level: int = 0
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None


@dataclass
class ViewMessageRequestHeader(Header):
    offset: int


#: The ext field that makes a QUERY_MESSAGE a query by unique key (RocketMQ's
#: ``MixAll.UNIQUE_MSG_QUERY_FLAG``), ``"true"``.
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"


@dataclass
class QueryMessageRequestHeader(Header):
    """QUERY_MESSAGE (12): messages of ``topic`` by key, stored in ``[beginTimestamp,
    endTimestamp]`` (ms)."""

    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int
    #: txmq: answer a page (see :class:`ListPageRequestHeader`): the ``maxNum`` newest after
    #: this cursor ("" for the first page) and ``nextCursor``; None (a stock client): as
    #: RocketMQ, the ``maxNum`` newest in one answer.
    after: str | None = None


@dataclass
class QueryMessageResponseHeader(Header):
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


@dataclass
class ListPageRequestHeader(Header):
    """txmq's paging of a listing RocketMQ answers whole (GET_ALL_TOPIC_CONFIG,
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG).  With ``after`` the answer is one page: at most ``limit``
    entries by name after the cursor ``after`` ("" for the first page), cut at about 4 MiB,
    and the answer's ``nextCursor`` names where the next page starts (none after the last).
    Without it (a stock RocketMQ client) the whole listing is answered, or, past the frame
    limit, an error naming the limit."""

    after: str | None = None
    limit: int | None = None


# --- transactions -----------------------------------------------------------------------------


@dataclass
class EndTransactionRequestHeader(Header):
    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool = False
    msg_id: str | None = None
    transaction_id: str | None = None


@dataclass
class CheckTransactionStateRequestHeader(Header):
    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None


@dataclass
class ResumeCheckHalfMessageRequestHeader(Header):
    msg_id: str


@dataclass
class ListTransactionsRequestHeader(Header):
    producer_group: str | None = None
    topic: str | None = None
    state: str | None = None
    limit: int = 1000
    #: The cursor of the page before (the answer's ``nextCursor``): transactions after it.
    after: str | None = None
    #: Only two-phase transactions (halves with ``TXMQ_2PC``; what an SDK ``recover()`` lists).
    two_phase: bool | None = None


@dataclass
class GetTransactionRequestHeader(Header):
    transaction_id: str


@dataclass
class ForceDecideRequestHeader(Header):
    transaction_id: str
    commit_or_rollback: int


@dataclass
class DecideBatchRequestHeader(Header):
    producer_group: str
    batch_key: str
    #: Only report whether (and how) the batch was decided; decide nothing.
    query_only: bool = False


# --- operator views (mqadmin's consumerProgress, consumerConnection, producerConnection) ------


@dataclass
class GetConsumeStatsRequestHeader(Header):
    consumer_group: str
    #: One topic, or None: every topic the group has offsets for.
    topic: str | None = None
    #: RocketMQ 5: several topics, separated by ``;`` (wins over ``topic``).
    topic_list: str | None = None


@dataclass
class GetConsumerConnectionListRequestHeader(Header):
    consumer_group: str


@dataclass
class GetProducerConnectionListRequestHeader(Header):
    producer_group: str


@dataclass
class DeleteSubscriptionGroupRequestHeader(Header):
    group_name: str
    #: RocketMQ 5: also delete the group's committed offsets.  txmq always removes them with
    #: the group (its settings and its offsets).
    clean_offset: bool | None = None


@dataclass
class GetBrokerConfigResponseHeader(Header):
    #: RocketMQ's DataVersion JSON of the configuration.
    version: str


@dataclass
class DeleteTopicRequestHeader(Header):
    topic: str


@dataclass
class ResetOffsetRequestHeader(Header):
    """RocketMQ's ``ResetOffsetRequestHeader`` (INVOKE_BROKER_TO_RESET_OFFSET and the
    broker's RESET_CONSUMER_CLIENT_OFFSET).  ``timestamp`` in ms since the epoch; RocketMQ 5's
    ``queueId`` (-1: every queue) and ``offset`` (an exact offset instead of a time)."""

    topic: str
    group: str
    timestamp: int
    is_force: bool
    queue_id: int | None = None
    offset: int | None = None

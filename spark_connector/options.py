"""Options of the ``txmq`` Spark data source: parsing and validation, no Spark and no I/O.

Spark hands a data source its options as strings (case-insensitive keys).  This module turns
them into frozen dataclasses and refuses bad values with a :class:`TxmqOptionError` that names
the option, what was given and what is expected, so a user sees the mistake before any task
runs.

Sink (``df.writeStream.format("txmq")`` and ``df.write.format("txmq")``):

=====================  =======================================================================
option                 meaning
=====================  =======================================================================
``broker``             ``host:port`` of the broker (required)
``topic``              default topic; optional when every row has a ``topic`` column value
``producerGroup``      producer group of the sink's transactions (default: derived from the
                       streaming query id, or ``txmq-spark-batch`` for batch writes)
``queueColumn``        column whose value picks the queue (``crc32(value) % writeQueueNums``),
                       so rows with the same value stay in order in one queue
``batchSize``          most messages per SEND_BATCH_MESSAGE request (default 512)
``maxRequestBytes``    most body bytes per request (default 1 MiB)
``maxInFlight``        requests a task keeps in flight (default 8)
``pipeline``           a txmq -> txmq pipeline's name: batch decisions record the source
                       offsets they consumed (see :mod:`.pipeline`; needs checkpointLocation)
``requestTimeout``     seconds to wait for each broker answer (default 30)
``accessKey``          ACL account the requests are signed with (the broker's ``aclEnable``)
``secretKey``          its secret key (both or neither)
``tls``                connect with TLS (default false; true checks the broker's certificate
                       against the system's CA store)
``tlsCaPath``          PEM CA bundle the broker's certificate is checked against (implies
                       ``tls``)
``tlsCertPath``        client certificate (PEM) for mutual TLS ...
``tlsKeyPath``         ... and its private key (both or neither)
=====================  =======================================================================

Source (``spark.readStream.format("txmq")`` and ``spark.read.format("txmq")``):

==========================  ==================================================================
option                      meaning
==========================  ==================================================================
``broker``                  ``host:port`` of the broker (required)
``topic``                   one topic, or several separated by commas
``subscribePattern``        a regular expression: every topic whose whole name matches (one of
                            ``topic`` and ``subscribePattern`` is required)
``startingOffsets``         ``earliest`` (default), ``latest``, or JSON
                            ``{"topic": {"0": 12, "1": -2}}`` (-2 earliest, -1 latest; queues
                            not named start at the earliest offset)
``startingOffsetsByTimestamp``  JSON ``{"topic": {"0": <epoch ms>}}``: per queue, the first
                            message stored at or after that time (queues not named: earliest)
``startingTimestamp``       epoch ms, the same for every queue (at most one of the three
                            starting options)
``endingOffsets``           batch reads only: ``latest`` (default) or JSON like
                            ``startingOffsets`` (-1 latest; queues not named: latest)
``minPartitions``           split the queues' ranges into at least this many Spark partitions
``maxMessagesPerTrigger``   most messages per micro-batch, spread over the queues (default: no
                            limit)
``maxBytesPerTrigger``      about this many body bytes per micro-batch (estimated from the
                            sizes of the next messages)
``minOffsetsPerTrigger``    wait for this many new messages before a micro-batch ...
``maxTriggerDelay``         ... but no longer than this after the last batch (default ``15m``)
``pullBatchSize``           messages per PULL_MESSAGE (default 256, at most 1024)
``failOnDataLoss``          fail when messages to read were already deleted by retention
                            (default true); false skips to the oldest stored message
``pipeline``                resume from, and plan again, what this pipeline's sink recorded
``producerGroup``           with ``pipeline``: the sink's producer group, when it sets one
``requestTimeout``          seconds to wait for each broker answer (default 30)
``accessKey``               ACL account the requests are signed with (the broker's
                            ``aclEnable``)
``secretKey``               its secret key (both or neither)
``tls``, ``tlsCaPath``,     TLS to the broker, as for the sink
``tlsCertPath``,
``tlsKeyPath``
==========================  ==================================================================

The TLS files are read where a connection is opened: on the driver (offsets, batch decisions)
and on every executor, so the paths must be valid on all of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from txmq.protocol.acl import Credentials
from txmq.protocol.topics import TOPIC_MAX_LENGTH, TOPIC_PATTERN

#: Producer group names: what RocketMQ accepts for group names.
_GROUP_PATTERN = re.compile(r"^[%|a-zA-Z0-9_.:-]{1,255}$")

EARLIEST = "earliest"
LATEST = "latest"
#: Per-queue values in a JSON ``startingOffsets`` (Kafka's convention).
EARLIEST_OFFSET = -2
LATEST_OFFSET = -1

DEFAULT_BATCH_SIZE = 512
DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024
DEFAULT_MAX_IN_FLIGHT = 8
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_PULL_BATCH_SIZE = 256
#: The broker answers at most this many messages per pull.
MAX_PULL_BATCH_SIZE = 1024
#: Producer group of batch (non-streaming) writes when none is given.
DEFAULT_BATCH_PRODUCER_GROUP = "txmq-spark-batch"
#: Prefix of the producer group derived from a streaming query id.
STREAM_PRODUCER_GROUP_PREFIX = "txmq-spark-"

#: Columns the sink understands; any other column is ignored.
SINK_COLUMNS = ("topic", "body", "tags", "keys", "properties")

#: ``{"topic": {"queueId": offset}}``, queue ids as strings (JSON keys).
OffsetMap = dict[str, dict[str, int]]

#: Default of ``maxTriggerDelay`` (Kafka's): 15 minutes.
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0

#: The options besides ``broker`` that say how to reach the broker (sink and source).
_CONNECTION_OPTION_NAMES = (
    "requestTimeout",
    "accessKey",
    "secretKey",
    "tls",
    "tlsCaPath",
    "tlsCertPath",
    "tlsKeyPath",
)

#: Every option the source understands (lower case: Spark's option keys are case-insensitive).
SOURCE_OPTION_NAMES = (
    "broker",
    "topic",
    "subscribePattern",
    "startingOffsets",
    "startingOffsetsByTimestamp",
    "startingTimestamp",
    "endingOffsets",
    "minPartitions",
    "maxMessagesPerTrigger",
    "maxBytesPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "pullBatchSize",
    "failOnDataLoss",
    "pipeline",
    "producerGroup",
    *_CONNECTION_OPTION_NAMES,
)

#: Every option the sink understands (Spark's own :data:`SPARK_SINK_OPTION_NAMES` aside).
SINK_OPTION_NAMES = (
    "broker",
    "topic",
    "producerGroup",
    "queueColumn",
    "batchSize",
    "maxRequestBytes",
    "maxInFlight",
    "pipeline",
    *_CONNECTION_OPTION_NAMES,
)

#: What Spark itself puts into a sink's options: ``writeStream.option("checkpointLocation")``,
#: ``queryName(...)`` and ``start(path)`` / ``save(path)`` (which the sink ignores).
SPARK_SINK_OPTION_NAMES = ("checkpointLocation", "queryName", "path")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|d)\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION_UNITS["d"] = 86400.0


class TxmqOptionError(ValueError):
    """An option of the ``txmq`` data source is missing or has a value that cannot be used."""


def _lower(options: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _get(opts: dict[str, str], name: str) -> str | None:
    value = opts.get(name.lower())
    if value is None:
        return None
    value = value.strip()
    return value or None


T = TypeVar("T")


def _parsed(opts: dict[str, str], name: str, parse: Callable[[str], T], expected: str) -> T | None:
    """The option ``name`` turned into a value by ``parse``, or None when it is not given.

    Raises:
        TxmqOptionError: ``parse`` raised ValueError (the message says ``expected``).
    """
    raw = _get(opts, name)
    if raw is None:
        return None
    try:
        return parse(raw)
    except ValueError:
        raise TxmqOptionError(f"option {name!r} must be {expected}, got {raw!r}") from None


def _int(
    opts: dict[str, str], name: str, default: int, *, minimum: int = 1, maximum: int | None = None
) -> int:
    value = _parsed(opts, name, int, "an integer")
    if value is None:
        return default
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise TxmqOptionError(f"option {name!r} must be {bounds}, got {value}")
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError(raw)
    return value


def _float(opts: dict[str, str], name: str, default: float) -> float:
    value = _parsed(opts, name, _positive_float, "a positive number of seconds")
    return default if value is None else value


_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _boolean(raw: str) -> bool:
    try:
        return _BOOLEANS[raw.lower()]
    except KeyError:
        raise ValueError(raw) from None


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    value = _parsed(opts, name, _boolean, "true or false")
    return default if value is None else value


@dataclass(frozen=True)
class TlsOptions:
    """TLS to the broker (options ``tls``, ``tlsCaPath``, ``tlsCertPath``, ``tlsKeyPath``).

    Only file paths: an :class:`ssl.SSLContext` cannot be pickled, so every driver callback and
    executor task builds its own from these (:func:`txmq.spark_connector.session.ssl_context`).

    Attributes:
        ca_path: PEM CA bundle the broker's certificate is checked against, or None for the
            system's CA store.
        cert_path: client certificate for mutual TLS, or None.
        key_path: its private key, or None.
    """

    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None


def _tls_options(opts: dict[str, str]) -> TlsOptions | None:
    """``tls`` / ``tlsCaPath`` / ``tlsCertPath`` / ``tlsKeyPath``: a path turns TLS on."""
    ca, cert, key = _get(opts, "tlsCaPath"), _get(opts, "tlsCertPath"), _get(opts, "tlsKeyPath")
    if bool(cert) != bool(key):
        raise TxmqOptionError(
            "options tlsCertPath and tlsKeyPath go together: give both (a client certificate "
            "for mutual TLS) or neither"
        )
    paths = [n for n, v in (("tlsCaPath", ca), ("tlsCertPath", cert), ("tlsKeyPath", key)) if v]
    enabled = _bool(opts, "tls", bool(paths))
    if not enabled and paths:
        raise TxmqOptionError(
            f"option tls is false, but {' and '.join(paths)} {'is' if len(paths) == 1 else 'are'}"
            " only used with TLS: drop them or set tls to true"
        )
    return TlsOptions(ca, cert, key) if enabled else None


@dataclass(frozen=True)
class _ConnectionOptions:
    """The options of the sink and the source that say how to reach the broker.

    Attributes:
        broker: ``host:port``.
        request_timeout: seconds to wait for each answer.
        access_key: the ACL account requests are signed with, or None.
        secret_key: its secret (never in ``repr``).
        tls: TLS to the broker, or None for plain TCP.
    """

    broker: str
    request_timeout: float = field(default=DEFAULT_REQUEST_TIMEOUT, kw_only=True)
    access_key: str | None = field(default=None, kw_only=True)
    secret_key: str | None = field(default=None, repr=False, kw_only=True)
    tls: TlsOptions | None = field(default=None, kw_only=True)

    @property
    def credentials(self) -> Credentials | None:
        if not self.access_key or not self.secret_key:
            return None
        return Credentials(self.access_key, self.secret_key)


def _connection_options(opts: dict[str, str]) -> dict[str, Any]:
    """The keyword arguments of :class:`_ConnectionOptions`: ``broker``, ``requestTimeout``,
    ``accessKey`` / ``secretKey`` (both or neither) and the TLS options."""
    access_key, secret_key = _get(opts, "accessKey"), _get(opts, "secretKey")
    if bool(access_key) != bool(secret_key):
        raise TxmqOptionError(
            "options accessKey and secretKey go together: give both (an ACL account) or neither"
        )
    return {
        "broker": parse_broker(_get(opts, "broker")),
        "request_timeout": _float(opts, "requestTimeout", DEFAULT_REQUEST_TIMEOUT),
        "access_key": access_key or None,
        "secret_key": secret_key or None,
        "tls": _tls_options(opts),
    }


def parse_broker(raw: str | None) -> str:
    """Check a ``host:port`` broker address.

    Raises:
        TxmqOptionError: missing or not ``host:port``.
    """
    if raw is None:
        raise TxmqOptionError(
            "option 'broker' is required: the broker address as host:port, e.g. "
            ".option('broker', '127.0.0.1:10911')"
        )
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TxmqOptionError(f"option 'broker' must be host:port, got {raw!r}")
    return raw


def validate_topic(topic: str, option: str = "topic") -> str:
    """Check one topic name.

    Raises:
        TxmqOptionError: not a valid topic name.
    """
    if not (0 < len(topic) <= TOPIC_MAX_LENGTH and TOPIC_PATTERN.match(topic)):
        raise TxmqOptionError(
            f"option {option!r}: {topic!r} is not a valid topic name (letters, digits, '%', "
            "'|', '_' and '-', at most 127 characters)"
        )
    return topic


def validate_group(group: str, option: str = "producerGroup") -> str:
    """Check a producer group name.

    Raises:
        TxmqOptionError: not a valid group name.
    """
    if not _GROUP_PATTERN.match(group):
        raise TxmqOptionError(
            f"option {option!r}: {group!r} is not a valid group name (letters, digits, '%', "
            "'|', '_', '.', ':' and '-')"
        )
    return group


def stream_producer_group(query_id: str) -> str:
    """The producer group a streaming query's sink uses when none is configured.

    The query id is kept in the checkpoint, so a query restarted from its checkpoint keeps its
    group, and a replayed batch finds the decision of its first run.
    """
    return validate_group(STREAM_PRODUCER_GROUP_PREFIX + query_id)


def pipeline_producer_group(pipeline: str) -> str:
    """The producer group of a pipeline's sink (and where its source asks for its position)
    when none is configured: the pipeline's name outlives the query id."""
    return validate_group(STREAM_PRODUCER_GROUP_PREFIX + pipeline)


def offsets_text(offsets: Mapping[str, Mapping[Any, int]]) -> str:
    """Source offsets as the canonical text a pipeline's batch decision records (and the
    broker compares): normalized, compact JSON."""
    return json.dumps(normalize_offsets(offsets), separators=(",", ":"))


# --- sink -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkOptions(_ConnectionOptions):
    """Validated options of the sink (and those of :class:`_ConnectionOptions`).

    Attributes:
        topic: the default topic, or None when each row names its topic.
        producer_group: the configured producer group, or None to derive it.
        queue_column: the column whose value picks the queue, or None to spread rows.
        batch_size: most messages per request.
        max_request_bytes: most body bytes per request.
        max_in_flight: requests one task keeps in flight.
    """

    topic: str | None = None
    producer_group: str | None = None
    queue_column: str | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    #: ``pipeline``: the name of a txmq -> txmq pipeline; each batch decision then records
    #: the source offsets it consumed (read from the checkpoint's offset log).
    pipeline: str | None = None
    #: ``checkpointLocation`` as Spark passed it (a pipeline's sink reads its offset log).
    checkpoint_location: str | None = None


def parse_sink_options(options: Mapping[str, Any]) -> SinkOptions:
    """Parse the sink's options.

    Raises:
        TxmqOptionError: a missing, invalid or unknown option.
    """
    check_known_options(options, SINK_OPTION_NAMES, "sink", SPARK_SINK_OPTION_NAMES)
    opts = _lower(options)
    topic = _get(opts, "topic")
    group = _get(opts, "producerGroup")
    pipeline = _get(opts, "pipeline")
    if pipeline is not None:
        validate_group(pipeline, "pipeline")
    return SinkOptions(
        pipeline=pipeline,
        checkpoint_location=_get(opts, "checkpointLocation"),
        **_connection_options(opts),
        topic=validate_topic(topic) if topic is not None else None,
        producer_group=validate_group(group) if group is not None else None,
        queue_column=_get(opts, "queueColumn"),
        batch_size=_int(opts, "batchSize", DEFAULT_BATCH_SIZE, maximum=100_000),
        max_request_bytes=_int(
            opts,
            "maxRequestBytes",
            DEFAULT_MAX_REQUEST_BYTES,
            minimum=1024,
            maximum=4 * 1024 * 1024,
        ),
        max_in_flight=_int(opts, "maxInFlight", DEFAULT_MAX_IN_FLIGHT, maximum=64),
    )


#: Spark type names (``DataType.typeName()``) each sink column accepts.
_SINK_COLUMN_TYPES: dict[str, tuple[str, ...]] = {
    "topic": ("string",),
    "body": ("binary", "string"),
    "tags": ("string",),
    "keys": ("string",),
    "properties": ("map<string,string>",),
}


def check_sink_schema(columns: Mapping[str, str], options: SinkOptions) -> None:
    """Check the columns of the DataFrame to write, given as ``{name: simpleString type}``.

    Raises:
        TxmqOptionError: ``body`` is missing, a known column has the wrong type, there is
            neither a ``topic`` option nor a ``topic`` column, or the queue column is missing.
    """
    if "body" not in columns:
        raise TxmqOptionError(
            "the DataFrame written to txmq needs a 'body' column (binary or string); it has "
            f"{sorted(columns)}"
        )
    for name, accepted in _SINK_COLUMN_TYPES.items():
        if name in columns and columns[name] not in accepted:
            raise TxmqOptionError(
                f"column {name!r} must be {' or '.join(accepted)}, not {columns[name]}"
            )
    if options.topic is None and "topic" not in columns:
        raise TxmqOptionError(
            "no topic to write to: set .option('topic', ...) or add a 'topic' column"
        )
    if options.queue_column is not None and options.queue_column not in columns:
        raise TxmqOptionError(
            f"option 'queueColumn' names {options.queue_column!r}, which is not a column of "
            f"the DataFrame ({sorted(columns)})"
        )


# --- source -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceOptions(_ConnectionOptions):
    """Validated options of the source (and those of :class:`_ConnectionOptions`).

    Attributes:
        topics: the topics to read, in the order given.
        starting_offsets: ``"earliest"``, ``"latest"``, or a per-queue map (values may be
            :data:`EARLIEST_OFFSET` / :data:`LATEST_OFFSET`).
        topic_pattern: ``subscribePattern`` (then ``topics`` is empty), or None.
        starting_timestamps: ``startingOffsetsByTimestamp``, epoch ms per queue, or None.
        starting_timestamp: ``startingTimestamp``, epoch ms for every queue, or None.
        ending_offsets: ``"latest"`` or a per-queue map (batch reads only).
        min_partitions: split the ranges into at least this many partitions, or None.
        max_messages_per_trigger: most messages per micro-batch, or None.
        max_bytes_per_trigger: about this many body bytes per micro-batch, or None.
        min_offsets_per_trigger: wait for this many new messages, or None.
        max_trigger_delay: ... but at most this many seconds after the last batch.
        pull_batch_size: messages per pull request.
        fail_on_data_loss: raise when messages in range were deleted by retention.
    """

    topics: tuple[str, ...]
    starting_offsets: str | OffsetMap = EARLIEST
    topic_pattern: str | None = None
    starting_timestamps: OffsetMap | None = None
    starting_timestamp: int | None = None
    ending_offsets: str | OffsetMap = LATEST
    min_partitions: int | None = None
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY
    pull_batch_size: int = DEFAULT_PULL_BATCH_SIZE
    fail_on_data_loss: bool = True
    #: ``pipeline``: resume from, and replan, what the pipeline's sink recorded.
    pipeline: str | None = None
    #: ``producerGroup``: the pipeline sink's producer group, when not the default.
    producer_group: str | None = None

    def wants(self, topic: str) -> bool:
        """Whether ``topic`` is read: named in ``topic`` or matched by ``subscribePattern``."""
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


def parse_topics(raw: str | None) -> tuple[str, ...]:
    """``"a, b"`` -> ``("a", "b")`` (duplicates dropped).

    Raises:
        TxmqOptionError: no topic, or an invalid name.
    """
    if raw is None:
        raise TxmqOptionError(
            "option 'topic' is required: one topic or several separated by commas"
        )
    topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    if not topics:
        raise TxmqOptionError("option 'topic' names no topic")
    for t in topics:
        validate_topic(t)
    return topics


def _offset_map(
    raw: str,
    name: str,
    wanted: Any,
    describe: str,
    *,
    minimum: int,
    values: str,
) -> OffsetMap:
    """A JSON ``{"topic": {"queueId": value}}`` map over topics ``wanted(topic)`` accepts."""
    try:
        doc = json.loads(raw)
    except ValueError:
        raise TxmqOptionError(f"option {name!r} must be {describe}, got {raw!r}") from None
    if not isinstance(doc, dict):
        raise TxmqOptionError(f"option {name!r} must be a JSON object of topics, got {raw!r}")
    out: OffsetMap = {}
    for topic, queues in doc.items():
        if not wanted(topic):
            raise TxmqOptionError(
                f"option {name!r} names topic {topic!r}, which is not read ({wanted.__doc__})"
            )
        if not isinstance(queues, dict):
            raise TxmqOptionError(
                f"option {name!r}: topic {topic!r} needs an object of queue offsets, got {queues!r}"
            )
        qmap: dict[str, int] = {}
        for qid, offset in queues.items():
            if not _QUEUE_KEY.fullmatch(str(qid)):
                raise TxmqOptionError(
                    f"option {name!r}: {qid!r} of topic {topic!r} is not a queue id (a number, "
                    "or '<broker group>:<number>' for a topic in several groups of a cluster)"
                )
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < minimum:
                raise TxmqOptionError(
                    f"option {name!r}: {offset!r} of {topic!r} queue {qid} must be {values}"
                )
            qmap[queue_key(*split_queue_key(str(qid)))] = offset
        out[topic] = qmap
    return out


def _topic_filter(topics: tuple[str, ...], pattern: str | None) -> Any:
    def wanted(topic: str) -> bool:
        if pattern is not None:
            return re.fullmatch(pattern, topic) is not None
        return topic in topics

    wanted.__doc__ = (
        f"subscribePattern: {pattern}" if pattern is not None else f"topics: {', '.join(topics)}"
    )
    return wanted


def parse_starting_offsets(
    raw: str | None, topics: tuple[str, ...], pattern: str | None = None
) -> str | OffsetMap:
    """Parse ``startingOffsets``.

    Raises:
        TxmqOptionError: not ``earliest``, ``latest`` or a valid JSON offset map over the
            configured topics.
    """
    if raw is None:
        return EARLIEST
    if raw.lower() in (EARLIEST, LATEST):
        return raw.lower()
    return _offset_map(
        raw,
        "startingOffsets",
        _topic_filter(topics, pattern),
        "'earliest', 'latest' or JSON like {\"topic\": {\"0\": 12}}",
        minimum=-2,
        values=">= 0, or -2 (earliest) or -1 (latest)",
    )


def parse_ending_offsets(
    raw: str | None, topics: tuple[str, ...], pattern: str | None = None
) -> str | OffsetMap:
    """Parse ``endingOffsets`` (batch reads): ``latest`` or a JSON map, -1 meaning latest.

    Raises:
        TxmqOptionError: anything else.
    """
    if raw is None or raw.lower() == LATEST:
        return LATEST
    return _offset_map(
        raw,
        "endingOffsets",
        _topic_filter(topics, pattern),
        '\'latest\' or JSON like {"topic": {"0": 12}}',
        minimum=-1,
        values=">= 0, or -1 (latest)",
    )


def parse_duration(raw: str, name: str) -> float:
    """``"500ms"``, ``"30s"``, ``"15m"``, ``"1h"``, ``"1d"`` -> seconds.

    Raises:
        TxmqOptionError: not a number with one of those units.
    """
    m = _DURATION.match(raw)
    if m is None:
        raise TxmqOptionError(
            f"option {name!r} must be a duration such as '500ms', '30s', '15m' or '1h', got {raw!r}"
        )
    return float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]


def check_known_options(
    options: Mapping[str, Any], known: tuple[str, ...], what: str, also: tuple[str, ...] = ()
) -> None:
    """Refuse options nobody reads (a typo would otherwise be silently ignored); ``also`` are
    accepted without being listed as known.

    Raises:
        TxmqOptionError: naming every unknown option.
    """
    names = {k.lower() for k in known + also}
    unknown = sorted(str(k) for k in options if str(k).lower() not in names)
    if unknown:
        raise TxmqOptionError(
            f"unknown option{'s' if len(unknown) > 1 else ''} for the txmq {what}: "
            f"{', '.join(repr(u) for u in unknown)} (known: {', '.join(known)})"
        )


def parse_source_options(options: Mapping[str, Any]) -> SourceOptions:
    """Parse the source's options.

    Raises:
        TxmqOptionError: a missing, invalid or unknown option.
    """
    check_known_options(options, SOURCE_OPTION_NAMES, "source")
    opts = _lower(options)
    raw_topics, pattern = _get(opts, "topic"), _get(opts, "subscribePattern")
    if raw_topics is not None and pattern is not None:
        raise TxmqOptionError("give one of the options 'topic' and 'subscribePattern', not both")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TxmqOptionError(
                f"option 'subscribePattern' is not a regular expression: {pattern!r} ({exc})"
            ) from None
        topics: tuple[str, ...] = ()
    else:
        if raw_topics is None:
            raise TxmqOptionError(
                "option 'topic' is required: one topic or several separated by commas "
                "(or 'subscribePattern', a regular expression)"
            )
        topics = parse_topics(raw_topics)
    starts = [
        n
        for n in ("startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp")
        if _get(opts, n) is not None
    ]
    if len(starts) > 1:
        raise TxmqOptionError(
            f"options {' and '.join(repr(n) for n in starts)} exclude each other: give one"
        )
    by_ts = _get(opts, "startingOffsetsByTimestamp")
    starting_ts = _get(opts, "startingTimestamp")
    min_offsets = _get(opts, "minOffsetsPerTrigger")
    delay = _get(opts, "maxTriggerDelay")
    pipeline, group = _get(opts, "pipeline"), _get(opts, "producerGroup")
    if group is not None and pipeline is None:
        raise TxmqOptionError(
            "option 'producerGroup' of a source names the sink group of its 'pipeline': give "
            "'pipeline' too"
        )
    return SourceOptions(
        pipeline=None if pipeline is None else validate_group(pipeline, "pipeline"),
        producer_group=None if group is None else validate_group(group),
        **_connection_options(opts),
        topics=topics,
        topic_pattern=pattern,
        starting_offsets=parse_starting_offsets(_get(opts, "startingOffsets"), topics, pattern),
        starting_timestamps=None
        if by_ts is None
        else _offset_map(
            by_ts,
            "startingOffsetsByTimestamp",
            _topic_filter(topics, pattern),
            'JSON like {"topic": {"0": 1700000000000}} (epoch milliseconds)',
            minimum=0,
            values="a time in epoch milliseconds (>= 0)",
        ),
        starting_timestamp=None
        if starting_ts is None
        else _int(opts, "startingTimestamp", 0, minimum=0),
        ending_offsets=parse_ending_offsets(_get(opts, "endingOffsets"), topics, pattern),
        min_partitions=_optional_int(opts, "minPartitions"),
        max_messages_per_trigger=_optional_int(opts, "maxMessagesPerTrigger"),
        max_bytes_per_trigger=_optional_int(opts, "maxBytesPerTrigger"),
        min_offsets_per_trigger=None
        if min_offsets is None
        else _int(opts, "minOffsetsPerTrigger", 0),
        max_trigger_delay=DEFAULT_MAX_TRIGGER_DELAY
        if delay is None
        else parse_duration(delay, "maxTriggerDelay"),
        pull_batch_size=_int(
            opts, "pullBatchSize", DEFAULT_PULL_BATCH_SIZE, maximum=MAX_PULL_BATCH_SIZE
        ),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
    )


def _optional_int(opts: dict[str, str], name: str) -> int | None:
    return None if _get(opts, name) is None else _int(opts, name, 0)


# --- offsets ----------------------------------------------------------------------------------


#: A queue's key in offset maps: its id, or ``<broker group>:<id>`` for a topic that lives in
#: several broker groups of a cluster (the same id exists once per group).
_QUEUE_KEY = re.compile(r"(?:[^:]+:)?\d+")


def queue_key(broker: str | None, queue_id: int) -> str:
    """The offset-map key of a queue (see :data:`_QUEUE_KEY`)."""
    return f"{broker}:{int(queue_id)}" if broker else str(int(queue_id))


def split_queue_key(key: str) -> tuple[str | None, int]:
    """``(broker group or None, queue id)`` of an offset-map key."""
    broker, _, qid = str(key).rpartition(":")
    return (broker or None, int(qid))


def _queue_order(key: Any) -> tuple[str, int]:
    broker, qid = split_queue_key(str(key))
    return (broker or "", qid)


def normalize_offsets(offsets: Mapping[str, Mapping[Any, int]]) -> OffsetMap:
    """Offsets in one canonical order (topics by name, queues by group and number).

    Spark compares offsets by their JSON text, so the same positions must always serialise the
    same way.
    """
    return {
        topic: {
            str(q): int(o) for q, o in sorted(queues.items(), key=lambda kv: _queue_order(kv[0]))
        }
        for topic, queues in sorted(offsets.items())
    }


def share_budget(
    backlogs: Mapping[tuple[str, str], int], budget: int
) -> dict[tuple[str, str], int]:
    """Split at most ``budget`` messages over queues fairly (water filling).

    Queues with a small backlog take all of it; the rest share what is left evenly.  Every call
    with ``budget >= 1`` and some backlog grants at least one message, so a query always makes
    progress.

    Args:
        backlogs: messages waiting per ``(topic, queueId)``.
        budget: most messages in all.

    Returns:
        Messages granted per queue (queues with a backlog only).
    """
    items = sorted(((n, key) for key, n in backlogs.items() if n > 0))
    grant: dict[tuple[str, str], int] = {}
    remaining = budget
    for i, (n, key) in enumerate(items):
        share = remaining // (len(items) - i)
        take = min(n, share)
        if take > 0:
            grant[key] = take
            remaining -= take
    return grant


Q = TypeVar("Q")


def split_ranges(
    ranges: list[tuple[str, Q, int, int]], min_partitions: int | None
) -> list[tuple[str, Q, int, int]]:
    """Split ``(topic, queue, start, end)`` ranges until there are at least ``min_partitions``
    (``minPartitions``), always halving the largest range; ranges of one message stay whole.

    The result covers exactly the same offsets, each once.
    """
    out = [r for r in ranges if r[3] > r[2]]
    if min_partitions is None:
        return out
    while len(out) < min_partitions:
        i = max(range(len(out)), key=lambda k: out[k][3] - out[k][2], default=-1)
        if i < 0:
            break
        topic, q, s, e = out[i]
        if e - s < 2:
            break
        mid = s + (e - s) // 2
        out[i : i + 1] = [(topic, q, s, mid), (topic, q, mid, e)]
    return out


def rows_for_bytes(max_bytes: int, sample_sizes: list[int]) -> int:
    """How many messages fit in ``max_bytes`` (``maxBytesPerTrigger``), from the body sizes of
    a sample of the next messages; at least one, so a query always makes progress."""
    if not sample_sizes:
        return max(1, max_bytes)
    average = max(1.0, sum(sample_sizes) / len(sample_sizes))
    return max(1, int(max_bytes // average))


def admit_batch(
    backlog: int, min_offsets: int | None, since_last_batch: float | None, max_delay: float
) -> bool:
    """Whether a micro-batch may start now (``minOffsetsPerTrigger`` / ``maxTriggerDelay``):
    there is a backlog, and either it reaches ``min_offsets``, or ``max_delay`` seconds passed
    since the last batch (or there was none yet in this run)."""
    if backlog <= 0:
        return False
    if min_offsets is None or backlog >= min_offsets or since_last_batch is None:
        return True
    return since_last_batch >= max_delay


def offsets_behind(source_progress: Mapping[str, Any]) -> dict[str, int]:
    """Kafka's source metrics from one entry of ``query.lastProgress["sources"]``: how many
    messages each queue's ``endOffset`` is behind its ``latestOffset`` -- ``min``, ``max``,
    ``avg`` and ``total`` over the queues (``OffsetsBehindLatest`` suffixed, as Kafka names
    them).  Empty when the progress has no offsets."""

    def load(v: Any) -> Any:
        return json.loads(v) if isinstance(v, str) else v

    end, latest = load(source_progress.get("endOffset")), load(source_progress.get("latestOffset"))
    if not isinstance(end, dict) or not isinstance(latest, dict):
        return {}
    behind = [
        max(0, int(o) - int(end.get(t, {}).get(q, 0)))
        for t, queues in latest.items()
        for q, o in queues.items()
    ]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": min(behind),
        "maxOffsetsBehindLatest": max(behind),
        "avgOffsetsBehindLatest": sum(behind) // len(behind),
        "totalOffsetsBehindLatest": sum(behind),
    }

"""Broker configuration: one frozen dataclass, resolved in one function.

Keys are RocketMQ's ``BrokerConfig`` / ``MessageStoreConfig`` names (camelCase in TOML files and
on ``--set``), so an operator's knowledge carries over; Python code uses the snake_case attribute.

Precedence: defaults in code, then the TOML file, then the environment (``TXMQ_`` + the key in
upper snake case, e.g. ``TXMQ_LISTEN_PORT``, ``TXMQ_FLUSH_DISK_TYPE``), then command-line flags.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import structlog

from txmq.protocol.headers import camel

from .store.config import DISK_FULL_POLICIES

log = structlog.get_logger(__name__)

GiB = 1024 * 1024 * 1024
MiB = 1024 * 1024

FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")
#: Transports of the gRPC port (``grpcTransport``).
GRPC_TRANSPORTS = ("native", "grpcio")


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key and the source."""


@dataclass(frozen=True)
class BrokerConfig:
    # -- identity and network --------------------------------------------------------------
    broker_name: str = "broker-a"
    broker_cluster_name: str = "DefaultCluster"
    broker_id: int = 0
    #: Address clients are told to use (route answers, offsetMsgId).
    broker_i_p1: str = "127.0.0.1"
    #: Cluster mode: the address the other replicas of the group replicate through (RocketMQ's
    #: HA address); empty = ``brokerIP1``.
    broker_i_p2: str = ""
    #: Interface the server binds; 127.0.0.1 unless configured otherwise.
    bind_address: str = "127.0.0.1"
    listen_port: int = 10911
    #: Largest frame accepted, in bytes (refused as soon as the length prefix arrives).
    max_frame_size: int = 16 * MiB
    #: A connection with no HEART_BEAT for this long is closed (ms).
    channel_expired_timeout: int = 120_000
    #: A client that leaves more than this many bytes of answers unread is dropped (reading
    #: its requests pauses long before, so what the broker holds for it stays bounded).
    max_connection_write_buffer: int = 64 * MiB
    #: A frame must arrive whole within this many ms of its first byte; a client holding a
    #: partial frame longer (a slow-loris) is dropped (0: no limit).
    frame_read_timeout: int = 30_000
    #: A client that acknowledges none of its answers for this many ms is dropped (0: never):
    #: counted from when writing to it paused (its socket and the broker's buffer full), or
    #: else from when the kernel was first seen holding answers for it.
    client_write_stall_timeout: int = 30_000
    #: A connection that has sent no whole frame this many ms after it was accepted is closed
    #: (0: never); also the gRPC port's HTTP/2 handshake deadline.
    client_first_frame_timeout: int = 60_000

    # -- store -------------------------------------------------------------------------------
    store_path_root_dir: str = "./data"
    flush_disk_type: str = "ASYNC_FLUSH"
    #: ASYNC_FLUSH: fsync the commit log this often (ms).
    flush_interval_commit_log: int = 500
    #: SYNC_FLUSH: answer FLUSH_DISK_TIMEOUT if the fsync takes longer (ms).
    sync_flush_timeout: int = 5000
    mapped_file_size_commit_log: int = 1 * GiB
    mapped_file_size_consume_queue: int = 300_000 * 20
    #: Consume-queue files kept open at most; the least recently used is closed (fsynced
    #: first) to open another.  0: half the open-files limit (the soft RLIMIT_NOFILE, raised
    #: to the hard limit at start-up).
    max_open_consume_queue_files: int = 0
    #: Commit-log segments older than this are deleted (hours).
    file_reserved_time: float = 72.0
    #: The disk is short of space past this (percent): what retention then does is
    #: ``diskFullPolicy``'s choice.
    disk_max_used_space_ratio: int = 75
    #: Past ``diskMaxUsedSpaceRatio``: ``refuse_writes`` (default) deletes no segment before
    #: its time -- unread messages are kept, and writes are refused past
    #: ``diskRefuseWritesRatio`` -- while ``delete_oldest`` (RocketMQ's forced clean-up) deletes
    #: the oldest segments, read or not, until the disk is below the ratio again.
    disk_full_policy: str = "refuse_writes"
    #: Writes (sends, decisions) are refused with a clear error past this (percent) until
    #: space is freed; reads, heartbeats and offset commits go on.
    disk_refuse_writes_ratio: int = 90
    #: How often retention runs (ms).
    clean_resource_interval: int = 10_000
    max_message_size: int = 4 * MiB
    flush_consumer_offset_interval: int = 5000

    # -- topics ------------------------------------------------------------------------------
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 4
    long_polling_enable: bool = True
    #: Serve SQL92 property filters (evaluated on the broker).  On by default, unlike
    #: RocketMQ: txmq evaluates filters where a pull reads the message, with no extra index to
    #: build or store (RocketMQ's off default guards its consume-queue bloom-filter extension).
    enable_property_filter: bool = True
    #: Delay levels for delayed messages and consumer retries (RocketMQ's default scale).
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    max_reconsume_times: int = 16
    #: The longest wait a timer message may ask for (s): a delivery time further ahead is refused
    #: (RocketMQ 5's timer, default 3 days).
    timer_max_delay_sec: int = 259_200

    # -- transactions ------------------------------------------------------------------------
    transaction_time_out: int = 6000
    transaction_check_interval: int = 30_000
    transaction_check_max: int = 15
    reject_transaction_message: bool = False
    #: How long the broker waits for a producer to acknowledge a CHECK_TRANSACTION_STATE (ms).
    transaction_check_request_timeout: int = 3000
    #: How long a decided transaction is remembered (ms): within it a repeated decision is
    #: answered as the first one was and a contradicting one is refused; after it the record
    #: is dropped from memory (a late END_TRANSACTION then gets "Find prepared transaction
    #: message failed", as from RocketMQ).
    transaction_decided_retention: int = 300_000
    #: How long a batch decision (TXMQ_DECIDE_BATCH, the Spark sink) is remembered (ms); a
    #: streaming query that replays a batch finds its decision within this time.  Default: the
    #: store's retention (fileReservedTime).
    transaction_batch_retention: int = 72 * 3_600_000
    #: How often the transaction table is snapshotted (ms), so a restart replays only the
    #: half and op records written since; also on every clean shutdown.
    transaction_snapshot_interval: int = 60_000
    #: Body bytes of the recently stored halves kept in memory, so that a decision that follows
    #: soon builds its committed messages without reading the halves back from the commit log.
    #: The default holds a 100,000-row Spark micro-batch of 1 KiB rows; 0 keeps none.
    transaction_recent_halves_bytes: int = 192 * 1024 * 1024

    # -- idempotent sends ------------------------------------------------------------------
    #: A resend of a message (same topic and UNIQ_KEY) stored within this many seconds is
    #: answered with the first send's result instead of being stored again (0 = off).
    duplicate_window_seconds: int = 120
    #: At most this many send ids are remembered (about 150 bytes each); past it the oldest
    #: are forgotten before the window ends, with a warning.
    duplicate_window_max_entries: int = 200_000

    # -- performance -------------------------------------------------------------------------
    #: The direct paths (broker/messaging/fastpath.py): store a send straight from the request
    #: when it qualifies -- a batch of plain messages or of one transaction's halves, one plain
    #: message or one half -- the same bytes and answer as the generic path, which takes the
    #: rest; ``txmq_send_path_total{path}`` counts which path each remoting send took.  Its
    #: old name ``batchFastPathEnable`` is still read (with a warning).
    fast_path_enable: bool = True

    # -- message index (docs/operations.md) ----------------------------------------------------
    #: Index every stored message's KEYS and UNIQ_KEY for QUERY_MESSAGE (``txmq message find``).
    message_index_enable: bool = True
    #: Hash slots and entries of one index file (a new file starts when one is full).
    max_hash_slot_num: int = 1_000_000
    max_index_num: int = 4_000_000

    # -- message trace (docs/operations.md) ----------------------------------------------------
    #: The broker records every stored message, each step of a transaction's life and each
    #: send-back in the trace topic (RocketMQ's name; off by default: then nothing is written).
    trace_topic_enable: bool = False
    #: The trace topic (RocketMQ's ``msgTraceTopicName``); created at start when tracing is on.
    msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC"

    # -- operations --------------------------------------------------------------------------
    #: Serve Prometheus metrics over HTTP on this port (0 = off).
    metrics_port: int = 0
    #: ``/healthz`` on the metrics port answers 503 once the event loop has not turned for this
    #: many seconds (0: never): a blocked loop answers no client (docs/operations.md).
    healthz_loop_stall_seconds: float = 10.0
    #: The commit-log scrub (docs/operations.md) reads and checks every record below the
    #: flushed offset again, at most this many bytes a second (0 = off).
    commit_log_scrub_bytes_per_second: int = 1024 * 1024
    #: Seconds from the start of one scrub pass to the start of the next (at least).
    commit_log_scrub_interval_seconds: int = 3600
    #: Seconds a SIGTERM shutdown waits for in-flight requests.
    shutdown_timeout: float = 10.0

    # -- RocketMQ 5 gRPC front end (txmq[grpc]) -------------------------------------------
    #: Serve apache.rocketmq.v2.MessagingService (needs the ``grpc`` extra).
    grpc_server_enable: bool = False
    #: Its port (RocketMQ's proxy default); 0 picks a free port.
    grpc_server_port: int = 8081
    #: What serves it: ``native`` (txmq's own HTTP/2 on the broker's loop) or ``grpcio``
    #: (``grpc.aio``, the fallback).
    grpc_transport: str = "native"

    # -- security (docs/security.md) -----------------------------------------------------------
    #: Check every remoting request against the ACL file (RocketMQ's ACL 1.0, plain access).
    acl_enable: bool = False
    #: The accounts, in RocketMQ's plain_acl.yml format (relative to the working directory,
    #: like storePathRootDir).
    plain_acl_file: str = "config/plain_acl.yml"
    #: ACL 2.0 (RocketMQ 5.3's users and policies, managed with the AUTH_* requests): every
    #: request must be signed by a known, enabled user.
    authentication_enabled: bool = False
    #: ACL 2.0: every request is checked against its user's policies (needs
    #: authenticationEnabled).
    authorization_enabled: bool = False
    #: ACL 2.0: a super user created at start when there is none of its name (a UserInfo
    #: JSON, ``{"username": "admin", "password": "..."}``), to create the others with.
    init_authentication_user: str = ""
    #: Quotas (docs/operations.md): the default produce and consume byte rates (bytes/s) and
    #: open connections of an ACL account without its own (``produceByteRate``,
    #: ``consumeByteRate``, ``maxConnections`` in its entry), and of each client address when
    #: clients have no account; 0 = unlimited.
    quota_produce_byte_rate: int = 0
    quota_consume_byte_rate: int = 0
    quota_max_connections: int = 0
    #: A request over a byte rate is delayed up to this long (ms); one that would wait longer
    #: is refused with SYSTEM_BUSY ``[TOO_MANY_REQUESTS]``.
    quota_max_throttle_ms: int = 1000
    #: TLS on the remoting port (RocketMQ's ``tls.server.mode``): ``disabled``, ``permissive``
    #: (TLS and plain clients on one port) or ``enforcing`` (TLS only).
    tls_server_mode: str = "disabled"
    #: The broker's certificate chain (PEM), ``tls.server.certPath``.
    tls_server_cert_path: str = ""
    #: Its private key (PEM, unencrypted), ``tls.server.keyPath``.
    tls_server_key_path: str = ""
    #: CA certificates client certificates are checked against, ``tls.server.trustCertPath``.
    tls_server_trust_cert_path: str = ""
    #: Mutual TLS, ``tls.server.need.client.auth``: ``none``, ``optional`` (a certificate, if
    #: sent, must be valid) or ``require``.
    tls_server_need_client_auth: str = "none"
    #: Seconds a TLS handshake may take before the connection is closed.
    tls_handshake_timeout: float = 10.0

    # -- cluster mode (docs/cluster.md) ---------------------------------------------------------
    #: etcd members (``host:port,host:port``); empty runs a single node.  Set, the broker is a
    #: replica (``brokerId``) of the broker group ``brokerName`` in ``brokerClusterName``.
    etcd_endpoints: str = ""
    #: Seconds a replica's etcd lease lives without a keep-alive: how long a leader cut off from
    #: etcd but not from its followers keeps its group waiting before another replica is
    #: elected (a dead or silent leader is deposed within a second or two; docs/cluster.md).
    etcd_lease_ttl: int = 5
    #: Replicas of a group a write must be on (the leader included) before it is acknowledged.
    min_in_sync_replicas: int = 2
    #: Replicas a group is meant to have (``txmq cluster status`` flags fewer in sync).
    in_sync_replicas: int = 3
    #: A follower this long (ms) behind the leader's end leaves the in-sync set.
    ha_max_time_slave_not_catchup: int = 3000
    #: Routes also name each follower as a write-only broker that forwards sends to the leader
    #: (stock producers retry on it while a dead leader is replaced; docs/cluster.md).
    route_write_replicas: bool = True

    # The settings' checks in turn (the first failure is the error): split, one is harder to find.
    def __post_init__(self) -> None:
        if not (1 <= self.max_hash_slot_num < 2**31 and 1 <= self.max_index_num < 2**31):
            raise ConfigError("maxHashSlotNum and maxIndexNum must be between 1 and 2^31 - 1")
        if self.commit_log_scrub_bytes_per_second < 0 or self.commit_log_scrub_interval_seconds < 0:
            raise ConfigError(
                "commitLogScrubBytesPerSecond and commitLogScrubIntervalSeconds must be >= 0"
            )
        self._check_tls()
        if self.flush_disk_type not in FLUSH_TYPES:
            raise ConfigError(
                f"flushDiskType must be one of {', '.join(FLUSH_TYPES)}, got {self.flush_disk_type!r}"
            )
        if not 0 <= self.listen_port <= 65535:
            raise ConfigError(f"listenPort must be 0..65535, got {self.listen_port}")
        if self.disk_full_policy not in DISK_FULL_POLICIES:
            raise ConfigError(
                f"diskFullPolicy must be one of {', '.join(DISK_FULL_POLICIES)}, "
                f"got {self.disk_full_policy!r}"
            )
        if not 0 < self.disk_refuse_writes_ratio <= 100:
            raise ConfigError(
                f"diskRefuseWritesRatio must be 1..100, got {self.disk_refuse_writes_ratio}"
            )
        for attr in (
            "frame_read_timeout",
            "client_write_stall_timeout",
            "client_first_frame_timeout",
            "quota_produce_byte_rate",
            "quota_consume_byte_rate",
            "quota_max_connections",
            "quota_max_throttle_ms",
        ):
            if getattr(self, attr) < 0:
                raise ConfigError(f"{key_name(attr)} must be 0 or more, got {getattr(self, attr)}")
        if self.etcd_endpoints:
            if self.listen_port == 0:
                raise ConfigError("cluster mode (etcdEndpoints) needs a fixed listenPort")
            if self.grpc_server_enable and self.grpc_server_port == 0:
                raise ConfigError(
                    "cluster mode with grpcServerEnable needs a fixed grpcServerPort (routes "
                    "name it)"
                )
            if self.etcd_lease_ttl < 2:
                raise ConfigError(f"etcdLeaseTtl must be at least 2 s, got {self.etcd_lease_ttl}")
            if self.min_in_sync_replicas < 1:
                raise ConfigError(
                    f"minInSyncReplicas must be at least 1, got {self.min_in_sync_replicas}"
                )
        if self.authorization_enabled and not self.authentication_enabled:
            raise ConfigError("authorizationEnabled needs authenticationEnabled")
        if self.acl_enable and self.authentication_enabled:
            raise ConfigError(
                "aclEnable (ACL 1.0) and authenticationEnabled (ACL 2.0) cannot both be on"
            )
        if self.grpc_transport not in GRPC_TRANSPORTS:
            raise ConfigError(
                f"grpcTransport must be one of {', '.join(GRPC_TRANSPORTS)}, "
                f"got {self.grpc_transport!r}"
            )
        if not 0 <= self.grpc_server_port <= 65535:
            raise ConfigError(f"grpcServerPort must be 0..65535, got {self.grpc_server_port}")
        if self.mapped_file_size_commit_log < 4096:
            raise ConfigError("mappedFileSizeCommitLog must be at least 4096 bytes")
        if self.max_message_size >= self.mapped_file_size_commit_log:
            raise ConfigError("maxMessageSize must be smaller than mappedFileSizeCommitLog")
        if self.default_topic_queue_nums < 1:
            raise ConfigError("defaultTopicQueueNums must be at least 1")
        delay_levels(self.message_delay_level)
        for attr, low in (
            ("file_reserved_time", 0),
            ("disk_max_used_space_ratio", 0),
            ("max_reconsume_times", 0),
            ("transaction_time_out", 0),
            ("transaction_check_interval", 1),
            ("transaction_check_max", 0),
        ):
            if getattr(self, attr) < low:
                raise ConfigError(
                    f"{key_name(attr)} must be at least {low}, got {getattr(self, attr)}"
                )
        if self.disk_max_used_space_ratio > 100:
            raise ConfigError(
                f"diskMaxUsedSpaceRatio must be 0..100, got {self.disk_max_used_space_ratio}"
            )
        if self.healthz_loop_stall_seconds < 0:
            raise ConfigError(
                f"healthzLoopStallSeconds must be 0 or more, got {self.healthz_loop_stall_seconds}"
            )
        if self.timer_max_delay_sec < 1:
            raise ConfigError(
                f"timerMaxDelaySec must be at least 1, got {self.timer_max_delay_sec}"
            )

    def _check_tls(self) -> None:
        from .tls import CLIENT_AUTH, MODES

        if self.tls_server_mode not in MODES:
            raise ConfigError(
                f"tls.server.mode must be one of {', '.join(MODES)}, got {self.tls_server_mode!r}"
            )
        if self.tls_server_need_client_auth not in CLIENT_AUTH:
            raise ConfigError(
                "tls.server.need.client.auth must be one of "
                f"{', '.join(CLIENT_AUTH)}, got {self.tls_server_need_client_auth!r}"
            )
        if self.tls_server_mode == "disabled":
            return
        for attr in ("tls_server_cert_path", "tls_server_key_path"):
            if not getattr(self, attr):
                raise ConfigError(
                    f"tls.server.mode = {self.tls_server_mode} needs {key_name(attr)}"
                )
        if self.tls_server_need_client_auth != "none" and not self.tls_server_trust_cert_path:
            raise ConfigError(
                f"tls.server.need.client.auth = {self.tls_server_need_client_auth} needs "
                "tls.server.trustCertPath (the CA client certificates are checked against)"
            )
        if self.tls_handshake_timeout <= 0:
            raise ConfigError("tlsHandshakeTimeout must be positive")

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == "SYNC_FLUSH"

    def replace(self, **changes: Any) -> BrokerConfig:
        return dataclasses.replace(self, **changes)

    def as_rocketmq_dict(self) -> dict[str, Any]:
        return {key_name(f.name): getattr(self, f.name) for f in fields(self)}


#: Keys whose RocketMQ names are not the camelCase of the attribute (RocketMQ's TLS keys are
#: dotted: ``tls.server.mode``).  Their environment variables follow the attribute
#: (``TXMQ_TLS_SERVER_MODE``).
_ALIASES = {
    "broker_i_p1": "brokerIP1",
    "broker_i_p2": "brokerIP2",
    "tls_server_mode": "tls.server.mode",
    "tls_server_cert_path": "tls.server.certPath",
    "tls_server_key_path": "tls.server.keyPath",
    "tls_server_trust_cert_path": "tls.server.trustCertPath",
    "tls_server_need_client_auth": "tls.server.need.client.auth",
}


def key_name(attr: str) -> str:
    """The RocketMQ key of an attribute (``broker_i_p1`` -> ``brokerIP1``,
    ``tls_server_mode`` -> ``tls.server.mode``)."""
    return _ALIASES.get(attr) or camel(attr)


def env_name(attr: str) -> str:
    if attr in ("broker_i_p1", "broker_i_p2"):
        return "TXMQ_BROKER_IP" + attr[-1]
    return "TXMQ_" + attr.upper()


#: Every setting's field by its RocketMQ key.
KEY_FIELDS = {key_name(f.name): f for f in fields(BrokerConfig)}


def attr_name(key: str) -> str:
    """The attribute of a RocketMQ key (``maxMessageSize`` -> ``max_message_size``)."""
    return KEY_FIELDS[key].name


def convert_value(f: dataclasses.Field[Any], value: Any, source: str) -> Any:
    tp = (
        f.type
        if isinstance(f.type, type)
        else {"int": int, "float": float, "bool": bool, "str": str}[str(f.type)]
    )
    key = key_name(f.name)
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("true", "1", "yes", "on"):
                return True
            if s in ("false", "0", "no", "off"):
                return False
            raise ValueError(value)
        if tp is int:
            if isinstance(value, bool):
                raise ValueError(value)
            if isinstance(value, str):
                return _parse_int(value)
            return int(value)
        if tp is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} from {source}: {value!r} is not a valid {tp.__name__}") from None


def _parse_int(s: str) -> int:
    s = s.strip().replace("_", "")
    m = re.fullmatch(r"(\d+)\s*([KMG]i?B?)?", s, re.IGNORECASE)
    if not m:
        return int(s)
    n = int(m.group(1))
    unit = (m.group(2) or "").upper()[:1]
    return n * {"": 1, "K": 1024, "M": MiB, "G": GiB}[unit]


#: Keys renamed, by their old name (and attribute): the old one is still read, with a WARNING
#: naming the new one; where both are set the new one wins.
RENAMED_KEYS = {"batchFastPathEnable": "fastPathEnable"}
RENAMED_ATTRS = {"batch_fast_path_enable": "fast_path_enable"}


def _renamed(old: str, new: str, source: str) -> None:
    log.warning(
        "config_key_renamed",
        key=old,
        new_key=new,
        source=source,
        hint=f"{old} is deprecated and read as {new}: rename it",
    )


def _current_names(items: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """``items`` with renamed keys under their new names (a WARNING for each)."""
    if not any(k in RENAMED_KEYS or k in RENAMED_ATTRS for k in items):
        return items
    out = {k: v for k, v in items.items() if k not in RENAMED_KEYS and k not in RENAMED_ATTRS}
    for key, value in items.items():
        new = RENAMED_KEYS.get(key) or RENAMED_ATTRS.get(key)
        if new is None:
            continue
        _renamed(key, new, source)
        attr = RENAMED_ATTRS.get(key) or attr_name(new)
        if key_name(attr) not in out and attr not in out:
            out[new] = value
    return out


def _apply(values: dict[str, Any], items: Mapping[str, Any], source: str) -> None:
    for key, value in _current_names(items, source).items():
        f = KEY_FIELDS.get(key)
        if f is None:
            # accept snake_case too, for convenience
            f = next((x for x in fields(BrokerConfig) if x.name == key), None)
        if f is None:
            raise ConfigError(f"unknown configuration key {key!r} in {source}")
        values[f.name] = convert_value(f, value, source)


def _flatten(doc: Mapping[str, Any], prefix: str, out: dict[str, Any]) -> None:
    """Sections are allowed for readability ([broker], [store], [transaction]); keys are flat.
    A dotted key (``tls.server.mode = ...``, unquoted, or a ``[tls.server]`` table) parses as
    nested tables: those are joined back into the dotted name."""
    for k, v in doc.items():
        name = prefix + k
        if isinstance(v, dict):
            if any(key.startswith(name + ".") for key in KEY_FIELDS):
                _flatten(v, name + ".", out)
            elif not prefix:
                _flatten(v, "", out)  # a section
            else:
                out[name] = v  # refused as an unknown key
        else:
            out[name] = v


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> BrokerConfig:
    """Resolve the configuration: defaults, then ``path`` (TOML), then ``env``, then
    ``overrides`` (RocketMQ key names, as the CLI passes them)."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"configuration file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
        flat: dict[str, Any] = {}
        _flatten(doc, "", flat)
        _apply(values, flat, str(path))
    environ = os.environ if env is None else env
    for old_attr, attr in RENAMED_ATTRS.items():
        name = env_name(old_attr)
        if name in environ:
            _renamed(name, env_name(attr), "the environment")
            if env_name(attr) not in environ:
                f = KEY_FIELDS[key_name(attr)]
                values[attr] = convert_value(f, environ[name], f"environment variable {name}")
    for f in fields(BrokerConfig):
        name = env_name(f.name)
        if name in environ:
            values[f.name] = convert_value(f, environ[name], f"environment variable {name}")
    if overrides:
        _apply(values, {k: v for k, v in overrides.items() if v is not None}, "the command line")
    try:
        return BrokerConfig(**values)
    except ConfigError:
        raise


_DELAY_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "ms": 1}


def delay_levels(spec: str) -> list[int]:
    """Parse ``messageDelayLevel`` (``"1s 5s 1m"``) into milliseconds per level (level 1 first)."""
    out = []
    for tok in spec.split():
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", tok)
        if not m:
            raise ConfigError(f"messageDelayLevel: cannot parse {tok!r}")
        out.append(int(float(m.group(1)) * _DELAY_UNITS[m.group(2)]))
    if not out:
        raise ConfigError("messageDelayLevel must list at least one level")
    return out

"""Client settings: one frozen dataclass shared by producers and consumers.

Tests make timers fast by building a :class:`ClientConfig` with small values (never by patching
``sleep``).  Every duration is in seconds.
"""

from __future__ import annotations

import dataclasses
import random
import ssl
from dataclasses import dataclass, field
from typing import Any

from txmq.protocol.acl import Credentials

#: The broker address used when none is given.
DEFAULT_BROKER = "127.0.0.1:10911"


@dataclass(frozen=True)
class RetryPolicy:
    """How a producer waits between the attempts of a send that failed with a retriable error:
    exponential backoff with full jitter (the wait before retry ``n``, counting from 0, is drawn
    uniformly from ``[0, min(max_delay, base_delay * multiplier ** n)]``).

    The defaults keep a send close to what it always did (three attempts in all, the waits a
    few milliseconds), so a lost connection or a busy broker is retried almost at once; give a
    larger ``base_delay`` for brokers that shed load.

    Attributes:
        max_attempts: attempts in all, the first included; None takes
            ``1 + ClientConfig.retry_times_when_send_failed``.
        base_delay: the cap of the first wait, in seconds.
        multiplier: how much the cap grows per retry.
        max_delay: the largest cap, in seconds.
        jitter: draw each wait from ``[0, cap]`` (full jitter); False waits the cap itself.
    """

    max_attempts: int | None = None
    base_delay: float = 0.01
    multiplier: float = 2.0
    max_delay: float = 1.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts!r}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("base_delay and max_delay must not be negative")
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be at least 1, got {self.multiplier!r}")

    def cap(self, retry: int) -> float:
        """The longest wait before retry ``retry`` (0 for the first retry)."""
        return min(self.max_delay, self.base_delay * self.multiplier ** min(retry, 64))

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """The wait before retry ``retry``: a uniform draw in ``[0, cap(retry)]`` (or the cap
        without jitter); ``rng`` makes the draws reproducible."""
        cap = self.cap(retry)
        if not self.jitter:
            return cap
        return (rng or _rng).uniform(0.0, cap)


_rng = random.Random()


@dataclass(frozen=True)
class ClientConfig:
    """Settings of one client (producer or consumer).

    Attributes:
        request_timeout: default time to wait for an answer to a request.
        connect_timeout: time to wait for a TCP connection.
        heartbeat_interval: HEART_BEAT period (the broker drops a connection after 120 s without).
        reconnect_backoff_initial: first wait before reconnecting; doubles on each failure.
        reconnect_backoff_max: longest wait between reconnect attempts.
        route_refresh_interval: how often cached topic routes are refreshed.
        retry_times_when_send_failed: extra attempts for a send that failed with a retriable error.
        default_topic_queue_nums: queues assumed (and asked for) when a topic does not exist yet.
        max_message_size: largest body (or batch) accepted client-side, in bytes.
        pull_batch_size: most messages asked for in one pull.
        long_poll_timeout: how long the broker may hold a pull that found nothing.
        pull_threshold_for_queue: a queue stops pulling while it holds this many messages
            that are not consumed yet (flow control).
        pull_backoff_on_error: wait before pulling again after a failed pull.
        rebalance_interval: period of the consumer rebalance (it also runs when the broker
            reports that the group's members changed).
        persist_offset_interval: how often consumed offsets are committed to the broker.
        consume_thread_max: threads (and concurrent async callbacks) for message callbacks.
        consume_chunk_size: most messages handed to one worker job in a row (amortises the
            cost of a thread hand-off; messages are still delivered one per callback call).
        send_back_retry_delay: wait before consuming a message again locally when returning it
            to the broker for a later retry failed.
        shutdown_timeout: how long a consumer's shutdown waits for running callbacks.
        compress_over: zlib-compress single-message bodies of at least this many bytes, as
            RocketMQ's clients do above 4 KiB (``compressMsgBodyOverHowmuch``); 0 (the default)
            never compresses.  Consumers of every RocketMQ client and of this SDK inflate them.
        compress_level: zlib level used with ``compress_over``.
        access_key: the ACL account (RocketMQ's ACL 1.0) every request is signed with; needs
            ``secret_key``.  None (the default) sends requests unsigned.
        secret_key: the account's secret (never printed by ``repr``).
        security_token: optional ``SecurityToken`` sent and signed with the request.
        auto_batch: gather plain sends of one topic made at the same moment (no queue, key or
            selector given, no delay level, not compressed) into SEND_BATCH_MESSAGE requests,
            as RocketMQ 5.1's producer does with ``autoBatch`` (and aiokafka always does); each
            send still gets its own :class:`SendResult` (the messages of one request share a
            queue).  On by default: it adds no waiting (a batch leaves when the event loop gets
            to it) and a lone send is sent as it is; ``auto_batch=False`` sends each message in
            a request of its own.
        batch_max_bytes: with ``auto_batch``, the largest request body a batch grows to.
        tls: connect with TLS: True checks the broker's certificate against the system's CA
            store (and its name or IP against the broker address); an :class:`ssl.SSLContext`
            is used as given (your CA, a client certificate for mutual TLS; see
            :func:`tls_context`).  False (the default) connects in plain TCP.
        enable_trace: a producer sends a trace record of each message it sent to
            ``RMQ_SYS_TRACE_TOPIC`` (RocketMQ's ``enableMsgTrace``; see :mod:`txmq.client.trace`).
        retry_policy: the waits between a send's attempts (a :class:`RetryPolicy`; its
            ``max_attempts``, when given, replaces ``retry_times_when_send_failed``).
    """

    request_timeout: float = 3.0
    connect_timeout: float = 3.0
    heartbeat_interval: float = 30.0
    reconnect_backoff_initial: float = 0.1
    reconnect_backoff_max: float = 5.0
    route_refresh_interval: float = 30.0
    retry_times_when_send_failed: int = 2
    default_topic_queue_nums: int = 4
    max_message_size: int = 4 * 1024 * 1024
    pull_batch_size: int = 32
    long_poll_timeout: float = 15.0
    pull_threshold_for_queue: int = 1000
    pull_backoff_on_error: float = 1.0
    rebalance_interval: float = 20.0
    persist_offset_interval: float = 5.0
    consume_thread_max: int = 20
    consume_chunk_size: int = 8
    send_back_retry_delay: float = 1.0
    shutdown_timeout: float = 10.0
    compress_over: int = 0
    compress_level: int = 5
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    security_token: str | None = field(default=None, repr=False)
    tls: bool | ssl.SSLContext = False
    auto_batch: bool = True
    batch_max_bytes: int = 256 * 1024
    enable_trace: bool = False
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.tls, (bool, ssl.SSLContext)):
            raise ValueError(f"tls must be a bool or an ssl.SSLContext, got {self.tls!r}")
        if bool(self.access_key) != bool(self.secret_key):
            raise ValueError("access_key and secret_key must be given together")
        positive = (
            "request_timeout",
            "connect_timeout",
            "heartbeat_interval",
            "reconnect_backoff_initial",
            "reconnect_backoff_max",
            "route_refresh_interval",
            "rebalance_interval",
            "persist_offset_interval",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in (
            "pull_batch_size",
            "consume_thread_max",
            "consume_chunk_size",
            "pull_threshold_for_queue",
            "default_topic_queue_nums",
            "max_message_size",
            "batch_max_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        if self.retry_times_when_send_failed < 0:
            raise ValueError("retry_times_when_send_failed must not be negative")
        if self.long_poll_timeout < 0:
            raise ValueError("long_poll_timeout must not be negative")

    @property
    def send_attempts(self) -> int:
        """Attempts a send makes in all (the first included)."""
        if self.retry_policy.max_attempts is not None:
            return self.retry_policy.max_attempts
        return 1 + self.retry_times_when_send_failed

    @property
    def credentials(self) -> Credentials | None:
        """The signing credentials, or None when requests go unsigned."""
        if not self.access_key or not self.secret_key:
            return None
        return Credentials(self.access_key, self.secret_key, self.security_token)

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context, or None for plain TCP."""
        if isinstance(self.tls, ssl.SSLContext):
            return self.tls
        return tls_context() if self.tls else None

    def replace(self, **changes: Any) -> ClientConfig:
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)


def tls_context(
    ca_path: str | None = None, cert_path: str | None = None, key_path: str | None = None
) -> ssl.SSLContext:
    """A client TLS context: the broker's certificate is checked against ``ca_path`` (PEM; the
    system's CA store when None), with ``cert_path`` / ``key_path`` as the client certificate
    for mutual TLS.

    Raises:
        ValueError: a file is missing or does not hold what it should (the message names it).
    """
    if bool(cert_path) != bool(key_path):
        raise ValueError("a TLS client certificate and its key must be given together")
    try:
        ctx = ssl.create_default_context(cafile=ca_path or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the TLS CA file {ca_path!r}: {exc}") from None
    if cert_path and key_path:
        try:
            ctx.load_cert_chain(cert_path, key_path)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot load the TLS client certificate {cert_path!r} with key {key_path!r}: {exc}"
            ) from None
    return ctx


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``.

    Raises:
        ValueError: the address has no valid port.
    """
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"broker address must look like 'host:port', got {address!r}")
    try:
        port_no = int(port)
    except ValueError:
        raise ValueError(f"broker address has an invalid port: {address!r}") from None
    if not 0 < port_no < 65536:
        raise ValueError(f"broker address has an invalid port: {address!r}")
    return host.strip("[]"), port_no

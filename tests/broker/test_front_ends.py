"""One table of scenarios through both front ends: each scenario runs once over RocketMQ remoting
against broker A and once over RocketMQ 5 gRPC against broker B (two brokers of the same config,
each with a fresh store), then the answers, the transaction tables and the whole commit logs of
the two brokers are compared.  Both front ends call the one messaging core, so the same
messages must give the same records and the same answers; where they may not, the difference is
named here with its reason (:func:`normalised`, :attr:`Scenario.unordered`).

A scenario is written once against :class:`FrontEnd`; :class:`Remoting` (raw remoting requests)
and :class:`Grpc` (a ``grpc.aio`` client with the broker's generated stubs, in the test's loop)
carry it out and report what the protocol answered in terms both can state: a remoting send
answers an offsetMsgId, which is read back to the message id (UNIQ_KEY) gRPC answers.  A remoting
producer sends exactly the properties the gRPC conversion stores (``broker/grpc/convert.py``:
UNIQ_KEY, TAGS, KEYS in that order), with the gRPC producer's group (its topic) and the same born
timestamp, so that the stored records can be equal.  Every topic has one queue, so the queue a
message goes to cannot differ.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.acl_files import write_acl
from tests.support.fastpath import batch_body, comparable
from tests.support.grpc_probes import end_transaction_request, receive_request
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.broker.store.commit_log import RECORD_HEADER_SIZE
from txmq.broker.topics import TIMER_TOPIC
from txmq.broker.transaction.state import OpRecord
from txmq.protocol.acl import GRPC_AUTHORIZATION, GRPC_DATE_TIME, Credentials, grpc_authorization
from txmq.protocol.aio import Connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    EndTransactionRequestHeader,
    ResetOffsetRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from txmq.protocol.message import (
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_message,
    decode_offset_msg_id,
    properties_to_string,
)
from txmq.protocol.topics import POP_STATE_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC, SCHEDULE_TOPIC

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc  # noqa: E402

C = MessageConst
TOPIC = "fe-orders"
#: The consumer group of the pull and dead-letter scenarios.
GROUP = "fe-consumers"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
MD = (("x-mq-client-id", "front-ends-test"), ("x-mq-language", "PYTHON"))
#: Longest wait for something a scenario needs (a check, a message), seconds.
WAIT_S = 20.0

#: Delay levels for these brokers: a delivery 5 s ahead falls in level 2 (10 s) whether the
#: broker sees it 0 or 4.9 s later, and nothing is delivered out of the schedule topic while a
#: scenario runs (which would add a record to one commit log and not yet to the other).
DELAY_LEVELS = "100ms 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: Both brokers: the gRPC port on; no transaction check during the scenarios that do not want
#: one (a check with no producer online changes nothing, but a quiet checker is simpler).
CONFIG: dict[str, Any] = dict(
    grpc_server_enable=True,
    grpc_server_port=0,
    message_delay_level=DELAY_LEVELS,
    transaction_check_interval=60_000,
)
#: The check-back scenario: a half is checked 200 ms after it was stored.
CHECKING: dict[str, Any] = dict(transaction_time_out=200, transaction_check_interval=100)
#: The quota scenario: a client address may produce 64 bytes a second, and a send while its
#: bucket is in debt is refused at once (no throttling wait).
QUOTA: dict[str, Any] = dict(quota_produce_byte_rate=64, quota_max_throttle_ms=0)
#: The code each protocol answers a send refused by a quota: remoting SYSTEM_BUSY (which stock
#: producers retry after a pause), gRPC TOO_MANY_REQUESTS (what RocketMQ's proxy answers).
QUOTA_REFUSAL = {"remoting": int(ResponseCode.SYSTEM_BUSY), "gRPC": 42900}
#: The ACL scenario's accounts (no trusted address): an operator, and an account that may read
#: the topic but not send to it.
ACL = f"""
globalWhiteRemoteAddresses:
accounts:
  - accessKey: fe-operator
    secretKey: fe-operator-secret
    admin: true
  - accessKey: fe-reader
    secretKey: fe-reader-secret
    defaultTopicPerm: DENY
    topicPerms:
      - {TOPIC}=SUB
"""
OPERATOR = Credentials("fe-operator", "fe-operator-secret")
READER = Credentials("fe-reader", "fe-reader-secret")
#: The code each protocol answers a send the ACL refuses: remoting NO_PERMISSION, gRPC
#: FORBIDDEN.
ACL_REFUSAL = {"remoting": int(ResponseCode.NO_PERMISSION), "gRPC": 40300}


def uniq(n: int) -> str:
    """A message id as producers make them (32 hex digits), the same on both front ends."""
    return f"0A0B0C0D{n:024X}"


# -- what a scenario sends and observes ---------------------------------------------------------


@dataclass(frozen=True)
class Msg:
    body: bytes
    uniq: str
    tag: str | None = None
    keys: tuple[str, ...] = ()
    #: User properties (one at most: a protobuf map has no order to compare).
    user: tuple[tuple[str, str], ...] = ()

    def properties(self) -> dict[str, str]:
        """What the gRPC front end stores for this message (``convert.to_message_ext``), in its
        order: the properties a remoting producer sends for it here."""
        props = dict(self.user)
        props[C.UNIQ_KEY] = self.uniq
        if self.tag is not None:
            props[C.TAGS] = self.tag
        if self.keys:
            props[C.KEYS] = " ".join(self.keys)
        return props


@dataclass(frozen=True)
class Sent:
    """One message's send answer: the message id (UNIQ_KEY), its queue offset, the transaction
    id of a half ("" otherwise).  ``error``: the answer's text when it failed (not compared)."""

    ok: bool
    message_id: str
    queue_offset: int
    transaction_id: str
    error: str = field(default="", compare=False)


@dataclass(frozen=True)
class Answer:
    """The answer of an END_TRANSACTION / EndTransaction (``text``: what the broker said was
    done) or of a dead-letter request (no text on either protocol)."""

    ok: bool
    text: str = ""
    error: str = field(default="", compare=False)


@dataclass(frozen=True)
class Received:
    """A message as a consumer got it; ``raw``: the protocol's own form (not compared)."""

    body: bytes
    tag: str | None
    keys: tuple[str, ...]
    message_id: str
    queue_offset: int
    raw: Any = field(compare=False, repr=False)

    @classmethod
    def of(cls, m: MessageExt) -> Received:
        """A message a remoting pull answered."""
        keys = tuple(m.keys.split(" ")) if m.keys else ()
        return cls(m.body, m.tags, keys, m.msg_id, m.queue_offset, m)


@dataclass(frozen=True)
class Check:
    """A transaction check as the producer got it."""

    topic: str
    body: bytes
    message_id: str
    tag: str | None
    keys: tuple[str, ...]
    transaction_id: str


@dataclass(frozen=True)
class Progress:
    """A probe's value for :func:`wait_until`: true when ``done``; shown as ``detail`` in the
    failure message of a wait that timed out."""

    done: bool
    detail: str

    def __bool__(self) -> bool:
        return self.done

    def __repr__(self) -> str:
        return self.detail


# -- the front ends -----------------------------------------------------------------------------


class FrontEnd(abc.ABC):
    """One protocol's client to one broker, doing what a scenario asks."""

    name: str

    def __init__(self, broker: BrokerController, born: int) -> None:
        self.broker = broker
        #: The born timestamp of every message: when the test began, the same on both front ends.
        self.born = born
        #: Checks received since :meth:`answer_checks`, and the answers to their decisions.
        self.checks: list[Check] = []
        self.check_answers: list[Answer] = []
        self.check_decision: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The account a send is signed as (None: unsigned).
        self.credentials: Credentials | None = None

    def __str__(self) -> str:
        return self.name

    @abc.abstractmethod
    async def start(self) -> None: ...

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @abc.abstractmethod
    async def send(self, topic: str, msgs: list[Msg], deliver_ms: int | None = None) -> list[Sent]:
        """Send ``msgs`` in one request (one message, or a batch)."""

    @abc.abstractmethod
    async def send_half(self, topic: str, msg: Msg) -> tuple[Sent, Any]:
        """Send the half message of a transaction: its answer and what :meth:`end` needs."""

    @abc.abstractmethod
    async def end(self, topic: str, half: Any, decision: str) -> Answer:
        """The producer's decision on a half: ``COMMIT``, ``ROLLBACK`` or ``UNKNOWN``."""

    @abc.abstractmethod
    async def answer_checks(self, topic: str, decision: str) -> None:
        """Be online as ``topic``'s transactional producer and answer every check with
        ``decision`` (recorded in :attr:`checks` and :attr:`check_answers`)."""

    @abc.abstractmethod
    async def _read(self, topic: str, group: str, offset: int) -> list[Received]:
        """One read of ``topic``'s queue from ``offset`` (remoting) or of what is due (gRPC)."""

    async def receive(self, topic: str, group: str, n: int) -> list[Received]:
        """Read until ``n`` messages came (bounded)."""
        got: list[Received] = []

        async def more() -> Progress:
            got.extend(await self._read(topic, group, len(got)))
            return Progress(len(got) >= n, f"got {got}")

        await wait_until(more, WAIT_S, f"{self}: {n} messages of {topic}")
        return got

    @abc.abstractmethod
    async def dead_letter(self, topic: str, group: str, m: Received) -> Answer:
        """The consumer gives up on ``m``: to ``%DLQ%<group>`` at once."""

    @abc.abstractmethod
    async def _consume(self, topic: str, group: str, tag: str) -> list[Received]:
        """One read as a live consumer of ``group`` keeping ``tag`` ("*": every tag), each
        message it got settled (remoting: the group's offset committed past it; gRPC: acked)."""

    async def consume(self, topic: str, group: str, n: int, tag: str = "*") -> list[Received]:
        """Consume until ``n`` messages came (bounded)."""
        got: list[Received] = []

        async def more() -> Progress:
            got.extend(await self._consume(topic, group, tag))
            return Progress(len(got) >= n, f"got {got}")

        await wait_until(more, WAIT_S, f"{self}: {n} messages of {topic} as {group}")
        return got

    async def reset_to_earliest(self, topic: str, group: str) -> Answer:
        """What ``txmq group reset-offset --to-earliest`` asks (INVOKE_BROKER_TO_RESET_OFFSET),
        over remoting whatever the front end: an operator's request."""
        async with connected(self.broker.address) as admin:
            h = ResetOffsetRequestHeader(topic=topic, group=group, timestamp=0, is_force=True)
            r = await admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, h.to_ext_fields())
        ok = r.code == ResponseCode.SUCCESS
        return Answer(ok, error="" if ok else f"{r.code}: {r.remark}")

    # -- the broker's side, read directly ------------------------------------------------------

    def tx_view(self, txid: str) -> Any:
        """The transaction table's record of ``txid`` but for its per-broker fields (store
        timestamps, offsetMsgIds, times) and its remark (see :func:`normalised`)."""
        rec = self.broker.transactions.records.get(txid)
        if rec is None:
            return None
        halves = [
            (h.real_topic, h.real_queue_id, h.queue_offset, h.commit_log_offset, h.uniq_key)
            for h in rec.halves
        ]
        return (rec.state.value, rec.producer_group, rec.decided_by, halves)

    def state(self, txid: str) -> str | None:
        rec = self.broker.transactions.records.get(txid)
        return None if rec is None else rec.state.value

    def stored(self, topic: str) -> list[MessageExt]:
        return [m for m in commit_log(self.broker) if m.topic == topic]


class Remoting(FrontEnd):
    name = "remoting"

    async def start(self) -> None:
        self.client = await RawClient.connect(self.broker.address, self._handle)

    async def close(self) -> None:
        await super().close()
        await self.client.close()

    def _header(self, topic: str, props: dict[str, str], **kw: Any) -> dict[str, Any]:
        # The producer group is the topic: a 5.x producer has none, its halves get the topic.
        return SendMessageRequestHeader(
            producer_group=topic,
            topic=topic,
            default_topic_queue_nums=1,
            queue_id=0,
            born_timestamp=self.born,
            properties=properties_to_string(props),
            **kw,
        ).to_v2_ext_fields()

    async def _send_call(self, code: int, ext: dict[str, Any], body: bytes) -> RemotingCommand:
        """A send request, signed as :attr:`credentials` when set."""
        cmd = RemotingCommand.request(code, ext, body)
        if self.credentials is not None:
            self.credentials.sign(cmd)
        return await self.client.conn.request(cmd, WAIT_S)

    def _sent(self, resp: RemotingCommand, n: int) -> list[Sent]:
        """The answer per message: the message id is the UNIQ_KEY of the record the answer's
        offsetMsgId names; a batch answers the first queue offset (the others follow it)."""
        if resp.code != ResponseCode.SUCCESS:
            return [Sent(False, "", -1, "", f"{resp.code}: {resp.remark}")] * n
        h = SendMessageResponseHeader.from_ext_fields(resp.ext_fields)
        assert h.queue_id == 0, f"{self}: answered queue {h.queue_id} of a one-queue topic"
        out = []
        for i, offset_msg_id in enumerate(h.msg_id.split(",")):
            _, phy = decode_offset_msg_id(offset_msg_id)
            mid = self.broker.store.lookup_message(phy).msg_id
            out.append(Sent(True, mid, h.queue_offset + i, h.transaction_id or ""))
        return out

    async def send(self, topic: str, msgs: list[Msg], deliver_ms: int | None = None) -> list[Sent]:
        if len(msgs) > 1:
            assert deliver_ms is None, "a batch has no delivery time"
            rows = [(m.body, 0, properties_to_string(m.properties()).encode()) for m in msgs]
            resp = await self._send_call(
                RequestCode.SEND_BATCH_MESSAGE,
                self._header(topic, {}, batch=True),
                batch_body(rows),
            )
            return self._sent(resp, len(msgs))
        [m] = msgs
        props = m.properties()
        if deliver_ms is not None:
            props[TIMER_DELIVER_MS] = str(deliver_ms)  # what a 5.x remoting producer sends
        resp = await self._send_call(
            RequestCode.SEND_MESSAGE_V2, self._header(topic, props), m.body
        )
        return self._sent(resp, 1)

    async def send_half(self, topic: str, msg: Msg) -> tuple[Sent, Any]:
        props = {**msg.properties(), C.TRAN_MSG: "true", C.PGROUP: topic}
        resp = await self._send_call(
            RequestCode.SEND_MESSAGE_V2,
            self._header(topic, props, sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE),
            msg.body,
        )
        return self._sent(resp, 1)[0], resp

    @staticmethod
    def _decision(decision: str) -> int:
        return {"COMMIT": 8, "ROLLBACK": 12, "UNKNOWN": 0}[decision]

    async def _end(self, h: EndTransactionRequestHeader) -> Answer:
        r = await self.client.call(RequestCode.END_TRANSACTION, h.to_ext_fields())
        ok = r.code == ResponseCode.SUCCESS
        return Answer(ok, r.remark or "", "" if ok else f"{r.code}: {r.remark}")

    async def end(self, topic: str, half: Any, decision: str) -> Answer:
        h = SendMessageResponseHeader.from_ext_fields(half.ext_fields)
        _, phy = decode_offset_msg_id(h.msg_id)
        return await self._end(
            EndTransactionRequestHeader(
                producer_group=topic,
                tran_state_table_offset=h.queue_offset,
                commit_log_offset=phy,
                commit_or_rollback=self._decision(decision),
                from_transaction_check=False,
                msg_id=h.msg_id,
                transaction_id=h.transaction_id,
            )
        )

    async def answer_checks(self, topic: str, decision: str) -> None:
        self.check_decision = decision
        self.check_topic = topic
        await self.client.heartbeat(producer_groups=[topic])

    async def _handle(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return None
        h = CheckTransactionStateRequestHeader.from_ext_fields(cmd.ext_fields)
        m = decode_message(cmd.body)
        keys = tuple(m.keys.split(" ")) if m.keys else ()
        self.checks.append(Check(m.topic, m.body, m.msg_id, m.tags, keys, h.transaction_id or ""))
        if self.check_decision is not None:
            eh = EndTransactionRequestHeader(
                producer_group=self.check_topic,
                tran_state_table_offset=h.tran_state_table_offset,
                commit_log_offset=h.commit_log_offset,
                commit_or_rollback=self._decision(self.check_decision),
                from_transaction_check=True,
                msg_id=h.msg_id,
                transaction_id=h.transaction_id,
            )
            self._spawn(self._answer_check(eh))
        return cmd.response()

    async def _answer_check(self, eh: EndTransactionRequestHeader) -> None:
        self.check_answers.append(await self._end(eh))

    async def _read(self, topic: str, group: str, offset: int) -> list[Received]:
        resp, msgs = await self.client.pull(topic, 0, offset, group=group, suspend_ms=200)
        assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), (
            f"{self}: PULL_MESSAGE answered {resp.code}: {resp.remark}"
        )
        return [Received.of(m) for m in msgs]

    async def dead_letter(self, topic: str, group: str, m: Received) -> Answer:
        # What the SDK's consumer sends back (client/consumer.py), with delay level -1: to the
        # dead-letter queue at once.
        h = ConsumerSendMsgBackRequestHeader(
            offset=m.raw.commit_log_offset,
            group=group,
            delay_level=-1,
            origin_msg_id=m.message_id,
            origin_topic=topic,
        )
        r = await self.client.call(RequestCode.CONSUMER_SEND_MSG_BACK, h.to_ext_fields())
        ok = r.code == ResponseCode.SUCCESS
        return Answer(ok, error="" if ok else f"{r.code}: {r.remark}")

    async def _consume(self, topic: str, group: str, tag: str) -> list[Received]:
        q = await self.client.call(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": group, "topic": topic, "queueId": 0},
        )
        offset = int(q.ext_fields["offset"]) if q.code == ResponseCode.SUCCESS else 0
        resp, msgs = await self.client.pull(
            topic, 0, max(offset, 0), group=group, expression=tag, suspend_ms=200
        )
        assert resp.code in (
            ResponseCode.SUCCESS,
            ResponseCode.PULL_NOT_FOUND,
            ResponseCode.PULL_RETRY_IMMEDIATELY,
        ), f"{self}: PULL_MESSAGE answered {resp.code}: {resp.remark}"
        nxt = int(resp.ext_fields.get("nextBeginOffset", offset))
        if nxt > offset:
            u = await self.client.call(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": nxt},
            )
            assert u.code == ResponseCode.SUCCESS, f"{self}: offset commit answered {u.remark}"
        return [Received.of(m) for m in msgs]


class Grpc(FrontEnd):
    name = "gRPC"

    async def start(self) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.broker.grpc_port}")
        self.stub = sgrpc.MessagingServiceStub(self.channel)
        self.telemetry: Any = None

    async def close(self) -> None:
        if self.telemetry is not None:
            self.telemetry.cancel()
        await super().close()
        await self.channel.close()

    def _message(
        self, topic: str, msg: Msg, mtype: pb.MessageType, deliver_ms: int | None = None
    ) -> Any:
        m = pb.Message(topic=pb.Resource(name=topic), body=msg.body)
        sp = m.system_properties
        sp.message_id = msg.uniq
        sp.message_type = mtype
        sp.born_host = "127.0.0.1"
        sp.born_timestamp.FromMilliseconds(self.born)
        if msg.tag is not None:
            sp.tag = msg.tag
        sp.keys.extend(msg.keys)
        m.user_properties.update(msg.user)
        if deliver_ms is not None:
            sp.delivery_timestamp.FromMilliseconds(deliver_ms)
        return m

    def _send_md(self) -> tuple[tuple[str, str], ...]:
        """A send's metadata, signed as :attr:`credentials` when set."""
        creds = self.credentials
        if creds is None:
            return MD
        now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        auth = grpc_authorization(creds.access_key, creds.secret_key, now)
        return (*MD, (GRPC_DATE_TIME, now), (GRPC_AUTHORIZATION, auth))

    async def _send(self, messages: list[Any]) -> list[Sent]:
        r = await self.stub.SendMessage(
            spb.SendMessageRequest(messages=messages), metadata=self._send_md(), timeout=WAIT_S
        )
        return [
            Sent(
                e.status.code == pb.OK,
                e.message_id,
                e.offset,
                e.transaction_id,
                "" if e.status.code == pb.OK else f"{e.status.code}: {e.status.message}",
            )
            for e in r.entries
        ]

    async def send(self, topic: str, msgs: list[Msg], deliver_ms: int | None = None) -> list[Sent]:
        mtype = pb.NORMAL if deliver_ms is None else pb.DELAY
        return await self._send([self._message(topic, m, mtype, deliver_ms) for m in msgs])

    async def send_half(self, topic: str, msg: Msg) -> tuple[Sent, Any]:
        [sent] = await self._send([self._message(topic, msg, pb.TRANSACTION)])
        return sent, (sent.message_id, sent.transaction_id)

    @staticmethod
    def _resolution(decision: str) -> Any:
        return {
            "COMMIT": pb.COMMIT,
            "ROLLBACK": pb.ROLLBACK,
            "UNKNOWN": pb.TRANSACTION_RESOLUTION_UNSPECIFIED,
        }[decision]

    async def _end(
        self, topic: str, message_id: str, txid: str, decision: str, source: Any
    ) -> Answer:
        r = await self.stub.EndTransaction(
            end_transaction_request(
                topic, txid, self._resolution(decision), source, message_id=message_id
            ),
            metadata=MD,
            timeout=WAIT_S,
        )
        ok = r.status.code == pb.OK
        return Answer(ok, r.status.message, "" if ok else f"{r.status.code}: {r.status.message}")

    async def end(self, topic: str, half: Any, decision: str) -> Answer:
        message_id, txid = half
        return await self._end(topic, message_id, txid, decision, pb.SOURCE_CLIENT)

    async def answer_checks(self, topic: str, decision: str) -> None:
        """A Telemetry stream announcing ``topic`` (the producer is then registered as the
        producer of the group named after it), answering each RecoverOrphanedTransactionCommand
        with an EndTransaction from the server check."""
        self.check_decision = decision
        call = self.telemetry = self.stub.Telemetry(metadata=MD)
        await call.write(
            spb.TelemetryCommand(
                settings=pb.Settings(
                    client_type=pb.PRODUCER,
                    publishing=pb.Publishing(topics=[pb.Resource(name=topic)]),
                )
            )
        )
        first = await asyncio.wait_for(call.read(), WAIT_S)
        assert first.status.code == pb.OK, f"{self}: Telemetry settings answered {first.status}"
        self._spawn(self._serve_checks(call, topic, decision))

    async def _serve_checks(self, call: Any, topic: str, decision: str) -> None:
        while True:
            cmd = await call.read()
            if cmd is grpc.aio.EOF:
                return
            if not cmd.HasField("recover_orphaned_transaction_command"):
                continue
            rc = cmd.recover_orphaned_transaction_command
            sp = rc.message.system_properties
            self.checks.append(
                Check(
                    rc.message.topic.name,
                    rc.message.body,
                    sp.message_id,
                    sp.tag if sp.HasField("tag") else None,
                    tuple(sp.keys),
                    rc.transaction_id,
                )
            )
            self.check_answers.append(
                await self._end(
                    topic, sp.message_id, rc.transaction_id, decision, pb.SOURCE_SERVER_CHECK
                )
            )

    async def _read(self, topic: str, group: str, offset: int, tag: str = "*") -> list[Received]:
        req = receive_request(group, topic, expression=tag, invisible_ms=60_000)
        out = [r async for r in self.stub.ReceiveMessage(req, metadata=MD, timeout=WAIT_S)]
        assert out[0].status.code in (pb.OK, pb.MESSAGE_NOT_FOUND), (
            f"{self}: ReceiveMessage answered {out[0].status}"
        )
        got = []
        for r in out:
            if r.HasField("message"):
                sp = r.message.system_properties
                got.append(
                    Received(
                        r.message.body,
                        sp.tag if sp.HasField("tag") else None,
                        tuple(sp.keys),
                        sp.message_id,
                        sp.queue_offset,
                        r.message,
                    )
                )
        return got

    async def _consume(self, topic: str, group: str, tag: str) -> list[Received]:
        got = await self._read(topic, group, 0, tag)
        for m in got:
            sp = m.raw.system_properties
            r = await self.stub.AckMessage(
                spb.AckMessageRequest(
                    group=pb.Resource(name=group),
                    topic=pb.Resource(name=topic),
                    entries=[
                        spb.AckMessageEntry(
                            message_id=sp.message_id, receipt_handle=sp.receipt_handle
                        )
                    ],
                ),
                metadata=MD,
                timeout=WAIT_S,
            )
            assert r.status.code == pb.OK, f"{self}: AckMessage answered {r.status}"
        return got

    async def dead_letter(self, topic: str, group: str, m: Received) -> Answer:
        sp = m.raw.system_properties
        r = await self.stub.ForwardMessageToDeadLetterQueue(
            spb.ForwardMessageToDeadLetterQueueRequest(
                group=pb.Resource(name=group),
                topic=pb.Resource(name=topic),
                receipt_handle=sp.receipt_handle,
                message_id=sp.message_id,
                delivery_attempt=sp.delivery_attempt,
                max_delivery_attempts=1,
            ),
            metadata=MD,
            timeout=WAIT_S,
        )
        ok = r.status.code == pb.OK
        return Answer(ok, error="" if ok else f"{r.status.code}: {r.status.message}")


# -- stored records -----------------------------------------------------------------------------


def commit_log(broker: BrokerController) -> list[MessageExt]:
    """Every message of the broker's commit log, in order (each framed by a record header;
    the test's segments are large enough for no blank record to end one)."""
    store = broker.store
    out = []
    pos, end = store.min_phy_offset, store.max_phy_offset
    while pos < end:
        m = store.lookup_message(pos)
        out.append(m)
        pos += RECORD_HEADER_SIZE + m.store_size
    return out


#: What each front end appends to the remark of a decision's op record: the remark is the
#: decision's audit note, END_TRANSACTION's remark (none here) after who decided over remoting,
#: the gRPC front end's ``grpc`` over gRPC (``producer`` against ``producer: grpc``, ``check``
#: against ``check: grpc``).
OP_REMARK_SUFFIX = {"remoting": "", "gRPC": ": grpc"}


def normalised(
    log: list[MessageExt], unordered: frozenset[str], remark_suffix: str
) -> list[dict[str, Any]]:
    """The records of a commit log as they must be equal on both brokers.

    Left out, besides the fields that differ between any two brokers (store host, store time):

    - the born host's port: a remoting record has the producer's socket address, a gRPC
      record the ``born_host`` the client declares, with port 0 (as RocketMQ's proxy stores
      it).  Its address is compared.
    - in an op record (a transaction decision): its time (``ts``, and the born timestamp) and
      the front end's ``remark_suffix`` to its remark (:data:`OP_REMARK_SUFFIX`).  The suffix
      lengthens the record (its msgpack body frames a remark this short in one header byte
      either way), so the op record's size and the commit-log offset of every record after it
      are compared less the suffixes before them; the body's CRC is not compared.
    - POP consumption's records (:data:`POP_STATE_TOPIC`), which only a gRPC receive writes:
      left out, and the commit-log offsets after them compared less their size.
    - the position among the properties of the keys in ``unordered`` (their values are
      compared): see :attr:`Scenario.unordered`.
    """
    out = []
    extra = len(remark_suffix.encode())
    shift = 0
    for m in log:
        if m.topic == POP_STATE_TOPIC:
            # what a POP consumer was handed and acked (gRPC's receive; a remoting pull keeps
            # its position in the client): the records after it are compared less its size
            shift += RECORD_HEADER_SIZE + m.store_size
            continue
        d = comparable(m)
        d["born_address"] = m.born_host[0]
        props = d.pop("properties")
        d["properties"] = [(k, v) for k, v in props if k not in unordered]
        d["unordered properties"] = {k: v for k, v in props if k in unordered}
        d["commit_log_offset"] -= shift
        if m.topic == RMQ_SYS_TRANS_OP_HALF_TOPIC:
            op = OpRecord.decode(m.body)
            assert op.remark.endswith(remark_suffix), (
                f"op record remark {op.remark!r} lacks its front end's {remark_suffix!r}"
            )
            d["body"] = {
                **dataclasses.asdict(op),
                "ts": None,
                "remark": op.remark.removesuffix(remark_suffix),
            }
            del d["born_timestamp"], d["body_crc"]
            d["store_size"] -= extra
            shift += extra
        out.append(d)
    return out


# -- the scenarios ------------------------------------------------------------------------------

Observed = dict[str, Any]


async def send_one(fe: FrontEnd) -> Observed:
    """One message with a tag, two keys and a user property."""
    m = Msg(b"one message", uniq(1), "TagA", ("order-1", "customer-7"), (("région", "Zürich"),))
    sent = await fe.send(TOPIC, [m])
    assert sent == [Sent(True, m.uniq, 0, "")], f"{fe}: send answered {sent}"
    [rec] = fe.stored(TOPIC)
    assert (rec.queue_id, rec.body, rec.tags, rec.keys, rec.user_properties) == (
        0,
        m.body,
        "TagA",
        "order-1 customer-7",
        {"région": "Zürich"},
    ), f"{fe}: stored {rec}"
    return {"answers": sent}


async def send_batch(fe: FrontEnd) -> Observed:
    """Over remoting the batch fast path stores this one straight from the request body: its
    records must still be what the gRPC front end's messages become."""
    msgs = [
        Msg(b"first", uniq(11), tag="TagA", keys=("k1",)),
        Msg(b"second, no tag", uniq(12), keys=("k2", "k3")),
        Msg(b"third" * 40, uniq(13), tag="TagB"),
    ]
    sent = await fe.send(TOPIC, msgs)
    assert sent == [Sent(True, m.uniq, i, "") for i, m in enumerate(msgs)], (
        f"{fe}: batch answered {sent}"
    )
    stored = [m.body for m in fe.stored(TOPIC)]
    assert stored == [m.body for m in msgs], f"{fe}: {TOPIC} holds {stored}"
    return {"answers": sent}


def half_then(decision: str) -> Callable[[FrontEnd], Awaitable[Observed]]:
    """A half message, then the producer's ``decision`` on it."""

    async def run(fe: FrontEnd) -> Observed:
        m = Msg(f"half to {decision.lower()}".encode(), uniq(21), tag="TagTx", keys=("tx-1",))
        sent, half = await fe.send_half(TOPIC, m)
        assert sent == Sent(True, m.uniq, 0, m.uniq), f"{fe}: half answered {sent}"
        assert fe.stored(TOPIC) == [], f"{fe}: a half is visible before its decision"
        ended = await fe.end(TOPIC, half, decision)
        state = {"COMMIT": "COMMITTED", "ROLLBACK": "ROLLED_BACK", "UNKNOWN": "PENDING"}[decision]
        assert ended.ok and state in ended.text, f"{fe}: {decision} answered {ended}"
        assert fe.state(m.uniq) == state, f"{fe}: the transaction is {fe.state(m.uniq)}"
        delivered = [(r.body, r.msg_id) for r in fe.stored(TOPIC)]
        expected = [(m.body, m.uniq)] if decision == "COMMIT" else []
        assert delivered == expected, f"{fe}: {TOPIC} holds {delivered} after {decision}"
        return {"half answer": sent, "end answer": ended, "transaction": fe.tx_view(m.uniq)}

    return run


async def check_back(fe: FrontEnd) -> Observed:
    """No decision from the producer: the broker checks the half back and the producer's
    answer commits it.  Remoting: a producer connection answering CHECK_TRANSACTION_STATE with
    END_TRANSACTION (fromTransactionCheck); gRPC: a Telemetry stream answering
    RecoverOrphanedTransactionCommand with EndTransaction (SOURCE_SERVER_CHECK)."""
    await fe.answer_checks(TOPIC, "COMMIT")
    m = Msg(b"checked back", uniq(31), tag="TagCheck", keys=("tx-2",))
    sent, _ = await fe.send_half(TOPIC, m)
    assert sent == Sent(True, m.uniq, 0, m.uniq), f"{fe}: half answered {sent}"
    await wait_until(
        lambda: Progress(
            fe.state(m.uniq) == "COMMITTED" and bool(fe.check_answers),
            f"transaction {fe.state(m.uniq)}, checks {fe.checks}, answers {fe.check_answers}",
        ),
        WAIT_S,
        f"{fe}: the check of {m.uniq} answered and the transaction committed",
    )
    assert fe.checks[0] == Check(TOPIC, m.body, m.uniq, "TagCheck", ("tx-2",), m.uniq), (
        f"{fe}: the check carried {fe.checks[0]}"
    )
    assert fe.check_answers[0].ok, f"{fe}: the check's decision answered {fe.check_answers[0]}"
    delivered = [r.body for r in fe.stored(TOPIC)]
    assert delivered == [m.body], f"{fe}: {TOPIC} holds {delivered} after the checked commit"
    return {
        "half answer": sent,
        "first check": fe.checks[0],
        "answer to the check's decision": fe.check_answers[0],
        "transaction": fe.tx_view(m.uniq),
    }


async def delay(fe: FrontEnd) -> Observed:
    """To be delivered 5 s after the test began (the same time on both front ends): remoting
    with the TIMER_DELIVER_MS property, gRPC with delivery_timestamp."""
    deliver = fe.born + 5000
    m = Msg(b"later", uniq(41), tag="TagLater", keys=("d-1",))
    sent = await fe.send(TOPIC, [m], deliver_ms=deliver)
    assert sent == [Sent(True, m.uniq, 0, "")], f"{fe}: delayed send answered {sent}"
    # Exact: held by the timer, not rounded up to a delay level.
    assert fe.stored(SCHEDULE_TOPIC) == [], f"{fe}: routed through the delay levels"
    [rec] = fe.stored(TIMER_TOPIC)
    assert rec.queue_id == 0 and C.DELAY not in rec.properties, (
        f"{fe}: stored in {rec.topic} queue {rec.queue_id}, {rec.properties}"
    )
    real = (
        rec.properties[TIMER_DELIVER_MS],
        rec.properties[C.REAL_TOPIC],
        rec.properties[C.REAL_QID],
    )
    assert real == (str(deliver), TOPIC, "0"), f"{fe}: stored {rec.properties}"
    assert fe.stored(TOPIC) == [], f"{fe}: the delayed message is in {TOPIC} already"
    return {"answers": sent}


async def dead_letter(fe: FrontEnd) -> Observed:
    """A consumer gives up on a message it got: remoting pulls it and sends it back with delay
    level -1, gRPC receives it and forwards it to the dead-letter queue."""
    m = Msg(b"poison", uniq(51), tag="TagDlq", keys=("bad-1",))
    [sent] = await fe.send(TOPIC, [m])
    assert sent.ok, f"{fe}: send answered {sent}"
    [got] = await fe.receive(TOPIC, GROUP, 1)
    answer = await fe.dead_letter(TOPIC, GROUP, got)
    assert answer.ok, f"{fe}: dead-lettering answered {answer}"
    [dlq] = fe.stored(f"%DLQ%{GROUP}")
    origin = (dlq.properties[C.RETRY_TOPIC], dlq.properties[C.ORIGIN_MESSAGE_ID])
    assert (dlq.body, dlq.reconsume_times, origin) == (m.body, 1, (TOPIC, m.uniq)), (
        f"{fe}: dead-lettered {dlq}"
    )
    return {
        "received": got,
        "dead-letter answer": answer,
        "dead-lettered": (
            dlq.body,
            dlq.properties[C.RETRY_TOPIC],
            dlq.properties[C.ORIGIN_MESSAGE_ID],
        ),
    }


async def pull(fe: FrontEnd) -> Observed:
    """Three messages sent one by one, read back: remoting PULL_MESSAGE, gRPC ReceiveMessage."""
    msgs = [
        Msg(b"p0", uniq(61), tag="TagA", keys=("a",)),
        Msg(b"p1", uniq(62)),
        Msg(b"p2", uniq(63), tag="TagB", keys=("b", "c")),
    ]
    for m in msgs:
        [sent] = await fe.send(TOPIC, [m])
        assert sent.ok, f"{fe}: send answered {sent}"
    got = await fe.receive(TOPIC, GROUP, len(msgs))
    assert [(r.body, r.tag, r.keys, r.message_id, r.queue_offset) for r in got] == [
        (m.body, m.tag, m.keys, m.uniq, i) for i, m in enumerate(msgs)
    ], f"{fe}: received {got}"
    return {"received": got}


async def resend(fe: FrontEnd) -> Observed:
    """The same message sent twice (its first answer lost in transit, the client sends it again
    with the same id): stored once, both answers the first send's."""
    m = Msg(b"sent twice", uniq(71), tag="TagAgain", keys=("r-1",))
    first = await fe.send(TOPIC, [m])
    again = await fe.send(TOPIC, [m])
    assert first == again == [Sent(True, m.uniq, 0, "")], (
        f"{fe}: answered {first}, then {again} to the resend"
    )
    stored = [r.msg_id for r in fe.stored(TOPIC)]
    assert stored == [m.uniq], f"{fe}: {TOPIC} holds {stored} after a resend"
    return {"answers": first + again}


async def resend_batch(fe: FrontEnd) -> Observed:
    """A batch sent again, then a batch holding one message already stored and a new one:
    only the new one is stored, each message answered with its first send."""
    a, b, c = (Msg(f"batch {i}".encode(), uniq(80 + i), tag="TagB") for i in range(3))
    first = await fe.send(TOPIC, [a, b])
    again = await fe.send(TOPIC, [a, b])
    mixed = await fe.send(TOPIC, [b, c])
    assert first == again == [Sent(True, a.uniq, 0, ""), Sent(True, b.uniq, 1, "")], (
        f"{fe}: answered {first}, then {again} to the resend"
    )
    assert [s.message_id for s in mixed] == [b.uniq, c.uniq] and all(s.ok for s in mixed), (
        f"{fe}: answered {mixed} to a batch of a resent and a new message"
    )
    stored = [r.msg_id for r in fe.stored(TOPIC)]
    assert stored == [a.uniq, b.uniq, c.uniq], f"{fe}: {TOPIC} holds {stored}"
    return {"answers": first + again, "mixed": [(s.message_id, s.ok) for s in mixed]}


async def resend_half(fe: FrontEnd) -> Observed:
    """A half sent twice: one half stored, one transaction, committed once."""
    m = Msg(b"half sent twice", uniq(91), tag="TagTx")
    sent, half = await fe.send_half(TOPIC, m)
    again, _ = await fe.send_half(TOPIC, m)
    assert sent == again == Sent(True, m.uniq, 0, m.uniq), (
        f"{fe}: half answered {sent}, then {again} to the resend"
    )
    halves = [r.msg_id for r in fe.stored(fe.broker.transactions.half_topic)]
    assert halves == [m.uniq], f"{fe}: the half topic holds {halves}"
    ended = await fe.end(TOPIC, half, "COMMIT")
    assert ended.ok, f"{fe}: COMMIT answered {ended}"
    delivered = [r.msg_id for r in fe.stored(TOPIC)]
    assert delivered == [m.uniq], f"{fe}: {TOPIC} holds {delivered} after the commit"
    return {"half answers": (sent, again), "transaction": fe.tx_view(m.uniq)}


async def over_quota(fe: FrontEnd) -> Observed:
    """A producer over its byte rate: the first send passes (the bucket's burst), the next is
    refused at once, nothing of it stored; both front ends give the quota's text."""
    m1, m2 = Msg(b"x" * 200, uniq(91)), Msg(b"y" * 10, uniq(92))
    first = await fe.send(TOPIC, [m1])
    assert first == [Sent(True, m1.uniq, 0, "")], f"{fe}: send answered {first}"
    [refused] = await fe.send(TOPIC, [m2])
    code, _, text = refused.error.partition(": ")
    assert not refused.ok and code == str(QUOTA_REFUSAL[fe.name]), f"{fe}: answered {refused}"
    stored = [r.msg_id for r in fe.stored(TOPIC)]
    assert stored == [m1.uniq], f"{fe}: {TOPIC} holds {stored} after a refused send"
    # The wait it names depends on when the refusal came.
    return {"answers": first, "refusal": text.partition(": try again in ")[0]}


async def not_permitted(fe: FrontEnd) -> Observed:
    """An account the ACL lets read the topic but not send to it: its send is refused, nothing
    stored; an operator's send passes."""
    fe.credentials = READER
    [refused] = await fe.send(TOPIC, [Msg(b"refused", uniq(95))])
    code, _, text = refused.error.partition(": ")
    assert not refused.ok and code == str(ACL_REFUSAL[fe.name]), f"{fe}: answered {refused}"
    fe.credentials = OPERATOR
    m = Msg(b"permitted", uniq(96))
    sent = await fe.send(TOPIC, [m])
    assert sent == [Sent(True, m.uniq, 0, "")], f"{fe}: the operator's send answered {sent}"
    stored = [r.msg_id for r in fe.stored(TOPIC)]
    assert stored == [m.uniq], f"{fe}: {TOPIC} holds {stored}"
    # The text ends naming the request as its protocol calls it ("request code
    # SEND_MESSAGE_V2", "RPC SendMessage").
    return {"answers": sent, "refusal": text.rpartition(", ")[0]}


def bodies(got: list[Received]) -> list[bytes]:
    return [r.body for r in got]


async def reset_offset(fe: FrontEnd) -> Observed:
    """A live group consumed three messages; an operator resets its offsets to the earliest:
    the group gets the three again (gRPC: its POP view starts again there instead of writing
    its old position back with the next ack)."""
    msgs = [Msg(f"r{i}".encode(), uniq(100 + i), tag="TagR") for i in range(3)]
    for m in msgs:
        [sent] = await fe.send(TOPIC, [m])
        assert sent.ok, f"{fe}: send answered {sent}"
    first = await fe.consume(TOPIC, GROUP, 3)
    assert bodies(first) == [m.body for m in msgs], f"{fe}: consumed {first}"
    reset = await fe.reset_to_earliest(TOPIC, GROUP)
    assert reset.ok, f"{fe}: reset answered {reset}"
    assert fe.broker.offsets.query(GROUP, TOPIC, 0) == 0, f"{fe}: the reset did not commit 0"
    again = await fe.consume(TOPIC, GROUP, 3)
    assert bodies(again) == [m.body for m in msgs], f"{fe}: after the reset consumed {again}"
    return {"first": first, "reset": reset, "again": again}


async def filtered_read(fe: FrontEnd) -> Observed:
    """A group keeping tag TagA of a topic holding TagA, TagB and untagged messages gets the
    TagA ones, in order, and its offset passes the others."""
    msgs = [
        Msg(b"a0", uniq(111), tag="TagA"),
        Msg(b"b0", uniq(112), tag="TagB"),
        Msg(b"none", uniq(113)),
        Msg(b"a1", uniq(114), tag="TagA"),
    ]
    for m in msgs:
        [sent] = await fe.send(TOPIC, [m])
        assert sent.ok, f"{fe}: send answered {sent}"
    got = await fe.consume(TOPIC, GROUP, 2, tag="TagA")
    assert bodies(got) == [b"a0", b"a1"], f"{fe}: TagA consumed {got}"
    await wait_until(
        lambda: fe.broker.offsets.query(GROUP, TOPIC, 0) == len(msgs),
        WAIT_S,
        f"{fe}: the group's offset past the filtered-out messages",
    )
    return {"received": got}


@dataclass(frozen=True)
class Scenario:
    run: Callable[[FrontEnd], Awaitable[Observed]]
    #: Broker config of both brokers, over :data:`CONFIG`.
    config: dict[str, Any] = field(default_factory=dict)
    #: Properties whose position differs by front end (values compared), each with its reason
    #: at the scenario.
    unordered: frozenset[str] = frozenset()
    #: A plain_acl.yml for both brokers (ACL on), "" for none.
    acl: str = ""


SCENARIOS: dict[str, Scenario] = {
    "send": Scenario(send_one),
    "batch": Scenario(send_batch),
    "half + commit": Scenario(half_then("COMMIT")),
    "half + rollback": Scenario(half_then("ROLLBACK")),
    "half + unknown": Scenario(half_then("UNKNOWN")),
    "check-back": Scenario(check_back, CHECKING),
    # A remoting producer's own TIMER_DELIVER_MS keeps its place; the gRPC front end turns
    # delivery_timestamp into TIMER_DELIVER_MS after the user's properties
    # (MessagingCore.deliver_at).
    "delay": Scenario(delay, unordered=frozenset({TIMER_DELIVER_MS})),
    # A remoting consumer names the origin id in CONSUMER_SEND_MSG_BACK (originMsgId), which the
    # core records on the message before its copy adds RETRY_TOPIC; ForwardMessageToDeadLetter-
    # Queue has no such field, so the copy adds RETRY_TOPIC, then ORIGIN_MESSAGE_ID.
    "dead letter": Scenario(dead_letter, unordered=frozenset({C.ORIGIN_MESSAGE_ID})),
    "pull": Scenario(pull),
    "resend": Scenario(resend),
    "resend batch": Scenario(resend_batch),
    "resend half": Scenario(resend_half),
    "reset offset on a live group": Scenario(reset_offset),
    "filtered read": Scenario(filtered_read),
    "over the produce quota": Scenario(over_quota, QUOTA),
    "not permitted by the ACL": Scenario(not_permitted, acl=ACL),
}


async def create_topic(broker: BrokerController, topic: str) -> None:
    async with connected(broker.address) as admin:
        h = CreateTopicRequestHeader(topic=topic, read_queue_nums=1, write_queue_nums=1)
        cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, h.to_ext_fields())
        if broker.config.acl_enable:
            OPERATOR.sign(cmd)
        r = await admin.conn.request(cmd, WAIT_S)
        assert r.code == ResponseCode.SUCCESS, r.remark


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_both_front_ends_store_and_answer_alike(
    name: str, make_broker_config: Any, tmp_path: Any
) -> None:
    """The scenario over remoting against broker A, over gRPC against broker B: the same
    answers, transaction records and commit logs (but for the differences named above)."""
    scenario = SCENARIOS[name]
    config = {**CONFIG, **scenario.config}
    if scenario.acl:
        acl = write_acl(tmp_path, scenario.acl)
        config.update(acl_enable=True, plain_acl_file=str(acl))
    born = int(time.time() * 1000)
    observed: dict[str, Observed] = {}
    records: dict[str, list[MessageExt]] = {}
    async with contextlib.AsyncExitStack() as stack:
        for kind in (Remoting, Grpc):
            broker = BrokerController(make_broker_config(**config))
            await broker.start()
            stack.push_async_callback(broker.shutdown)
            await create_topic(broker, TOPIC)
            fe = kind(broker, born)
            await fe.start()
            stack.push_async_callback(fe.close)
            observed[fe.name] = await scenario.run(fe)
            # Read now: a later change (a delayed message delivered) must not reach one side only.
            records[fe.name] = commit_log(broker)

    a, b = observed["remoting"], observed["gRPC"]
    assert a.keys() == b.keys(), (
        f"{name}: observed {sorted(a)} over remoting, {sorted(b)} over gRPC"
    )
    for key in a:
        assert a[key] == b[key], f"{name}: {key} differs: remoting {a[key]!r}, gRPC {b[key]!r}"
    la, lb = (
        normalised(records[fe], scenario.unordered, OP_REMARK_SUFFIX[fe])
        for fe in ("remoting", "gRPC")
    )
    assert [r["topic"] for r in la] == [r["topic"] for r in lb], (
        f"{name}: the commit logs hold different records"
    )
    for i, (ra, rb) in enumerate(zip(la, lb, strict=True)):
        assert ra == rb, f"{name}: record {i} ({ra['topic']}) differs between the front ends"

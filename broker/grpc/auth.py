"""ACL 1.0 on the gRPC port: the same accounts, file, reload, address rules and permissions as
the remoting port (:mod:`txmq.broker.acl`), with the signature RocketMQ 5 clients send.  With
ACL 2.0 on, the broker's manager is a :class:`~txmq.broker.auth2.Auth2Manager`: the same
checks below are then answered from its users and policies.

Every call is checked before its method runs: the caller is authenticated from the call's
metadata (``authorization`` and ``x-mq-date-time``, :mod:`txmq.protocol.acl`), then the request
is authorized with the table :data:`RPC_NEEDS` (the resources each RPC touches and the
permission it needs, the remoting rules for the same operation).  A Telemetry stream is
authenticated when it opens and again with each Settings command it carries, which is
authorized like the request it announces (PUB on the topics it will publish, SUB on its group
and the topics it subscribes).  A refused call is answered in the response's ``Status``:
``UNAUTHORIZED`` (40100) when the identity check failed, ``FORBIDDEN`` (40300) when a permission
is missing, with the reason as the message; the broker logs ``acl_refused`` without the secret.

5.x producers have no group: the group of a 5.x half message is its topic.  So a transactional
send needs PUB on the topic only, and a check-back of a topic's transaction goes only to
Telemetry streams whose account holds PUB on that topic (:meth:`GrpcAccess.may_publish`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from txmq.protocol.acl import (
    GRPC_AUTHORIZATION,
    GRPC_DATE_TIME,
    parse_grpc_authorization,
    verify_grpc_signature,
)

from ..acl import ANY, PUB, SUB, Account, AclManager, Need, topic_or_group
from . import convert

if TYPE_CHECKING:
    from ..transaction.service import TransactionalMessageService
    from .h2calls import CallContext

#: The caller of the RPC being served: its access key, "" for a peer trusted by
#: ``globalWhiteRemoteAddresses``, None when the ACL is off.  Set per call (each gRPC call runs
#: in a task of its own).
CALLER: ContextVar[str | None] = ContextVar("txmq_grpc_caller", default=None)

Needs = tuple[bool, list[Need]]


#: The servicer context of a call (its request and response types vary by RPC): grpc's, or the
#: native transport's.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any] | CallContext"


def metadata(context: Context, key: str) -> str:
    """The first value of one metadata key ("" when absent)."""
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode("utf-8", "replace")
    return ""


def peer_address(context: Context) -> tuple[str, int]:
    """``ipv4:1.2.3.4:5678`` / ``ipv6:[::1]:5678`` -> (host, port)."""
    p = context.peer() or ""
    _, _, rest = p.partition(":")
    host, _, port = rest.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    return (host, int(port) if port.isdigit() else 0)


# -- what each RPC needs ------------------------------------------------------------------------


def _group_and_topic(group: Any, topic: Any) -> list[Need]:
    needs = []
    g, t = convert.resource_name(group), convert.resource_name(topic)
    if g:
        needs.append(Need(g, True, SUB))
    if t:
        needs.append(topic_or_group(t, SUB))
    return needs


def _group(request: Any) -> list[Need]:
    g = convert.resource_name(request.group) if request.HasField("group") else ""
    return [Need(g, True, SUB)] if g else []


def _route(request: Any, tx: TransactionalMessageService) -> Needs:
    topic = convert.resource_name(request.topic)
    return False, [topic_or_group(topic, ANY)] if topic else []


def _send(request: Any, tx: TransactionalMessageService) -> Needs:
    # Authenticated here; authorized by the send use case, once for both front ends
    # (broker/messaging/admission.py: PUB on each topic; a half's group is its topic).
    return False, []


def _end_transaction(request: Any, tx: TransactionalMessageService) -> Needs:
    needs = []
    topic = convert.resource_name(request.topic)
    if topic:
        needs.append(topic_or_group(topic, PUB))
    rec = tx.records.get(request.transaction_id) if request.transaction_id else None
    if rec is not None:
        topics = {h.real_topic for h in rec.halves}
        needs.extend(Need(t, False, PUB) for t in sorted(topics))
        if rec.producer_group not in topics:  # a remoting producer's half: its group too
            needs.append(Need(rec.producer_group, True, PUB))
    return False, needs


def _receive(request: Any, tx: TransactionalMessageService) -> Needs:
    return False, _group_and_topic(request.group, request.message_queue.topic)


def _group_topic_request(request: Any, tx: TransactionalMessageService) -> Needs:
    return False, _group_and_topic(request.group, request.topic)


def _group_only(request: Any, tx: TransactionalMessageService) -> Needs:
    return False, _group(request)


def _recall(request: Any, tx: TransactionalMessageService) -> Needs:
    topic = convert.resource_name(request.topic)
    return False, [topic_or_group(topic, PUB)] if topic else []


def _signature_only(request: Any, tx: TransactionalMessageService) -> Needs:
    return False, []


def settings_needs(settings: Any) -> list[Need]:
    """What a client's Settings announce: PUB on each topic it will publish, SUB on its group
    and on each topic it subscribes."""
    which = settings.WhichOneof("pub_sub")
    if which == "publishing":
        names = {convert.resource_name(t) for t in settings.publishing.topics}
        return [topic_or_group(t, PUB) for t in sorted(names) if t]
    if which == "subscription":
        sub = settings.subscription
        needs = [Need(g, True, SUB)] if (g := convert.resource_name(sub.group)) else []
        for e in sub.subscriptions:
            if t := convert.resource_name(e.topic):
                needs.append(topic_or_group(t, SUB))
        return needs
    return []


def _telemetry(command: Any, tx: TransactionalMessageService) -> Needs:
    if command is None or not command.HasField("settings"):
        return False, []
    return False, settings_needs(command.settings)


#: Every RPC of ``apache.rocketmq.v2.MessagingService`` and what it needs (RPCs txmq answers
#: NOT_IMPLEMENTED need a valid signature only; an RPC missing here needs an admin account).
RPC_NEEDS: dict[str, Callable[[Any, TransactionalMessageService], Needs]] = {
    "QueryRoute": _route,
    "Heartbeat": _group_only,
    "SendMessage": _send,
    "QueryAssignment": _group_topic_request,
    "ReceiveMessage": _receive,
    "AckMessage": _group_topic_request,
    "ForwardMessageToDeadLetterQueue": _group_topic_request,
    "ChangeInvisibleDuration": _group_topic_request,
    "EndTransaction": _end_transaction,
    "Telemetry": _telemetry,
    "NotifyClientTermination": _group_only,
    "PullMessage": _signature_only,
    "UpdateOffset": _signature_only,
    "GetOffset": _signature_only,
    "QueryOffset": _signature_only,
    "RecallMessage": _recall,
    "SyncLiteSubscription": _signature_only,
}


# -- the check ----------------------------------------------------------------------------------


class GrpcAccess:
    """The per-call check of the gRPC front end over the broker's :class:`AclManager`."""

    def __init__(self, acl: AclManager, transactions: TransactionalMessageService) -> None:
        self.acl = acl
        self.transactions = transactions

    def admit(self, method: str, request: Any, context: Context) -> str:
        """Authenticate the caller and authorize ``request`` (None: authenticate only); the
        caller's access key ("" for a trusted peer).

        Raises:
            AclDenied: saying which check failed.
        """
        host, port = peer_address(context)
        where = {"peer": f"{host}:{port}", "rpc": method}
        what = f"RPC {method}"
        if self.acl.config.trusted(host):
            return ""
        account = self._authenticate(host, context, what, where)
        assert account is not None  # not trusted
        if request is not None:
            needs_of = RPC_NEEDS.get(method)
            if needs_of is None:
                self.acl.authorize(account, True, [], what, where)
            else:
                admin_only, needs = needs_of(request, self.transactions)
                self.acl.authorize(account, admin_only, needs, what, where)
        return account.access_key

    def _authenticate(
        self, host: str, context: Context, what: str, where: dict[str, Any]
    ) -> Account | None:
        raw = metadata(context, GRPC_AUTHORIZATION)
        if not raw:
            return self.acl.authenticate(host, None, lambda a: False, what, where)
        try:
            auth = parse_grpc_authorization(raw)
        except ValueError as exc:
            self.acl.refuse(
                f"cannot read the authorization metadata of {what}: {exc}",
                None,
                where,
                authn=True,
            )
        date_time = metadata(context, GRPC_DATE_TIME)

        def signed(account: Account) -> bool:
            return bool(date_time) and verify_grpc_signature(auth, date_time, account.secret_key)

        return self.acl.authenticate(host, auth.access_key or None, signed, what, where)

    def may_publish(self, host: str, access_key: str | None, topic: str) -> bool:
        """Whether a stream authenticated as ``access_key`` from ``host`` may be asked about a
        transaction of ``topic`` (PUB on it, under the accounts in force now)."""
        return self.acl.may(host, access_key, Need(topic, False, PUB))

"""ACL 1.0 (RocketMQ's plain access control) on the remoting port; the gRPC front end checks its
calls with the same accounts through :mod:`txmq.broker.grpc.auth`.

Turned on with ``aclEnable = true``; the accounts live in a YAML file in RocketMQ's
``plain_acl.yml`` shape (``plainAclFile``, see docs/security.md).  PyYAML reads it: the file
format is YAML (RocketMQ reads it with SnakeYAML), and operators copy their existing files.

Every request is checked at the broker's single dispatch point, before its processor runs:

1. a peer whose address matches ``globalWhiteRemoteAddresses`` is trusted without credentials;
2. otherwise the request must carry ``AccessKey`` of a known account, come from an address the
   account's ``whiteRemoteAddress`` allows (when it names any), and carry a valid ``Signature``
   (:mod:`txmq.protocol.acl`);
3. the account must hold the permission each resource of the request needs (see
   :func:`requirements`), and be ``admin`` for operator requests.

A refusal is answered NO_PERMISSION with a remark saying which check failed, and logged
without the secret.  The file is polled for changes from the broker's housekeeping (the read
runs off the event loop); a file that no longer parses leaves the previous accounts in force.
Check-back (CHECK_TRANSACTION_STATE) is only sent to connections authenticated for the
producer group (:meth:`AclManager.may_produce`).
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import structlog
import yaml

from txmq.protocol.acl import ACCESS_KEY, verify_signature
from txmq.protocol.codes import RequestCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import InvalidParameterError, NoPermissionError
from txmq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    DecideBatchRequestHeader,
    EndTransactionRequestHeader,
    ForceDecideRequestHeader,
    ListTransactionsRequestHeader,
)
from txmq.protocol.locks import LockBatchRequest
from txmq.protocol.topics import AUTO_CREATE_TOPIC_KEY_TOPIC, RETRY_GROUP_TOPIC_PREFIX

from .quota import QuotaLimits
from .transaction.state import pipeline_run

if TYPE_CHECKING:
    from txmq.protocol.aio import Connection

    from .transaction.service import TransactionalMessageService

log = structlog.get_logger(__name__)

# RocketMQ's permission bits (org.apache.rocketmq.acl.common.Permission).
DENY = 1
ANY = 2
PUB = 4
SUB = 8

_PERM_NAMES = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}

#: Context key on a connection: the access key of its last accepted request ("" when the peer
#: was trusted by ``globalWhiteRemoteAddresses``).
CONTEXT_KEY = "acl_access_key"

_COMMIT = 0x8


class AclConfigError(ValueError):
    """The ACL file cannot be used; the message names the file and the entry."""


class AclDenied(NoPermissionError):
    """A refused request; ``authentication`` tells a failed identity check (no or unknown
    key, forbidden address, bad signature) from a missing permission."""

    def __init__(self, message: str, *, authentication: bool) -> None:
        super().__init__(message)
        self.authentication = authentication


def perm_name(perm: int) -> str:
    if perm & DENY:
        return "DENY"
    names = [n for n, bit in (("PUB", PUB), ("SUB", SUB)) if perm & bit]
    return "|".join(names) or "DENY"


def parse_perm(text: Any, where: str) -> int:
    perm = _PERM_NAMES.get(str(text).strip().upper().replace(" ", ""))
    if perm is None:
        raise AclConfigError(f"{where}: permission must be PUB, SUB, PUB|SUB or DENY, got {text!r}")
    return perm


def permits(owned: int, needed: int) -> bool:
    """RocketMQ's rule: DENY wins; ANY needs PUB or SUB; otherwise every needed bit."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return owned & needed == needed


# -- remote addresses --------------------------------------------------------------------------


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


class AddressPattern:
    """One remote-address rule in RocketMQ's notation: ``*`` (anyone), an exact address,
    a comma list, ``192.168.1.{10,11}``, per-octet ranges and wildcards (``192.168.1.1-100``,
    ``10.10.*.*``), and CIDR blocks (``10.0.0.0/8``) as an addition."""

    def __init__(self, spec: str, where: str) -> None:
        self.spec = spec.strip()
        self._any = self.spec in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*")
        self._exact: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
        self._networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self._ranges: list[list[tuple[int, int]]] = []
        if self._any or not self.spec:
            return
        for part in self._expand(self.spec, where):
            self._add(part, where)

    @staticmethod
    def _expand(spec: str, where: str) -> list[str]:
        if spec.endswith("}"):
            head, brace, tail = spec.partition("{")
            if not brace or not head.endswith((".", ":")):
                raise AclConfigError(f"{where}: cannot read address pattern {spec!r}")
            return [head + x.strip() for x in tail[:-1].split(",") if x.strip()]
        return [x.strip() for x in spec.split(",") if x.strip()]

    def _add(self, part: str, where: str) -> None:
        if "/" in part:
            try:
                self._networks.append(ipaddress.ip_network(part, strict=False))
            except ValueError:
                raise AclConfigError(f"{where}: {part!r} is not a valid CIDR block") from None
            return
        addr = _ip(part)
        if addr is not None:
            self._exact.add(addr)
            return
        octets = part.split(".")
        if ":" in part or not 2 <= len(octets) <= 4:
            raise AclConfigError(f"{where}: {part!r} is not an IP address or address pattern")
        if len(octets) < 4:
            if octets[-1] != "*":
                raise AclConfigError(f"{where}: {part!r} needs four octets")
            octets += ["*"] * (4 - len(octets))
        bounds: list[tuple[int, int]] = []
        for o in octets:
            o = o.strip()
            try:
                if o == "*":
                    lo, hi = 0, 255
                elif "-" in o:
                    a, _, b = o.partition("-")
                    lo, hi = int(a), int(b)
                else:
                    lo = hi = int(o)
            except ValueError:
                raise AclConfigError(f"{where}: {part!r} has an invalid octet {o!r}") from None
            if not 0 <= lo <= hi <= 255:
                raise AclConfigError(f"{where}: {part!r} has an invalid octet range {o!r}")
            bounds.append((lo, hi))
        self._ranges.append(bounds)

    @property
    def blank(self) -> bool:
        return not self.spec

    def match(self, host: str) -> bool:
        if self._any:
            return True
        addr = _ip(host)
        if addr is None:
            return False
        if addr in self._exact or any(addr in n for n in self._networks):
            return True
        if self._ranges and isinstance(addr, ipaddress.IPv4Address):
            octets = [int(x) for x in str(addr).split(".")]
            return any(
                all(lo <= o <= hi for o, (lo, hi) in zip(octets, r, strict=True))
                for r in self._ranges
            )
        return False


# -- accounts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: AddressPattern | None = None
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    topic_perms: dict[str, int] = field(default_factory=dict)
    group_perms: dict[str, int] = field(default_factory=dict)
    #: The account's own quotas (``produceByteRate``, ``consumeByteRate``, ``maxConnections``).
    quota: QuotaLimits = field(default_factory=QuotaLimits)

    def perm(self, resource: str, group: bool) -> int:
        table = self.group_perms if group else self.topic_perms
        owned = table.get(resource)
        if owned is not None:
            return owned
        if self.admin:
            return PUB | SUB  # "an admin account can access all resources"
        return self.default_group_perm if group else self.default_topic_perm


@dataclass(frozen=True)
class AclConfig:
    global_white: tuple[AddressPattern, ...] = ()
    accounts: dict[str, Account] = field(default_factory=dict)

    def trusted(self, host: str) -> bool:
        return any(p.match(host) for p in self.global_white)


def _as_list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise AclConfigError(f"{where} must be a list")
    return value


def _as_bool(value: Any, where: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("true", "false"):
        return s == "true"
    raise AclConfigError(f"{where} must be true or false, got {value!r}")


def _as_limit(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise AclConfigError(f"{where} must be a whole number, got {value!r}")
    try:
        n = int(value)
    except ValueError:
        raise AclConfigError(f"{where} must be a whole number, got {value!r}") from None
    if n < 0:
        raise AclConfigError(f"{where} must be 0 (unlimited) or more, got {n}")
    return n


def _resource_perms(value: Any, where: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, entry in enumerate(_as_list(value, where)):
        name, eq, perm = str(entry).rpartition("=")
        if not eq or not name.strip():
            raise AclConfigError(f"{where}[{i}] must look like NAME=PERM, got {entry!r}")
        out[name.strip()] = parse_perm(perm, f"{where}[{i}]")
    return out


def parse_acl_document(doc: Any, source: str) -> AclConfig:
    """Build the ACL from the parsed YAML of a ``plain_acl.yml`` file.

    Raises:
        AclConfigError: naming the file and the entry that is wrong.
    """
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise AclConfigError(f"{source}: the top level must be a mapping")
    known = {"globalWhiteRemoteAddresses", "accounts", "dataVersion"}
    unknown = sorted(map(str, set(doc) - known))
    if unknown:
        raise AclConfigError(f"{source}: unknown key(s) {', '.join(map(str, unknown))}")
    white = tuple(
        AddressPattern(str(x), f"{source}: globalWhiteRemoteAddresses[{i}]")
        for i, x in enumerate(_as_list(doc.get("globalWhiteRemoteAddresses"), "globalWhite"))
        if x is not None and str(x).strip()
    )
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(_as_list(doc.get("accounts"), f"{source}: accounts")):
        where = f"{source}: accounts[{i}]"
        if not isinstance(raw, dict):
            raise AclConfigError(f"{where} must be a mapping")
        ak = "" if raw.get("accessKey") is None else str(raw["accessKey"])
        sk = "" if raw.get("secretKey") is None else str(raw["secretKey"])
        if len(ak) < 6 or len(sk) < 6:
            raise AclConfigError(f"{where}: accessKey and secretKey need at least 6 characters")
        if ak in accounts:
            raise AclConfigError(f"{where}: accessKey {ak!r} is listed twice")
        wra = raw.get("whiteRemoteAddress")
        pattern = AddressPattern(str(wra), f"{where}.whiteRemoteAddress") if wra else None
        accounts[ak] = Account(
            access_key=ak,
            secret_key=sk,
            white_remote_address=pattern,
            admin=_as_bool(raw.get("admin"), f"{where}.admin"),
            default_topic_perm=parse_perm(
                raw.get("defaultTopicPerm") or "DENY", f"{where}.defaultTopicPerm"
            ),
            default_group_perm=parse_perm(
                raw.get("defaultGroupPerm") or "DENY", f"{where}.defaultGroupPerm"
            ),
            topic_perms=_resource_perms(raw.get("topicPerms"), f"{where}.topicPerms"),
            group_perms=_resource_perms(raw.get("groupPerms"), f"{where}.groupPerms"),
            quota=QuotaLimits(
                *(
                    _as_limit(raw.get(k), f"{where}.{k}")
                    for k in ("produceByteRate", "consumeByteRate", "maxConnections")
                )
            ),
        )
    return AclConfig(white, accounts)


def load_acl_file(path: str) -> AclConfig:
    """Read and parse the ACL file (blocking: call it off the event loop)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except FileNotFoundError:
        raise AclConfigError(f"ACL file not found: {path}") from None
    except OSError as exc:
        raise AclConfigError(f"ACL file {path} cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise AclConfigError(f"ACL file {path} is not valid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise AclConfigError(f"ACL file {path} is not UTF-8 text: {exc}") from None
    except RecursionError:
        raise AclConfigError(f"ACL file {path} is nested too deeply") from None
    return parse_acl_document(doc, path)


# -- what a request needs ----------------------------------------------------------------------


@dataclass(frozen=True)
class Need:
    resource: str
    group: bool
    perm: int

    def describe(self) -> str:
        return f"{'group' if self.group else 'topic'} {self.resource!r}"


#: The admin-only requests that only read: broker-wide views, message lookup by offset, the
#: operator's transaction listings, and the name server's and the admin tools' views.
ADMIN_READS = frozenset(
    {
        RequestCode.GET_ALL_TOPIC_CONFIG,
        RequestCode.GET_BROKER_RUNTIME_INFO,
        RequestCode.TXMQ_GET_METRICS,
        RequestCode.VIEW_MESSAGE_BY_ID,
        RequestCode.TXMQ_LIST_TRANSACTIONS,
        RequestCode.TXMQ_GET_TRANSACTION,
        RequestCode.GET_BROKER_CONFIG,
        RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        RequestCode.GET_CONSUME_STATS,
        RequestCode.GET_CONSUMER_CONNECTION_LIST,
        RequestCode.GET_PRODUCER_CONNECTION_LIST,
        # the name server's and the admin tools' views (mqadmin, rocketmq-dashboard)
        RequestCode.GET_BROKER_CLUSTER_INFO,
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
        RequestCode.GET_TOPICS_BY_CLUSTER,
        RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS,
        RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER,
        RequestCode.QUERY_TOPIC_CONSUME_BY_WHO,
        RequestCode.QUERY_TOPICS_BY_CONSUMER,
        RequestCode.VIEW_BROKER_STATS_DATA,
        RequestCode.GET_TOPIC_CONFIG,
    }
)

#: Requests only an admin account may make: topic management, broker-wide views, message
#: lookup by offset, and the operator's transaction commands (a listing of one producer
#: group's two-phase transactions excepted: see :func:`requirements`).  Any code not listed in
#: :func:`requirements` is treated as admin-only too.
ADMIN_CODES = ADMIN_READS | frozenset(
    {
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.RESUME_CHECK_HALF_MESSAGE,
        RequestCode.TXMQ_FORCE_DECIDE,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
    }
)


def topic_or_group(topic: str, perm: int) -> Need:
    """A retry topic stands for its consumer group."""
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return Need(topic[len(RETRY_GROUP_TOPIC_PREFIX) :], True, SUB)
    return Need(topic, False, perm)


def _field(ext: dict[str, Any], key: str) -> str | None:
    v = ext.get(key)
    return None if v is None or v == "" else str(v)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _heartbeat_needs(body: bytes) -> list[Need]:
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return []  # the processor answers what is wrong with it
    needs: list[Need] = []
    if not isinstance(data, dict):
        return needs
    for c in _list(data.get("consumerDataSet")):
        if not isinstance(c, dict) or not c.get("groupName"):
            continue
        needs.append(Need(str(c["groupName"]), True, SUB))
        for s in _list(c.get("subscriptionDataSet")):
            if isinstance(s, dict) and s.get("topic"):
                needs.append(topic_or_group(str(s["topic"]), SUB))
    return needs


def _transaction_needs(
    tx: TransactionalMessageService, txids: Iterable[str], group: str
) -> list[Need]:
    needs = [Need(group, True, PUB)]
    for txid in txids:
        rec = tx.records.get(txid)
        if rec is None:
            continue
        needs.append(Need(rec.producer_group, True, PUB))
        needs.extend(Need(h.real_topic, False, PUB) for h in rec.halves)
    return needs


def _batch_ack_needs(body: bytes) -> list[Need]:
    """BATCH_ACK_MESSAGE acks for the groups and topics its body names: SUB on each.

    Raises:
        InvalidParameterError: the body is not a BatchAckMessageRequestBody."""
    try:
        doc = json.loads(body.decode("utf-8")) if body else {}
        acks = doc.get("acks") or []
        pairs = {
            (str(a.get("c", a.get("consumerGroup"))), str(a.get("t", a.get("topic")))) for a in acks
        }
    except (ValueError, AttributeError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"BATCH_ACK_MESSAGE body is not valid: {exc}") from None
    needs: list[Need] = []
    for group, topic in sorted(pairs):
        needs += [Need(group, True, SUB), topic_or_group(topic, SUB)]
    return needs


# One table of the request codes' needs, first match wins: split, a code's rule is harder to find.
def requirements(cmd: RemotingCommand, tx: TransactionalMessageService) -> tuple[bool, list[Need]]:
    """``(admin_only, resources)`` for one request.

    Raises:
        InvalidParameterError: a header the check needs is missing or malformed.
    """
    R = RequestCode
    code, ext = cmd.code, cmd.ext_fields
    if code in (R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE):
        # Authenticated here; authorized by the send use case, once for both front ends
        # (broker/messaging/admission.py: PUB on the topic, and on the producer group of halves).
        return False, []
    if code == R.RECALL_MESSAGE:  # what a send of its topic needs (RocketMQ: PUB)
        topic = _field(ext, "topic")
        return False, [topic_or_group(topic, PUB)] if topic else []
    if code == R.CONSUMER_SEND_MSG_BACK:
        b = ConsumerSendMsgBackRequestHeader.from_ext_fields(ext)
        needs = [Need(b.group, True, SUB)]
        if b.origin_topic:
            needs.append(topic_or_group(b.origin_topic, SUB))
        return False, needs
    if code == R.BATCH_ACK_MESSAGE:
        return False, _batch_ack_needs(cmd.body)
    if code in (
        R.PULL_MESSAGE,
        R.QUERY_CONSUMER_OFFSET,
        R.UPDATE_CONSUMER_OFFSET,
        R.POP_MESSAGE,
        R.ACK_MESSAGE,
        R.CHANGE_MESSAGE_INVISIBLETIME,
    ):
        group, topic = _field(ext, "consumerGroup"), _field(ext, "topic")
        needs = []
        if group:
            needs.append(Need(group, True, SUB))
        if topic:
            needs.append(topic_or_group(topic, SUB))
        return False, needs
    if code == R.HEART_BEAT:
        return False, _heartbeat_needs(cmd.body)
    if code in (R.LOCK_BATCH_MQ, R.UNLOCK_BATCH_MQ):
        try:  # an orderly consumer's queue locks need what its pulls need
            lock = LockBatchRequest.decode(cmd.body)
        except InvalidParameterError:
            return False, []  # the processor answers what is wrong with the body
        topics = sorted({mq[0] for mq in lock.mq_set})
        return False, [Need(lock.consumer_group, True, SUB)] + [
            topic_or_group(t, SUB) for t in topics
        ]
    if code in (R.UNREGISTER_CLIENT, R.GET_CONSUMER_LIST_BY_GROUP):
        group = _field(ext, "consumerGroup")
        return False, [Need(group, True, SUB)] if group else []
    if code == R.CHECK_CLIENT_CONFIG:
        # A consumer asks whether its subscription's kind is served; the answer says nothing
        # about anyone's data, so any account may ask.
        return False, []
    if code in (R.GET_MAX_OFFSET, R.GET_MIN_OFFSET, R.SEARCH_OFFSET_BY_TIMESTAMP, R.QUERY_MESSAGE):
        topic = _field(ext, "topic")
        return False, [topic_or_group(topic, SUB)] if topic else []
    if code == R.GET_ROUTEINFO_BY_TOPIC and _field(ext, "topic") == AUTO_CREATE_TOPIC_KEY_TOPIC:
        # Stock clients ask for the auto-create template's route before a new topic's first
        # send; the send itself needs PUB on the new topic.
        return False, []
    if code == R.TXMQ_CLUSTER_STATUS:
        # Brokers, groups and leaders, as route answers name them: the SDK asks for it to find
        # its group's leader, so any account may.
        return False, []
    if code in (R.GET_ROUTEINFO_BY_TOPIC, R.GET_TOPIC_STATS_INFO):
        topic = _field(ext, "topic")
        return False, [topic_or_group(topic, ANY)] if topic else []
    if code == R.END_TRANSACTION:
        e = EndTransactionRequestHeader.from_ext_fields(ext)
        rec = tx.machine.find(e.transaction_id, e.commit_log_offset)
        return False, _transaction_needs(tx, [rec.transaction_id] if rec else [], e.producer_group)
    if code == R.TXMQ_DECIDE_BATCH:
        d = DecideBatchRequestHeader.from_ext_fields(ext)
        members = tx.machine.batch_members.get((d.producer_group, d.batch_key), set())
        try:
            doc = json.loads(cmd.body.decode("utf-8")) if cmd.body else {}
            listed = [str(x) for x in doc.get("commit", [])] if isinstance(doc, dict) else []
            # A pipeline's decision, or a query naming its run, rolls back the orphans of the
            # pipeline's other runs: the same rights as rolling them back one by one.
            pipeline = doc.get("pipeline") if isinstance(doc, dict) else None
            if pipeline is not None:
                run = doc.get("run") if d.query_only else pipeline_run(str(pipeline), d.batch_key)
                if run is not None:
                    orphans = tx.machine.orphans_of(d.producer_group, str(pipeline), str(run))
                    listed += [t for txids in orphans.values() for t in txids]
        except (UnicodeDecodeError, json.JSONDecodeError, TypeError):
            listed = []  # the processor answers what is wrong with the body
        return False, _transaction_needs(tx, sorted(members) + listed, d.producer_group)
    if code == R.TXMQ_LIST_TRANSACTIONS:
        lt = ListTransactionsRequestHeader.from_ext_fields(ext)
        if lt.two_phase and lt.producer_group:
            # A coordinator's recovery (the SDK's recover()): the two-phase transactions of its
            # producer group, with the rights deciding them takes (the listing shows no more).
            group = lt.producer_group
            txids = [
                r.transaction_id
                for r in tx.records.values()
                if r.two_phase and r.producer_group == group
            ]
            return False, _transaction_needs(tx, txids, group)
        return True, []
    if code == R.TXMQ_FORCE_DECIDE:
        # A rollback by an account that may publish the transaction's group and topics is what
        # its own producer could do with END_TRANSACTION; a forced commit stays admin-only.
        f = ForceDecideRequestHeader.from_ext_fields(ext)
        rec = tx.records.get(f.transaction_id)
        if f.commit_or_rollback != _COMMIT and rec is not None:
            return False, _transaction_needs(tx, [rec.transaction_id], rec.producer_group)
        return True, []
    return True, []


# -- the checker -------------------------------------------------------------------------------


def code_name(code: int) -> str:
    """A request code as refusals name it: ``310 (SEND_MESSAGE_V2)``."""
    try:
        return f"{code} ({RequestCode(code).name})"
    except ValueError:
        return str(code)


class AclManager:
    """The accounts in force and the per-request check.

    Args:
        path: the ``plain_acl.yml`` file.
        transactions: looked up for the topics and group of a transaction being decided.
    """

    def __init__(self, path: str, transactions: TransactionalMessageService | None = None) -> None:
        self.path = path
        self.transactions = transactions
        self.config = AclConfig()
        self._stamp: tuple[float, int] | None = None
        self.reloads = 0

    # -- the file -------------------------------------------------------------------------------

    def _file_stamp(self) -> tuple[float, int] | None:
        """The file's modification time and :meth:`_stamp_id`, None when it is missing."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime, self._stamp_id(st))

    @staticmethod
    def _stamp_id(st: os.stat_result) -> int:
        """What tells a changed file apart besides its modification time: its size."""
        return st.st_size

    def load(self) -> None:
        """Read the file now (blocking).  Raises :class:`AclConfigError`."""
        stamp = self._file_stamp()
        self.config = load_acl_file(self.path)
        self._stamp = stamp
        log.info(
            "acl_loaded",
            file=self.path,
            accounts=len(self.config.accounts),
            global_white=[p.spec for p in self.config.global_white],
        )

    def poll(self) -> AclConfig | None:
        """A new configuration if the file changed since the last read, else None (blocking:
        run it off the event loop; install the result with :meth:`install`).  A file that
        cannot be used is logged and leaves the accounts in force."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        if stamp is None:
            log.error("acl_file_missing", file=self.path, keeping="previous accounts")
            return None
        try:
            return load_acl_file(self.path)
        except AclConfigError as exc:
            log.error("acl_reload_failed", error=str(exc), keeping="previous accounts")
            return None

    def install(self, config: AclConfig) -> None:
        self.config = config
        self.reloads += 1
        log.info("acl_reloaded", file=self.path, accounts=len(config.accounts))

    # -- the check ------------------------------------------------------------------------------

    def refuse(self, why: str, ak: str | None, where: dict[str, Any], *, authn: bool) -> NoReturn:
        """Log the refusal (never the secret) and raise :class:`AclDenied`."""
        log.warning("acl_refused", **where, access_key=ak, reason=why)
        raise AclDenied(f"ACL: {why}", authentication=authn)

    def authenticate(
        self,
        host: str,
        ak: str | None,
        signed: Callable[[Account], bool],
        what: str,
        where: dict[str, Any],
    ) -> Account | None:
        """Who makes a request: ``None`` for a peer trusted by ``globalWhiteRemoteAddresses``,
        else the account of ``ak``, used from an address it allows, whose secret
        ``signed(account)`` confirms.  ``what`` names the request in refusals, ``where`` goes
        into the log line.

        Raises:
            AclDenied: (``authentication`` true) saying which check failed.
        """
        cfg = self.config
        if cfg.trusted(host):
            return None
        if not ak:
            self.refuse(f"{what} carries no AccessKey", None, where, authn=True)
        account = cfg.accounts.get(ak)
        if account is None:
            self.refuse(f"unknown AccessKey {ak!r}", ak, where, authn=True)
        wra = account.white_remote_address
        if wra is not None and not wra.blank and not wra.match(host):
            self.refuse(
                f"forbidden address: AccessKey {ak!r} may not be used from {host} "
                f"(whiteRemoteAddress {wra.spec})",
                ak,
                where,
                authn=True,
            )
        if not signed(account):
            self.refuse(f"bad signature for AccessKey {ak!r}", ak, where, authn=True)
        return account

    def authorize(
        self,
        account: Account,
        admin_only: bool,
        needs: Iterable[Need],
        what: str,
        where: dict[str, Any],
    ) -> None:
        """Whether ``account`` may make a request that needs ``needs`` (and an admin account
        when ``admin_only``).

        Raises:
            AclDenied: (``authentication`` false) naming the missing permission.
        """
        ak = account.access_key
        if admin_only and not account.admin:
            self.refuse(
                f"{what} needs an admin account; AccessKey {ak!r} is not admin",
                ak,
                where,
                authn=False,
            )
        for need in needs:
            owned = account.perm(need.resource, need.group)
            if not permits(owned, need.perm):
                wanted = "PUB or SUB" if need.perm & ANY else perm_name(need.perm)
                self.refuse(
                    f"missing permission: AccessKey {ak!r} has {perm_name(owned)} on "
                    f"{need.describe()}, {what} needs {wanted}",
                    ak,
                    where,
                    authn=False,
                )

    def check(self, conn: Connection, cmd: RemotingCommand) -> None:
        """Let the request through or raise :class:`NoPermissionError` saying why."""
        ext = cmd.ext_fields
        ak = ext.get(ACCESS_KEY)
        what = f"request code {code_name(cmd.code)}"
        where = {"peer": f"{conn.peer[0]}:{conn.peer[1]}", "code": cmd.code}
        account = self.authenticate(
            conn.peer[0],
            ak if isinstance(ak, str) else None,
            lambda a: verify_signature(ext, cmd.body, a.secret_key),
            what,
            where,
        )
        if account is None:
            conn.context[CONTEXT_KEY] = ""
            return
        assert self.transactions is not None
        admin_only, needs = requirements(cmd, self.transactions)
        self.authorize(account, admin_only, needs, what, where)
        conn.context[CONTEXT_KEY] = account.access_key

    def quota_of(self, access_key: str) -> QuotaLimits | None:
        """An account's own quotas under the accounts in force now (None: no such account)."""
        account = self.config.accounts.get(access_key)
        return None if account is None else account.quota

    def may(self, host: str, ak: str | None, need: Need) -> bool:
        """Whether a peer at ``host`` authenticated as ``ak`` ("" when it was trusted) holds
        ``need`` under the accounts in force now."""
        cfg = self.config
        if cfg.trusted(host):
            return True
        account = cfg.accounts.get(ak) if ak else None
        return account is not None and permits(account.perm(need.resource, need.group), need.perm)

    def may_produce(self, conn: Connection, group: str) -> bool:
        """Whether a check-back for ``group`` may go to ``conn``: its peer is trusted, or its
        last accepted request came from an account with PUB on the group (under the accounts
        in force now)."""
        ak = conn.context.get(CONTEXT_KEY)
        return self.may(conn.peer[0], ak if isinstance(ak, str) else None, Need(group, True, PUB))

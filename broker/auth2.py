"""ACL 2.0 (RocketMQ 5.3's users and ACL policies) on the remoting and gRPC ports.

Turned on with ``authenticationEnabled`` (every request is signed by a known, enabled user,
with ACL 1.0's signature: ``AccessKey`` is the user name, the secret its password) and
``authorizationEnabled`` (every request is checked against its user's policies).  Users and
policies are managed with the AUTH_* requests (3001-3010, :class:`Auth2Processor`) and kept in
the broker's store (``config/auth.json``, :class:`AuthStore`), written atomically with a
checksum before a change is answered.

The rules are RocketMQ's (``DefaultAuthorizationProvider``):

* a **super** user may do anything, and only a super user may create, change or delete one;
* a request is checked per resource it touches (a topic, a consumer or producer group, the
  cluster for operator requests) and the actions it needs (``Pub``, ``Sub``, ``Get``,
  ``Update``...);
* of a user's policy entries that match the resource, an action and the caller's address
  (``sourceIps``), the **most specific** decides: a literal name before a prefix
  (``Topic:order*``, the longer prefix first) before every name of a type (``Topic:*``) before
  any resource (``*``); between equally specific entries **Deny wins**.  The ``Custom`` policy
  is consulted first, the ``Default`` policy only when no entry of it matches;
* nothing matching: refused.

txmq keeps one stricter rule of its ACL 1.0: a transactional half and its decision also need
``Pub`` on ``Group:<producer group>``, and check-backs go only to a user holding it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import BrokerSystemError, InvalidParameterError, NoPermissionError

from .acl import (
    ADMIN_READS,
    ANY,
    CONTEXT_KEY,
    PUB,
    SUB,
    Account,
    AclConfig,
    AclConfigError,
    AclManager,
    AddressPattern,
    Need,
    load_acl_file,
    perm_name,
)
from .acl import DENY as PERM_DENY
from .quota import QuotaLimits
from .store.fileio import atomic_write, keep_backup, read_after_interrupted_writes, set_aside

if TYPE_CHECKING:
    from txmq.protocol.aio import Connection

    from .transaction.service import TransactionalMessageService

log = structlog.get_logger(__name__)

T = TypeVar("T")

# -- the model ----------------------------------------------------------------------------------

SUPER, NORMAL = "Super", "Normal"
ENABLE, DISABLE = "enable", "disable"
ALLOW, DENY = "Allow", "Deny"
CUSTOM, DEFAULT = "Custom", "Default"
#: RocketMQ's ``Action`` names a policy may hold (``Any`` is for requests only).
ACTIONS = ("All", "Pub", "Sub", "Create", "Update", "Delete", "Get", "List")
#: RocketMQ's ``ResourceType`` names a policy's resource may have.
RESOURCE_TYPES = ("Cluster", "Namespace", "Topic", "Group")


class AuthError(NoPermissionError):
    """A user or policy request that cannot be done (RocketMQ answers these NO_PERMISSION)."""


def _canonical(name: str, choices: Iterable[str], what: str) -> str:
    for c in choices:
        if c.lower() == name.strip().lower():
            return c
    raise InvalidParameterError(f"{what} must be one of {', '.join(choices)}, got {name!r}")


@dataclass(frozen=True)
class User:
    username: str
    password: str = field(repr=False)
    user_type: str = NORMAL
    user_status: str = ENABLE

    @property
    def super(self) -> bool:
        return self.user_type == SUPER

    def info(self, *, with_password: bool) -> dict[str, Any]:
        """RocketMQ's ``UserInfo``."""
        doc = {"username": self.username, "userType": self.user_type}
        doc["userStatus"] = self.user_status
        if with_password:
            doc["password"] = self.password
        return doc

    @classmethod
    def from_info(cls, doc: Any, username: str | None = None, old: User | None = None) -> User:
        if not isinstance(doc, dict):
            raise InvalidParameterError("the body must be a UserInfo JSON object")
        name = str(username or doc.get("username") or "").strip()
        if not name:
            raise InvalidParameterError("username can not be blank")
        password = doc.get("password") or (old.password if old else "")
        if not password:
            raise InvalidParameterError("password can not be blank")
        user_type = doc.get("userType") or (old.user_type if old else NORMAL)
        status = doc.get("userStatus") or (old.user_status if old else ENABLE)
        return cls(
            name,
            str(password),
            _canonical(str(user_type), (SUPER, NORMAL), "userType"),
            _canonical(str(status), (ENABLE, DISABLE), "userStatus"),
        )


@dataclass(frozen=True)
class Resource:
    """``Topic:orders`` (literal), ``Topic:order*`` (prefixed), ``Topic:*`` (every topic),
    ``*`` (anything)."""

    type: str  # "" = any resource
    name: str = ""
    pattern: str = "literal"  # literal | prefixed | any

    @classmethod
    def parse(cls, key: str) -> Resource:
        key = key.strip()
        if key == "*":
            return cls("", "", "any")
        kind, colon, name = key.partition(":")
        if not colon or not name:
            raise InvalidParameterError(f"resource must look like Type:name or *, got {key!r}")
        kind = _canonical(kind, RESOURCE_TYPES, "the resource type")
        if name == "*":
            return cls(kind, "", "any")
        if name.endswith("*"):
            return cls(kind, name[:-1], "prefixed")
        return cls(kind, name)

    @property
    def key(self) -> str:
        if not self.type:
            return "*"
        suffix = {"any": "*", "prefixed": "*"}.get(self.pattern, "")
        return f"{self.type}:{self.name}{suffix}"

    def matches(self, kind: str, name: str) -> bool:
        if not self.type:
            return True
        if self.type != kind:
            return False
        if self.pattern == "any":
            return True
        if self.pattern == "prefixed":
            return name.startswith(self.name)
        return name == self.name

    def rank(self) -> tuple[int, int]:
        """Smaller is more specific."""
        if not self.type:
            return (3, 0)
        if self.pattern == "literal":
            return (0, 0)
        if self.pattern == "prefixed":
            return (1, -len(self.name))
        return (2, 0)


@dataclass(frozen=True)
class PolicyEntry:
    resource: Resource
    actions: tuple[str, ...]
    source_ips: tuple[str, ...] = ()
    decision: str = ALLOW
    _patterns: tuple[AddressPattern, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_info(cls, doc: Any) -> PolicyEntry:
        if not isinstance(doc, dict):
            raise InvalidParameterError("a policy entry must be a JSON object")
        resource = Resource.parse(str(doc.get("resource") or ""))
        actions = doc.get("actions") or []
        if not isinstance(actions, list) or not actions:
            raise InvalidParameterError(f"the actions of {resource.key} are empty")
        acts = tuple(dict.fromkeys(_canonical(str(a), ACTIONS, "an action") for a in actions))
        ips = doc.get("sourceIps") or []
        if not isinstance(ips, list):
            raise InvalidParameterError("sourceIps must be a list")
        try:
            patterns = tuple(AddressPattern(str(ip), "sourceIps") for ip in ips)
        except AclConfigError as exc:
            raise InvalidParameterError(f"the source ip is invalid: {exc}") from None
        decision = _canonical(str(doc.get("decision") or ""), (ALLOW, DENY), "decision")
        return cls(resource, acts, tuple(str(ip) for ip in ips), decision, patterns)

    def info(self) -> dict[str, Any]:
        return {
            "resource": self.resource.key,
            "actions": list(self.actions),
            "sourceIps": list(self.source_ips),
            "decision": self.decision,
        }

    def matches(self, kind: str, name: str, actions: Iterable[str], host: str) -> bool:
        if not self.resource.matches(kind, name):
            return False
        if "All" not in self.actions and not any(a in self.actions for a in actions):
            return False
        return not self._patterns or any(p.match(host) for p in self._patterns)


#: A user's ACL: its policies by type, each a list of entries (one per resource).
Acl = dict[str, tuple[PolicyEntry, ...]]


def parse_acl_info(doc: Any) -> tuple[str | None, Acl]:
    """RocketMQ's ``AclInfo`` JSON: ``(subject or None, policies)``."""
    if not isinstance(doc, dict):
        raise InvalidParameterError("the body must be an AclInfo JSON object")
    policies = doc.get("policies")
    if not isinstance(policies, list) or not policies:
        raise InvalidParameterError("the policies is empty")
    acl: Acl = {}
    for p in policies:
        if not isinstance(p, dict):
            raise InvalidParameterError("a policy must be a JSON object")
        kind = _canonical(str(p.get("policyType") or CUSTOM), (CUSTOM, DEFAULT), "policyType")
        raw = p.get("entries")
        if not isinstance(raw, list) or not raw:
            raise InvalidParameterError("the policy entries is empty")
        entries = [PolicyEntry.from_info(e) for e in raw]
        acl[kind] = _merge(acl.get(kind, ()), entries)
    subject = doc.get("subject")
    return (str(subject) if subject else None), acl


def _merge(old: Iterable[PolicyEntry], new: Iterable[PolicyEntry]) -> tuple[PolicyEntry, ...]:
    """RocketMQ's ``Policy.updateEntry``: an entry replaces the one of the same resource."""
    out = {e.resource.key: e for e in old}
    for e in new:
        out[e.resource.key] = e
    return tuple(out.values())


def acl_info(username: str, acl: Acl) -> dict[str, Any]:
    return {
        "subject": f"User:{username}",
        "policies": [
            {"policyType": kind, "entries": [e.info() for e in entries]}
            for kind, entries in sorted(acl.items())
            if entries
        ],
    }


def user_of_subject(subject: str) -> str:
    """``User:alice`` -> ``alice`` (RocketMQ's subjects are users only)."""
    kind, colon, name = subject.strip().partition(":")
    if not colon or kind.strip().lower() != "user" or not name.strip():
        raise InvalidParameterError(f"subject must look like User:<name>, got {subject!r}")
    return name.strip()


def decide(acl: Acl, kind: str, name: str, actions: Iterable[str], host: str) -> PolicyEntry | None:
    """The entry that decides a request for ``actions`` on ``kind:name`` from ``host`` (None:
    nothing matches, which refuses it)."""
    acts = tuple(actions)
    for policy in (CUSTOM, DEFAULT):
        found = [e for e in acl.get(policy, ()) if e.matches(kind, name, acts, host)]
        if found:
            found.sort(key=lambda e: (e.resource.rank(), e.decision != DENY))
            return found[0]
    return None


# -- the store ----------------------------------------------------------------------------------


class AuthStoreError(ValueError):
    """The users and policies file cannot be used (the message names it)."""


@dataclass
class AuthState:
    users: dict[str, User] = field(default_factory=dict)
    acls: dict[str, Acl] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "users": [u.info(with_password=True) for _, u in sorted(self.users.items())],
            "acls": [acl_info(n, a) for n, a in sorted(self.acls.items())],
        }

    @classmethod
    def from_json(cls, doc: Any) -> AuthState:
        state = cls()
        for u in doc.get("users", []):
            user = User.from_info(u)
            state.users[user.username] = user
        for a in doc.get("acls", []):
            subject, acl = parse_acl_info(a)
            state.acls[user_of_subject(subject or "")] = acl
        return state


def _checksum(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


class AuthStore:
    """Users and policies in one JSON file, ``{"state": ..., "sha256": ...}``: written
    atomically (the previous version kept as ``.bak``) and read back only when its checksum
    holds; a damaged file falls back to the backup, and with both damaged the broker does not
    start (starting with no users would lock every client out, or worse, silently)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    @staticmethod
    def _decode(raw: bytes, path: str) -> AuthState:
        try:
            doc = json.loads(raw)
            payload = json.dumps(doc["state"], sort_keys=True, separators=(",", ":")).encode()
            if _checksum(payload) != doc["sha256"]:
                raise AuthStoreError(f"{path}: checksum mismatch")
            return AuthState.from_json(doc["state"])
        except (ValueError, KeyError, TypeError, AttributeError, InvalidParameterError) as exc:
            if isinstance(exc, AuthStoreError):
                raise
            raise AuthStoreError(f"{path}: cannot read users and policies: {exc}") from None

    def load(self) -> AuthState:
        """The stored state (empty when there is no file yet).  Blocking.

        Raises:
            AuthStoreError: neither the file nor its backup can be read.
        """
        raw = read_after_interrupted_writes(self.path)
        if raw is None:
            return AuthState()
        try:
            return self._decode(raw, self.path)
        except AuthStoreError as exc:
            backup = self.path + ".bak"
            try:
                with open(backup, "rb") as fh:
                    state = self._decode(fh.read(), backup)
            except (OSError, AuthStoreError):
                raise exc from None
            # the damaged file is kept for the operator, never read or backed up again
            aside = set_aside(self.path)
            self.save(state)
            log.warning(
                "auth_read_from_backup",
                file=self.path,
                set_aside=aside,
                error=str(exc),
                hint="changes after the backup was written are lost",
            )
            return state

    def save(self, state: AuthState) -> None:
        """Write ``state`` durably (blocking)."""
        body = state.to_json()
        payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        doc = {"state": body, "sha256": _checksum(payload)}
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        keep_backup(self.path)
        atomic_write(self.path, json.dumps(doc, indent=1).encode())


# -- what a request needs, in ACL 2.0's terms -----------------------------------------------------

#: Operator requests that only read (``Get`` on the cluster); every other admin-only request
#: needs ``Update`` on it.
_CLUSTER_READS = ADMIN_READS | frozenset(
    {
        RequestCode.AUTH_GET_USER,
        RequestCode.AUTH_LIST_USER,
        RequestCode.AUTH_GET_ACL,
        RequestCode.AUTH_LIST_ACL,
    }
)


def actions_of(perm: int) -> tuple[str, ...]:
    if perm & ANY:
        return ("Pub", "Sub")
    return tuple(n for n, bit in (("Pub", PUB), ("Sub", SUB)) if perm & bit)


# -- the manager ---------------------------------------------------------------------------------


class Auth2Manager(AclManager):
    """ACL 2.0 in :class:`AclManager`'s place: the remoting dispatch and the gRPC front end call
    the same methods (``check``, ``authenticate``, ``authorize``, ``may``), answered from users
    and policies instead of ``plain_acl.yml``.

    Args:
        path: the users and policies file.
        authorization: check policies (``authorizationEnabled``); without it any
            authenticated user may make any request.
        cluster: the cluster name, the resource of operator requests (``Cluster:<name>``).
    """

    def __init__(
        self,
        path: str,
        *,
        authorization: bool,
        cluster: str,
        transactions: TransactionalMessageService | None = None,
    ) -> None:
        super().__init__(path, transactions)
        self.store = AuthStore(path)
        self.state = AuthState()
        self.authorization = authorization
        self.cluster = cluster
        #: The request code being checked (its Cluster action depends on it).
        self._code = 0

    # -- the state ----------------------------------------------------------------------------

    @staticmethod
    def _stamp_id(st: os.stat_result) -> int:
        # every write replaces the file (a new inode), here and on a follower
        return st.st_ino

    def load(self) -> None:
        """Read the stored users and policies (blocking).  Raises :class:`AclConfigError`."""
        with self.store.lock:
            stamp = self._file_stamp()
            try:
                self._install(self.store.load())
            except AuthStoreError as exc:
                raise AclConfigError(str(exc)) from None
            self._stamp = stamp
        log.info("auth_loaded", file=self.path, users=len(self.state.users))

    def _install(self, state: AuthState) -> None:
        self.state = state
        self.config = AclConfig(
            (),
            {
                n: Account(n, u.password, admin=u.super)
                for n, u in state.users.items()
                if u.user_status == ENABLE
            },
        )

    def poll(self) -> AclConfig | None:
        """Read the file again when it changed since this broker last wrote or read it (in a
        cluster, a follower's copy is rewritten from its leader's); puts it in force itself
        and returns None (blocking).  A file that cannot be read leaves the state in force."""
        with self.store.lock:
            stamp = self._file_stamp()
            if stamp == self._stamp or stamp is None:
                return None
            self._stamp = stamp
            try:
                self._install(self.store.load())
            except AuthStoreError as exc:
                log.error("auth_reload_failed", error=str(exc), keeping="users in force")
                return None
        self.reloads += 1
        log.info("auth_reloaded", file=self.path, users=len(self.state.users))
        return None

    def quota_of(self, access_key: str) -> QuotaLimits | None:
        return None  # users carry no quotas: the broker's defaults apply

    def init_user(self, info: str) -> None:
        """Create the ``initAuthenticationUser`` (a UserInfo JSON) as a super user when there
        is no user of that name (blocking).

        Raises:
            AclConfigError: it cannot be read.
        """
        try:
            user = User.from_info(json.loads(info))
        except (ValueError, InvalidParameterError) as exc:
            raise AclConfigError(f"initAuthenticationUser: {exc}") from None
        with self.store.lock:
            if user.username in self.state.users:
                return
            state = AuthState({**self.state.users}, dict(self.state.acls))
            state.users[user.username] = User(user.username, user.password, SUPER)
            self.store.save(state)
            self._install(state)
            self._stamp = self._file_stamp()
        log.info("auth_init_user_created", username=user.username)

    def change(self, edit: Callable[[AuthState], T]) -> T:
        """Apply ``edit`` to a copy of the state, write it, then put it in force (blocking:
        run it off the event loop).  One change at a time."""
        with self.store.lock:
            state = AuthState(dict(self.state.users), dict(self.state.acls))
            result = edit(state)
            self.store.save(state)
            self._install(state)
            self._stamp = self._file_stamp()
            return result

    # -- the check ----------------------------------------------------------------------------

    def check(self, conn: Connection, cmd: RemotingCommand) -> None:
        self._code = cmd.code
        try:
            super().check(conn, cmd)
        finally:
            self._code = 0

    def authorize(
        self,
        account: Account,
        admin_only: bool,
        needs: Iterable[Need],
        what: str,
        where: dict[str, Any],
    ) -> None:
        if account.admin or not self.authorization:
            return  # a super user; or authentication only
        host = str(where.get("peer", "")).rpartition(":")[0].strip("[]")
        acl = self.state.acls.get(account.access_key, {})
        checks: list[tuple[str, str, tuple[str, ...]]] = []
        if admin_only:
            action = "Get" if self._code in _CLUSTER_READS else "Update"
            checks.append(("Cluster", self.cluster, (action,)))
        for need in needs:
            checks.append(
                ("Group" if need.group else "Topic", need.resource, actions_of(need.perm))
            )
        for kind, name, actions in checks:
            entry = decide(acl, kind, name, actions, host)
            if entry is None or entry.decision == DENY:
                why = "no matched policies" if entry is None else f"denied by {entry.resource.key}"
                self.refuse(
                    f"User:{account.access_key} has no permission to {'/'.join(actions)} "
                    f"{kind}:{name} from {host}, {why}; {what}",
                    account.access_key,
                    where,
                    authn=False,
                )

    def may(self, host: str, ak: str | None, need: Need) -> bool:
        account = self.config.accounts.get(ak) if ak else None
        if account is None:
            return False
        if account.admin or not self.authorization:
            return True
        entry = decide(
            self.state.acls.get(account.access_key, {}),
            "Group" if need.group else "Topic",
            need.resource,
            actions_of(need.perm),
            host,
        )
        return entry is not None and entry.decision == ALLOW

    def caller_is_super(self, conn: Connection) -> bool:
        ak = conn.context.get(CONTEXT_KEY)
        user = self.state.users.get(ak) if isinstance(ak, str) else None
        return user is not None and user.super


# -- the AUTH_* requests ---------------------------------------------------------------------


def _header(cmd: RemotingCommand, key: str) -> str:
    v = cmd.ext_fields.get(key)
    return "" if v is None else str(v).strip()


def _body(cmd: RemotingCommand) -> Any:
    try:
        return json.loads(cmd.body.decode("utf-8")) if cmd.body else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidParameterError("the body is not JSON") from None


def _json(doc: Any) -> bytes:
    return json.dumps(doc).encode("utf-8")


class Auth2Processor:
    """AUTH_CREATE_USER ... AUTH_LIST_ACL (3001-3010), as RocketMQ 5.3's broker answers them.

    Args:
        manager: the ACL 2.0 in force (None: ACL 2.0 is off, and each request says so).
        in_background: runs the blocking write off the event loop.
    """

    def __init__(
        self,
        manager: Auth2Manager | None,
        in_background: Callable[[Callable[[], Any]], Awaitable[Any]],
    ) -> None:
        self.manager = manager
        self.in_background = in_background

    def processors(self) -> dict[int, Callable[[Connection, RemotingCommand], Awaitable[Any]]]:
        R = RequestCode
        return {
            R.AUTH_CREATE_USER: self.create_user,
            R.AUTH_UPDATE_USER: self.update_user,
            R.AUTH_DELETE_USER: self.delete_user,
            R.AUTH_GET_USER: self.get_user,
            R.AUTH_LIST_USER: self.list_user,
            R.AUTH_CREATE_ACL: self.create_acl,
            R.AUTH_UPDATE_ACL: self.update_acl,
            R.AUTH_DELETE_ACL: self.delete_acl,
            R.AUTH_GET_ACL: self.get_acl,
            R.AUTH_LIST_ACL: self.list_acl,
        }

    def _manager(self) -> Auth2Manager:
        if self.manager is None:
            raise BrokerSystemError(
                "ACL 2.0 is not enabled on this broker (authenticationEnabled = false)"
            )
        return self.manager

    async def _change(self, edit: Callable[[AuthState], Any]) -> None:
        m = self._manager()
        await self.in_background(lambda: m.change(edit))

    # -- users ------------------------------------------------------------------------------

    async def create_user(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        m = self._manager()
        user = User.from_info(_body(cmd), _header(cmd, "username"))
        if user.super and not m.caller_is_super(conn):
            raise AuthError("The super user can only be create by super user")

        def edit(state: AuthState) -> None:
            if user.username in state.users:
                raise AuthError("The user is existed")
            state.users[user.username] = user

        await self._change(edit)
        log.info("auth_user_created", username=user.username, user_type=user.user_type)
        return cmd.response(ResponseCode.SUCCESS)

    async def update_user(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        m = self._manager()
        name = _header(cmd, "username")
        old = m.state.users.get(name)
        if old is None:
            raise AuthError("The user is not exist")
        user = User.from_info(_body(cmd), name, old)
        if (user.super or old.super) and not m.caller_is_super(conn):
            raise AuthError("The super user can only be update by super user")

        def edit(state: AuthState) -> None:
            if name not in state.users:
                raise AuthError("The user is not exist")
            state.users[name] = user

        await self._change(edit)
        log.info("auth_user_updated", username=name, user_type=user.user_type)
        return cmd.response(ResponseCode.SUCCESS)

    async def delete_user(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        m = self._manager()
        name = _header(cmd, "username")
        old = m.state.users.get(name)
        if old is None:
            return cmd.response(ResponseCode.SUCCESS)
        if old.super and not m.caller_is_super(conn):
            raise AuthError("The super user can only be update by super user")

        def edit(state: AuthState) -> None:
            state.users.pop(name, None)
            state.acls.pop(name, None)

        await self._change(edit)
        log.info("auth_user_deleted", username=name)
        return cmd.response(ResponseCode.SUCCESS)

    async def get_user(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = _header(cmd, "username")
        if not name:
            raise InvalidParameterError("The username is blank")
        user = self._manager().state.users.get(name)
        resp = cmd.response(ResponseCode.SUCCESS)
        if user is not None:
            resp.body = _json(user.info(with_password=False))
        return resp

    async def list_user(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        wanted = _header(cmd, "filter")
        users = [
            u.info(with_password=False)
            for n, u in sorted(self._manager().state.users.items())
            if not wanted or wanted in n
        ]
        resp = cmd.response(ResponseCode.SUCCESS)
        if users:
            resp.body = _json(users)
        return resp

    # -- ACLs -------------------------------------------------------------------------------

    async def create_acl(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return await self._put_acl(cmd)

    async def update_acl(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return await self._put_acl(cmd)

    async def _put_acl(self, cmd: RemotingCommand) -> RemotingCommand:
        subject, acl = parse_acl_info(_body(cmd))
        name = user_of_subject(subject or _header(cmd, "subject"))

        def edit(state: AuthState) -> None:
            if name not in state.users:
                raise AuthError(f"The subject of User:{name} is not exist.")
            merged = dict(state.acls.get(name, {}))
            for kind, entries in acl.items():
                merged[kind] = _merge(merged.get(kind, ()), entries)
            state.acls[name] = merged

        await self._change(edit)
        log.info("auth_acl_updated", subject=f"User:{name}")
        return cmd.response(ResponseCode.SUCCESS)

    async def delete_acl(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = user_of_subject(_header(cmd, "subject"))
        kind = _header(cmd, "policyType")
        policy = _canonical(kind, (CUSTOM, DEFAULT), "policyType") if kind else None
        key = _header(cmd, "resource")
        resource = Resource.parse(key).key if key else None

        def edit(state: AuthState) -> None:
            if name not in state.users:
                raise AuthError("The subject is not exist.")
            acl = state.acls.get(name)
            if acl is None:
                raise AuthError("The acl is not exist.")
            kept: Acl = {}
            for k, entries in acl.items():
                if policy is not None and k != policy:
                    kept[k] = entries
                elif resource is not None:
                    rest = tuple(e for e in entries if e.resource.key != resource)
                    if rest:
                        kept[k] = rest
            if kept:
                state.acls[name] = kept
            else:
                state.acls.pop(name, None)

        await self._change(edit)
        log.info("auth_acl_deleted", subject=f"User:{name}", policy=policy, resource=resource)
        return cmd.response(ResponseCode.SUCCESS)

    async def get_acl(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = user_of_subject(_header(cmd, "subject"))
        acl = self._manager().state.acls.get(name)
        resp = cmd.response(ResponseCode.SUCCESS)
        if acl:
            resp.body = _json(acl_info(name, acl))
        return resp

    async def list_acl(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        subject_filter = _header(cmd, "subjectFilter")
        resource_filter = _header(cmd, "resourceFilter")
        out = []
        for name, acl in sorted(self._manager().state.acls.items()):
            if subject_filter and subject_filter not in f"User:{name}":
                continue
            if resource_filter:
                acl = {
                    k: tuple(e for e in es if resource_filter in e.resource.key)
                    for k, es in acl.items()
                }
                if not any(acl.values()):
                    continue
            out.append(acl_info(name, acl))
        resp = cmd.response(ResponseCode.SUCCESS)
        if out:
            resp.body = _json(out)
        return resp


# -- ACL 1.0 -> 2.0 --------------------------------------------------------------------------


def _perm_entry(resource: str, perm: str, ips: list[str]) -> dict[str, Any]:
    p = perm.strip().upper().replace(" ", "")
    if p == "DENY":
        return {"resource": resource, "actions": ["All"], "sourceIps": [], "decision": DENY}
    actions = [a for a, bit in (("Pub", "PUB"), ("Sub", "SUB")) if bit in p.split("|")]
    return {"resource": resource, "actions": actions, "sourceIps": ips, "decision": ALLOW}


@dataclass(frozen=True)
class Migrated:
    """What one ``plain_acl.yml`` account becomes."""

    user: dict[str, Any]  # UserInfo
    acl: dict[str, Any] | None  # AclInfo (None: a super user needs none)
    #: Where ACL 2.0 allows more than ACL 1.0 did, in words.
    notes: tuple[str, ...] = ()


def _widened(kind: str, listed: dict[str, int], default: int) -> list[str]:
    """A listed PUB or SUB grants only its actions, but a request for another one falls to the
    Default policy (RocketMQ's rules), which may allow what ACL 1.0 refused."""
    notes = []
    for name, perm in listed.items():
        extra = 0 if perm & PERM_DENY or default & PERM_DENY else default & ~perm & (PUB | SUB)
        if extra:
            notes.append(
                f"{kind}:{name}: ACL 1.0 allowed {perm_name(perm)} only; the Default policy now "
                f"also allows {perm_name(extra)}"
            )
    return notes


def migrate_plain_acl(path: str) -> list[Migrated]:
    """The users and ACLs a ``plain_acl.yml``'s accounts become, as RocketMQ 5.3's
    ``AuthMigrator`` makes them.  ``topicPerms``/``groupPerms`` become the ``Custom`` policy
    (literal ``Topic:``/``Group:`` resources), ``defaultTopicPerm``/``defaultGroupPerm`` the
    ``Default`` policy (``Topic:*``/``Group:*``); a ``whiteRemoteAddress`` becomes the
    ``sourceIps`` of the allowing entries.  An ``admin`` account becomes a super user, unless
    that would let it do more than it could: one with a ``whiteRemoteAddress`` or its own
    ``topicPerms`` / ``groupPerms`` becomes a normal user whose ``Default`` policy allows
    everything (``*``, the operator requests included) from its addresses.
    ``globalWhiteRemoteAddresses`` has no ACL 2.0 counterpart.

    Raises:
        AclConfigError: the file cannot be read.
    """
    cfg = load_acl_file(path)
    out: list[Migrated] = []
    for ak, account in cfg.accounts.items():
        wra = account.white_remote_address
        ips: list[str] = []
        if wra is not None and not wra.blank:
            # one pattern per entry, but a {a,b} group stays whole
            ips = [wra.spec] if "{" in wra.spec else [x.strip() for x in wra.spec.split(",")]
        custom = [
            _perm_entry(f"Topic:{t}", perm_name(p), ips) for t, p in account.topic_perms.items()
        ]
        custom += [
            _perm_entry(f"Group:{g}", perm_name(p), ips) for g, p in account.group_perms.items()
        ]
        super_user = account.admin and not ips and not custom
        user = {
            "username": ak,
            "password": account.secret_key,
            "userType": SUPER if super_user else NORMAL,
            "userStatus": ENABLE,
        }
        if super_user:
            out.append(Migrated(user, None))
            continue
        if account.admin:
            default = [{"resource": "*", "actions": ["All"], "sourceIps": ips, "decision": ALLOW}]
            topic_default = group_default = PUB | SUB
        else:
            default = [
                _perm_entry("Topic:*", perm_name(account.default_topic_perm), ips),
                _perm_entry("Group:*", perm_name(account.default_group_perm), ips),
            ]
            topic_default, group_default = account.default_topic_perm, account.default_group_perm
        policies = []
        if custom:
            policies.append({"policyType": CUSTOM, "entries": custom})
        policies.append({"policyType": DEFAULT, "entries": default})
        notes = _widened("Topic", account.topic_perms, topic_default)
        notes += _widened("Group", account.group_perms, group_default)
        acl = {"subject": f"User:{ak}", "policies": policies}
        out.append(Migrated(user, acl, tuple(notes)))
    return out

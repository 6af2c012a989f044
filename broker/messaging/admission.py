"""Admission of a send: the ACL's permission and the produce quota, checked once, by the send
use case, for both front ends.

A front end authenticates the caller -- a remoting request's signature
(:meth:`~txmq.broker.acl.AclManager.check`), a gRPC call's ``authorization`` metadata
(:class:`~txmq.broker.grpc.auth.GrpcAccess`) -- because that is its protocol, and hands the
core a :class:`Caller`: who it is, what its quotas are counted under, how the request is named
in a refusal, and the bytes it brings.  What a send *needs* and what it is *charged* is decided
here: PUB on each topic it sends to and, for the halves of a transaction whose producer group
the request names (a remoting producer's), PUB on that group; then the produce bucket of its
account (or client address) is charged its bodies, the request delayed while the bucket is in
debt or refused past ``quotaMaxThrottleMs``.  Both happen before the send's topic is looked up
or created, and once per request (:attr:`Caller.admitted`), whichever path stores it.

The refusals are the ACL's and the quota's own (:class:`~txmq.broker.acl.AclDenied`,
:class:`~txmq.protocol.errors.SystemBusyError`), which each front end answers as before:
NO_PERMISSION / SYSTEM_BUSY over remoting, FORBIDDEN / TOO_MANY_REQUESTS over gRPC.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..acl import PUB, Need, topic_or_group

if TYPE_CHECKING:
    from ..acl import AclManager
    from ..quota import QuotaManager


@dataclass(slots=True, eq=False)
class Caller:
    """Who sends, as its front end authenticated it."""

    #: the authenticated account's access key; "" for a peer the ACL trusts; None with
    #: the ACL off
    access_key: str | None
    #: what the quotas count the request under (an account, ``address:<ip>``); None: none
    quota_key: str | None
    #: the request as its protocol names it in a refusal, and the refusal's log fields
    what: str
    where: dict[str, Any]
    #: the bytes the produce quota charges
    charge: int
    #: admitted already (a direct path that left the request to the generic one)
    admitted: bool = field(default=False, init=False)


class SendAdmission:
    """The ACL and the quotas in force (either may be None), checked for each send."""

    def __init__(self, acl: AclManager | None, quota: QuotaManager | None) -> None:
        self.acl = acl
        self.quota = quota

    async def admit(self, caller: Caller, topics: Iterable[str], group: str = "") -> None:
        """Let a send to ``topics`` through (the halves of ``group``, when it names one), or
        refuse it; once per request.

        Raises:
            AclDenied: the account lacks PUB on a topic or the group.
            SystemBusyError: ``[TOO_MANY_REQUESTS]``, the produce quota is exhausted.
        """
        if caller.admitted:
            return
        caller.admitted = True
        acl = self.acl
        if acl is not None and caller.access_key:
            account = acl.config.accounts.get(caller.access_key)
            if account is None:  # the accounts were reloaded since it was authenticated
                acl.refuse(
                    f"unknown AccessKey {caller.access_key!r}",
                    caller.access_key,
                    caller.where,
                    authn=True,
                )
            needs = [topic_or_group(t, PUB) for t in sorted(set(topics))]
            if group:
                needs.append(Need(group, True, PUB))
            acl.authorize(account, False, needs, caller.what, caller.where)
        quota = self.quota
        if quota is not None and caller.quota_key is not None:
            await quota.throttle(caller.quota_key, "produce", caller.charge)


__all__ = ["Caller", "SendAdmission"]

"""How a replica proves itself to its leader: the credentials it signs replication requests
with (an admin account of ``plainAclFile``, or ACL 2.0's ``initAuthenticationUser``) and the TLS
context it connects with while TLS is enforced."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from txmq.protocol.command import RemotingCommand

from ..config import BrokerConfig


def replication_signer(cfg: BrokerConfig) -> Callable[[RemotingCommand], None] | None:
    """With ``aclEnable``, replicas sign replication requests with an admin account of the
    group's shared ``plainAclFile`` (the first one, by AccessKey, not tied to addresses)."""
    if cfg.authentication_enabled:
        return _auth2_signer(cfg)
    if not cfg.acl_enable:
        return None
    from txmq.protocol.acl import Credentials

    from ..acl import load_acl_file

    accounts = load_acl_file(cfg.plain_acl_file).accounts
    admins = sorted(
        (a for a in accounts.values() if a.admin and a.white_remote_address is None),
        key=lambda a: a.access_key,
    )
    if not admins:
        raise ValueError(
            f"aclEnable in cluster mode: {cfg.plain_acl_file} needs an admin account without "
            "whiteRemoteAddress, which replicas sign replication requests with"
        )
    return Credentials(admins[0].access_key, admins[0].secret_key).sign


def _auth2_signer(cfg: BrokerConfig) -> Callable[[RemotingCommand], None]:
    """ACL 2.0: replicas sign replication requests as ``initAuthenticationUser``, the super
    user every replica of the group creates at its first start (RocketMQ's brokers sign
    their own requests with configured inner credentials alike)."""
    from txmq.protocol.acl import Credentials

    try:
        doc = json.loads(cfg.init_authentication_user or "null")
        user, password = str(doc["username"]), str(doc["password"])
    except (ValueError, TypeError, KeyError):
        raise ValueError(
            "authenticationEnabled in cluster mode needs initAuthenticationUser (a UserInfo "
            "JSON with username and password), which replicas sign replication requests with"
        ) from None
    return Credentials(user, password).sign


def client_ssl(cfg: BrokerConfig) -> Any:
    """The TLS context a follower connects to its leader with, when TLS is enforced."""
    if cfg.tls_server_mode != "enforcing":
        return None
    import ssl

    ctx = ssl.create_default_context(cafile=cfg.tls_server_trust_cert_path or None)
    ctx.check_hostname = False
    if cfg.tls_server_cert_path and cfg.tls_server_key_path:
        ctx.load_cert_chain(cfg.tls_server_cert_path, cfg.tls_server_key_path)
    return ctx

"""Plain ACL files (``plain_acl.yml``) written by tests, account by account."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def open_account(key: str, secret: str, **settings: object) -> str:
    """An account that may publish and subscribe on every topic and group, with ``settings``
    (``produceByteRate=...``, ``maxConnections=...``) after."""
    lines = [
        f"  - accessKey: {key}",
        f"    secretKey: {secret}",
        "    defaultTopicPerm: PUB|SUB",
        "    defaultGroupPerm: PUB|SUB",
        *(f"    {name}: {value}" for name, value in settings.items()),
    ]
    return "\n".join(lines) + "\n"


def account(
    key: str,
    secret: str,
    *,
    topics: tuple[str, ...] = (),
    groups: tuple[str, ...] = (),
    **settings: object,
) -> str:
    """An account with ``settings`` (``defaultTopicPerm="DENY"``, ``admin=True``, ...) and its
    per-topic and per-group permissions (``"orders=PUB"``, ...)."""
    lines = [f"  - accessKey: {key}", f"    secretKey: {secret}"]
    for name, value in settings.items():
        text = str(value).lower() if isinstance(value, bool) else value
        lines.append(f"    {name}: {text}")
    for title, perms in (("topicPerms", topics), ("groupPerms", groups)):
        if perms:
            lines += [f"    {title}:", *(f"      - {p}" for p in perms)]
    return "\n".join(lines) + "\n"


def acl_file(*accounts: str, white_listed: bool = False) -> str:
    """A plain ACL file of ``accounts`` (``white_listed``: with an empty
    ``globalWhiteRemoteAddresses``)."""
    head = "globalWhiteRemoteAddresses:\n" if white_listed else ""
    return head + "accounts:\n" + "".join(accounts)


def write_acl(folder: Path, text: str) -> Path:
    """``text`` written as ``folder/plain_acl.yml``; its path."""
    path = folder / "plain_acl.yml"
    path.write_text(text, encoding="utf-8")
    return path


def acl2_with_root(username: str, password: str) -> dict[str, Any]:
    """The broker settings of ACL 2.0 (authentication and authorization on) with ``username``
    as the initial super user."""
    return {
        "authentication_enabled": True,
        "authorization_enabled": True,
        "init_authentication_user": json.dumps({"username": username, "password": password}),
    }

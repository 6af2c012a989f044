"""Plain ACL files (``plain_acl.yml``) written by tests, account by account."""

from __future__ import annotations

from pathlib import Path


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


def acl_file(*accounts: str) -> str:
    return "accounts:\n" + "".join(accounts)


def write_acl(folder: Path, text: str) -> Path:
    """``text`` written as ``folder/plain_acl.yml``; its path."""
    path = folder / "plain_acl.yml"
    path.write_text(text, encoding="utf-8")
    return path

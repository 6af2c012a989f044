"""The console's own accounts: a YAML users file of names, scrypt password hashes and roles.

A user file looks like this (``txmq console add-user`` writes the entries)::

    users:
      - name: alice
        role: operator        # or viewer
        password: scrypt$16384$8$1$<salt, base64>$<hash, base64>

Passwords are hashed with scrypt (:func:`hashlib.scrypt`, in the standard library): a salted,
deliberately slow and memory-hard function, so a stolen file cannot be checked against a
dictionary at GPU speed, and two users with one password get different hashes (16 random bytes
of salt each).  The cost parameters are stored with each hash, so stronger ones can be used
later without invalidating older entries.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The roles: a viewer reads every page; an operator also acts (commit, roll back, resume,
#: resend dead letters, reset offsets).
ROLES = ("viewer", "operator")
#: scrypt's cost: N (CPU/memory), r (block size), p (parallelism); 16 MiB and ~50 ms a check.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
_MAXMEM = 64 * 1024 * 1024


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """The stored form of ``password``: ``scrypt$N$r$p$salt$hash``."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=_MAXMEM
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def check_password(password: str, stored: str) -> bool:
    """Whether ``password`` is the one ``stored`` (a :func:`hash_password` result) was made
    from; False for a malformed entry."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        want = base64.b64decode(digest, validate=True)
        got = hashlib.scrypt(
            password.encode("utf-8"),
            salt=base64.b64decode(salt, validate=True),
            n=int(n),
            r=int(r),
            p=int(p),
            maxmem=_MAXMEM,
            dklen=len(want),
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, want)


#: Checked against when a name is unknown, so that an unknown name takes as long to refuse as a
#: wrong password (no telling which names exist by timing).
_DUMMY = hash_password(secrets.token_hex(8))


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str


class UsersFileError(ValueError):
    pass


class Users:
    """The users of a users file, read once (restart the console after editing it)."""

    def __init__(self, users: dict[str, User]) -> None:
        self.users = users

    @classmethod
    def load(cls, path: str | Path) -> Users:
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsersFileError(f"cannot read the users file {path}: {exc}") from None
        return cls(_parse(doc, str(path)))

    def authenticate(self, name: str, password: str) -> User | None:
        user = self.users.get(name)
        if user is None:
            check_password(password, _DUMMY)
            return None
        return user if check_password(password, user.password_hash) else None


def _parse(doc: Any, where: str) -> dict[str, User]:
    entries = doc.get("users") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise UsersFileError(f"{where}: expected a list under 'users'")
    out: dict[str, User] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise UsersFileError(f"{where}: entry {i + 1} is not a mapping")
        name, role, pw = e.get("name"), e.get("role"), e.get("password")
        if not isinstance(name, str) or not name:
            raise UsersFileError(f"{where}: entry {i + 1} has no name")
        if role not in ROLES:
            raise UsersFileError(f"{where}: user {name!r}: role must be one of {', '.join(ROLES)}")
        if not isinstance(pw, str) or not pw.startswith("scrypt$"):
            raise UsersFileError(
                f"{where}: user {name!r}: password must be a hash made by "
                "'txmq console add-user' (scrypt$...)"
            )
        if name in out:
            raise UsersFileError(f"{where}: user {name!r} appears twice")
        out[name] = User(name, role, pw)
    return out


def add_user(path: str | Path, name: str, password: str, role: str) -> bool:
    """Add ``name`` to the users file at ``path`` (created when missing), or replace its
    password and role; whether it was new.  The file is written with mode 0600."""
    if role not in ROLES:
        raise UsersFileError(f"role must be one of {', '.join(ROLES)}")
    p = Path(path)
    entries: list[dict[str, Any]] = []
    if p.exists():
        users = Users.load(p)
        entries = [
            {"name": u.name, "role": u.role, "password": u.password_hash}
            for u in users.users.values()
        ]
    new = not any(e["name"] == name for e in entries)
    entries = [e for e in entries if e["name"] != name]
    entries.append({"name": name, "role": role, "password": hash_password(password)})
    text = yaml.safe_dump({"users": entries}, sort_keys=False)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return new

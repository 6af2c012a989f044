"""Request signatures of RocketMQ's ACL 1.0 (plain access), shared by broker and client.

A signed request carries ``AccessKey``, ``Signature`` and optionally ``SecurityToken`` in its
``extFields``.  The signature is the Base64 of HmacSHA1, keyed with the secret key (UTF-8), over
the values of every other ``extFields`` entry in the order of their sorted keys, concatenated as
UTF-8 text, followed by the raw body.  ``Signature`` itself and ``_UNIQUE_KEY_QUERY`` take no
part.  This is how RocketMQ's broker computes it, so stock clients that sign (the Java client's
``AclClientRPCHook``, the C++ client's ``set_session_credentials``, which also adds its
``OnsChannel`` field) are checked the same way as this SDK.

Values that travel natively in txmq's msgpack headers (ints, bools) are signed in the text form
the string encodings would carry (``"true"``, ``"42"``), on both sides.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .command import RemotingCommand
from .frame import _stringify

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: Added (and signed) by the C++ and ONS clients; the broker needs nothing from it.
ONS_CHANNEL = "OnsChannel"
#: RocketMQ leaves this field out of the signed content.
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"

_UNSIGNED = frozenset({SIGNATURE, UNIQUE_MSG_QUERY_FLAG})


def signed_content(ext_fields: Mapping[str, Any], body: bytes) -> bytes:
    """The bytes a signature covers: sorted field values, then the body."""
    text = "".join(
        _stringify(ext_fields[k])
        for k in sorted(ext_fields)
        if k not in _UNSIGNED and ext_fields[k] is not None
    )
    return text.encode("utf-8") + (body or b"")


def calc_signature(content: bytes, secret_key: str) -> str:
    """Base64(HmacSHA1(secret_key, content)), RocketMQ's ``AclSigner``."""
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def verify_signature(ext_fields: Mapping[str, Any], body: bytes, secret_key: str) -> bool:
    """Whether ``ext_fields["Signature"]`` matches (compared in constant time)."""
    given = ext_fields.get(SIGNATURE)
    if not isinstance(given, str):
        return False
    expected = calc_signature(signed_content(ext_fields, body), secret_key)
    return hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace"))


@dataclass(frozen=True)
class Credentials:
    """An ACL account's keys as a client holds them.  The secret never appears in ``repr``."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need both an access key and a secret key")

    def sign(self, cmd: RemotingCommand) -> None:
        """Add ``AccessKey`` (and ``SecurityToken``) to ``cmd`` and sign it in place."""
        ext = cmd.ext_fields
        ext.pop(SIGNATURE, None)
        ext[ACCESS_KEY] = self.access_key
        if self.security_token:
            ext[SECURITY_TOKEN] = self.security_token
        ext[SIGNATURE] = calc_signature(signed_content(ext, cmd.body), self.secret_key)

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

RocketMQ 5 clients sign gRPC calls differently: every call carries the metadata
``x-mq-date-time`` (``20240102T030405Z``) and ``authorization`` =
``MQv2-HMAC-SHA1 Credential=<AccessKey>, SignedHeaders=x-mq-date-time, Signature=<hex>``, the
signature being the hex of HmacSHA1 keyed with the secret key over the ``x-mq-date-time`` value
(RocketMQ's ``AuthorizationHeader``; ``Credential`` may go on with ``/region/channel``).
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


# -- gRPC (RocketMQ 5 clients) ----------------------------------------------------------------

#: Metadata keys of a signed gRPC call.
GRPC_AUTHORIZATION = "authorization"
GRPC_DATE_TIME = "x-mq-date-time"
#: The only signing algorithm RocketMQ 5 clients use.
GRPC_ALGORITHM = "MQv2-HMAC-SHA1"


@dataclass(frozen=True)
class GrpcAuthorization:
    """A parsed ``authorization`` value (``access_key`` "" when it names none)."""

    access_key: str
    signature: str = field(repr=False)
    signed_headers: tuple[str, ...] = ()


def parse_grpc_authorization(value: str) -> GrpcAuthorization:
    """Read an ``authorization`` metadata value.

    Raises:
        ValueError: saying what is wrong with it.
    """
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != GRPC_ALGORITHM:
        raise ValueError(f"signing algorithm must be {GRPC_ALGORITHM}, got {algorithm[:40]!r}")
    items: dict[str, str] = {}
    for part in rest.split(","):
        key, eq, val = part.strip().partition("=")
        if not eq:
            raise ValueError(f"cannot read {part.strip()[:40]!r}")
        items[key.strip()] = val.strip()
    # An empty Credential is what clients without credentials send: no access key.
    ak = items.get("Credential", "").split("/")[0]
    signature = items.get("Signature", "")
    if not signature:
        raise ValueError("no Signature")
    headers = tuple(h for h in items.get("SignedHeaders", "").split(";") if h)
    return GrpcAuthorization(ak, signature, headers)


def grpc_signature(secret_key: str, date_time: str) -> str:
    """hex(HmacSHA1(secret_key, date_time)), what a RocketMQ 5 client sends."""
    return hmac.new(secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1).hexdigest()


def grpc_authorization(access_key: str, secret_key: str, date_time: str) -> str:
    """The ``authorization`` value a RocketMQ 5 client sends with ``x-mq-date-time``."""
    return (
        f"{GRPC_ALGORITHM} Credential={access_key}, SignedHeaders={GRPC_DATE_TIME}, "
        f"Signature={grpc_signature(secret_key, date_time)}"
    )


def verify_grpc_signature(auth: GrpcAuthorization, date_time: str, secret_key: str) -> bool:
    """Whether the signature matches (hex, either case; compared in constant time)."""
    expected = grpc_signature(secret_key, date_time)
    return hmac.compare_digest(expected.encode("ascii"), auth.signature.lower().encode("utf-8"))

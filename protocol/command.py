"""RemotingCommand: one request or response, independent of its encoding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .codes import (
    RPC_ONEWAY,
    RPC_TYPE_RESPONSE,
    TXMQ_PROTOCOL_VERSION,
    LanguageCode,
    ResponseCode,
    SerializeType,
)


@dataclass(slots=True)
class RemotingCommand:
    """A decoded frame.  ``ext_fields`` holds RocketMQ's camelCase keys; values may be native
    (msgpack) or strings (JSON, ROCKETMQ): use the typed headers in :mod:`.headers` to read them.
    """

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""
    language: int = LanguageCode.PYTHON
    version: int = TXMQ_PROTOCOL_VERSION
    serialize_type: SerializeType = SerializeType.MSGPACK

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RPC_TYPE_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY)

    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: dict[str, Any] | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
        serialize_type: SerializeType = SerializeType.MSGPACK,
    ) -> RemotingCommand:
        return cls(
            code=int(code),
            flag=RPC_ONEWAY if oneway else 0,
            ext_fields=dict(ext_fields or {}),
            body=body,
            serialize_type=serialize_type,
        )

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        ext_fields: dict[str, Any] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The answer to this request: same opaque, same serialize type."""
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=RPC_TYPE_RESPONSE,
            remark=remark,
            ext_fields=dict(ext_fields or {}),
            body=body,
            serialize_type=self.serialize_type,
        )

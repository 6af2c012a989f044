"""txmq's wire format: RocketMQ remoting frames with msgpack headers (sans-IO, plus one small
asyncio adapter in :mod:`txmq.protocol.aio`)."""

from .codes import LanguageCode, RequestCode, ResponseCode, SerializeType
from .command import RemotingCommand
from .errors import ProtocolError, TxmqError, error_for_code
from .frame import FrameDecoder, decode_frame, encode_frame
from .message import Message, MessageConst, MessageExt, MessageSysFlag

__all__ = [
    "FrameDecoder",
    "LanguageCode",
    "Message",
    "MessageConst",
    "MessageExt",
    "MessageSysFlag",
    "ProtocolError",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "SerializeType",
    "TxmqError",
    "decode_frame",
    "encode_frame",
    "error_for_code",
]

"""The native gRPC transport (``grpcTransport = native``, broker/grpc/h2.py) on real sockets:
protocol errors are answered with GOAWAY and cost only their own connection, an oversized
request is RESOURCE_EXHAUSTED, a large ReceiveMessage answer keeps within the client's flow
control windows, and one connection carries many calls at once."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.support.brokers import started
from tests.support.grpc_probes import receive_request
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")
h2conn = pytest.importorskip("h2.connection", reason="h2 (a dev dependency) is not installed")

import h2.config  # noqa: E402
import h2.events  # noqa: E402
import h2.settings  # noqa: E402

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc  # noqa: E402

MD = (("x-mq-client-id", "native-client-1"), ("x-mq-language", "PYTHON"))
TOPIC = "native-h2"
GROUP = "native-h2-g"
LIMIT = 256 * 1024
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GOAWAY = 7


@pytest.fixture
async def b(make_broker_config: Callable[..., BrokerConfig]) -> AsyncIterator[BrokerController]:
    async with started(
        make_broker_config(
            grpc_server_enable=True,
            grpc_server_port=0,
            grpc_transport="native",
            max_message_size=LIMIT,
        )
    ) as controller:
        yield controller


@pytest.fixture
async def stub(b: BrokerController) -> AsyncIterator[Any]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc_port}", options=options)
    try:
        yield sgrpc.MessagingServiceStub(channel)
    finally:
        await channel.close()


def message(body: bytes, mid: str) -> Any:
    m = pb.Message(topic=pb.Resource(name=TOPIC), body=body)
    m.system_properties.message_id = mid
    m.system_properties.message_type = pb.NORMAL
    m.system_properties.born_host = "127.0.0.1"
    return m


async def send(stub: Any, body: bytes, mid: str) -> Any:
    req = spb.SendMessageRequest(messages=[message(body, mid)])
    return await stub.SendMessage(req, metadata=MD, timeout=10)


async def route(stub: Any) -> Any:
    req = spb.QueryRouteRequest(topic=pb.Resource(name=TOPIC))
    r = await stub.QueryRoute(req, metadata=MD, timeout=10)
    assert r.status.code == pb.OK, r.status
    return r


async def read_frames(reader: asyncio.StreamReader) -> list[tuple[int, int, int, bytes]]:
    """Every frame the server sends until it closes: (type, flags, stream, payload)."""
    data = b""
    while True:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        if not chunk:
            break
        data += chunk
    frames = []
    pos = 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos : pos + 3], "big")
        kind, flags = data[pos + 3], data[pos + 4]
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        frames.append((kind, flags, sid, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return frames


def goaway_code(frames: list[tuple[int, int, int, bytes]]) -> int:
    codes = [int.from_bytes(f[3][4:8], "big") for f in frames if f[0] == GOAWAY]
    assert codes, f"no GOAWAY among {[f[0] for f in frames]}"
    return codes[0]


@pytest.mark.parametrize(
    ("opening", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n", 1),  # not HTTP/2: PROTOCOL_ERROR
        (PREFACE + b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x", 1),  # DATA on stream 0
        (PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x01", 1),  # SETTINGS on stream 1
        (PREFACE + b"\x00\x00\x07\x06\x00\x00\x00\x00\x00" + b"1234567", 6),  # short PING
    ],
    ids=["bad-preface", "data-on-stream-0", "settings-on-a-stream", "short-ping"],
)
async def test_a_protocol_error_gets_goaway_and_others_are_served(
    b: BrokerController, stub: Any, opening: bytes, code: int
) -> None:
    first = await route(stub)  # a connection open before
    reader, writer = await asyncio.open_connection("127.0.0.1", b.grpc_port)
    try:
        writer.write(opening)
        await writer.drain()
        frames = await read_frames(reader)
    finally:
        writer.close()
    assert goaway_code(frames) == code
    assert b.metrics.registry.get_sample_value("txmq_protocol_errors_total") == 1
    again = await route(stub)
    assert again.message_queues == first.message_queues
    # and a connection opened after
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc_port}")
    try:
        await route(sgrpc.MessagingServiceStub(channel))
    finally:
        await channel.close()


async def test_a_message_over_the_bound_is_resource_exhausted(
    b: BrokerController, stub: Any
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await send(stub, b"x" * (LIMIT + 1024 * 1024 + 1), "too-large-1")
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # the connection goes on serving
    ok = await send(stub, b"y" * 1000, "after-too-large-1")
    assert ok.status.code == pb.OK, ok.status


async def test_many_concurrent_calls_on_one_connection(b: BrokerController, stub: Any) -> None:
    n = 400
    results = await asyncio.gather(
        *(send(stub, f"body-{i}".encode(), f"concurrent-{i}") for i in range(n)),
        *(route(stub) for _ in range(50)),
    )
    assert all(r.status.code == pb.OK for r in results[:n])
    ids = {r.entries[0].message_id for r in results[:n]}
    assert len(ids) == n
    assert b.grpc is not None and b.grpc._h2 is not None
    assert len(b.grpc._h2.connections) == 1


class RawClient:
    """A gRPC client on ``h2`` with a small window it gives back only as it reads: ``h2``
    refuses (ProtocolError) any DATA the server sends beyond the window."""

    def __init__(self, window: int) -> None:
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2conn.H2Connection(config)
        self.conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self, port: int) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.conn.initiate_connection()
        await self._flush()

    async def _flush(self) -> None:
        assert self.writer is not None
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    async def call(self, method: str, request: Any) -> tuple[list[bytes], dict[bytes, bytes]]:
        """The response messages and trailers of one call."""
        assert self.reader is not None
        sid = self.conn.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", f"/apache.rocketmq.v2.MessagingService/{method}".encode()),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"grpc-timeout", b"20S"),
            *((k.encode(), v.encode()) for k, v in MD),
        ]
        self.conn.send_headers(sid, headers)
        body = request.SerializeToString()
        self.conn.send_data(sid, struct.pack(">BL", 0, len(body)) + body, end_stream=True)
        await self._flush()
        data = bytearray()
        trailers: dict[bytes, bytes] = {}
        ended = False
        while not ended:
            chunk = await asyncio.wait_for(self.reader.read(65536), 20)
            assert chunk, "the server closed the connection"
            for ev in self.conn.receive_data(chunk):
                if isinstance(ev, h2.events.DataReceived):
                    data += ev.data
                    # read slowly: the window comes back one frame at a time
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.TrailersReceived):
                    trailers = dict(ev.headers)
                elif isinstance(ev, h2.events.StreamEnded):
                    ended = True
                elif isinstance(ev, h2.events.StreamReset):
                    raise AssertionError(f"stream reset: {ev}")
            await self._flush()
        messages = []
        pos = 0
        while pos < len(data):
            _, length = struct.unpack_from(">BL", data, pos)
            messages.append(bytes(data[pos + 5 : pos + 5 + length]))
            pos += 5 + length
        return messages, trailers

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def test_a_large_receive_batch_keeps_within_the_client_windows(
    b: BrokerController, stub: Any
) -> None:
    bodies = [bytes([65 + i % 26]) * (LIMIT - 1000) for i in range(12)]
    for i, body in enumerate(bodies):
        r = await send(stub, body, f"big-{i}")
        assert r.status.code == pb.OK, r.status
    req = receive_request(GROUP, TOPIC, queue_id=-1, invisible_ms=30_000, poll_ms=1000)
    client = RawClient(window=16_384)
    await client.connect(b.grpc_port)
    try:
        got: list[bytes] = []
        for _ in range(5):
            messages, trailers = await client.call("ReceiveMessage", req)
            assert trailers.get(b"grpc-status") == b"0", trailers
            for raw in messages:
                r = spb.ReceiveMessageResponse.FromString(raw)
                if r.HasField("message"):
                    got.append(r.message.body)
            if len(got) >= len(bodies):
                break
    finally:
        client.close()
    assert sorted(got) == sorted(bodies)


async def test_the_grpcio_fallback_serves_the_same_answers(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    answers = []
    for transport in ("native", "grpcio"):
        controller = BrokerController(
            make_broker_config(
                grpc_server_enable=True, grpc_server_port=0, grpc_transport=transport
            )
        )
        await controller.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{controller.grpc_port}")
        try:
            s = sgrpc.MessagingServiceStub(channel)
            sent = await send(s, b"fallback", f"fallback-{transport}")
            routed = await route(s)
            refused = [r.status.code async for r in s.ReceiveMessage(spb.ReceiveMessageRequest())]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary("/apache.rocketmq.v2.MessagingService/Nope")(b"")
            answers.append(
                (sent.status.code, len(routed.message_queues), refused, err.value.code())
            )
        finally:
            await channel.close()
            await controller.shutdown()
    assert answers[0] == answers[1]


def test_the_header_decoder_reads_what_hpack_encodes() -> None:
    """Blocks from ``hpack``'s encoder (Huffman strings, fields added to and evicted from the
    dynamic table, a table size change) decode to the same fields, block after block; broken
    blocks are a COMPRESSION_ERROR."""
    import random

    import hpack

    from txmq.broker.grpc.h2frames import COMPRESSION_ERROR, ConnectionError_, HpackDecoder

    rng = random.Random(7)
    encoder = hpack.Encoder()
    decoder = HpackDecoder()
    for i in range(400):
        if i == 200:
            encoder.header_table_size = 1024
        headers = [
            (b":method", b"POST"),
            (b":path", b"/apache.rocketmq.v2.MessagingService/SendMessage"),
            (b"grpc-timeout", f"{rng.randrange(1, 99999)}m".encode()),
            (b"x-mq-request-id", f"{rng.getrandbits(64):x}".encode()),
            (b"x-mq-client-id", f"client-{rng.randrange(5)}".encode()),
            (b"x-long", b"v" * rng.randrange(0, 600)),
        ]
        block = encoder.encode(headers, huffman=bool(i % 2))
        assert decoder.decode(block) == headers
    for broken in (b"\xff\xff\xff\xff\xff\xff\xff", b"\xfe", b"\x40\x85ab", b"\x00\x7f"):
        with pytest.raises(ConnectionError_) as err:
            HpackDecoder().decode(broken)
        assert err.value.code == COMPRESSION_ERROR


async def test_stop_says_goaway_and_closes(make_broker_config: Callable[..., BrokerConfig]) -> None:
    async with started(
        make_broker_config(grpc_server_enable=True, grpc_server_port=0, grpc_transport="native")
    ) as controller:
        reader, writer = await asyncio.open_connection("127.0.0.1", controller.grpc_port)
        writer.write(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # empty SETTINGS
        await writer.drain()
        # served: the broker's own SETTINGS frame arrives (9 bytes of frame head, then payload)
        head = await asyncio.wait_for(reader.readexactly(9), 10)
        assert head[3] == 0x4, "the broker's first frame is not SETTINGS"
        await asyncio.wait_for(reader.readexactly(int.from_bytes(head[:3], "big")), 10)
    try:
        frames = await read_frames(reader)
    finally:
        writer.close()
    assert goaway_code(frames) == 0  # NO_ERROR


async def test_a_telemetry_flood_is_ended_resource_exhausted(b: BrokerController) -> None:
    client = RawClient(window=65_535)
    await client.connect(b.grpc_port)
    conn = client.conn
    try:
        sid = conn.get_next_available_stream_id()
        conn.send_headers(
            sid,
            [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", b"/apache.rocketmq.v2.MessagingService/Telemetry"),
                (b":authority", b"localhost"),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
                *((k.encode(), v.encode()) for k, v in MD),
            ],
        )
        conn.send_data(sid, b"\x00\x00\x00\x00\x00" * 3000)  # empty commands, none read yet
        await client._flush()
        trailers: dict[bytes, bytes] = {}
        assert client.reader is not None
        while not trailers:
            chunk = await asyncio.wait_for(client.reader.read(65536), 10)
            assert chunk, "the server closed the connection"
            for ev in conn.receive_data(chunk):
                if isinstance(ev, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
                    headers = dict(ev.headers)
                    if b"grpc-status" in headers:
                        trailers = headers
            await client._flush()
        assert trailers[b"grpc-status"] == b"8", trailers
    finally:
        client.close()
    # the connection's others, and new ones, are served
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc_port}")
    try:
        await route(sgrpc.MessagingServiceStub(channel))
    finally:
        await channel.close()

"""The compiled request path (mypyc, ``setup.py``) against plain Python: two real brokers in
their own processes, one as built, one with ``TXMQ_PURE_PYTHON=1``, get the same seeded
random mix over sockets (plain sends V1/V2, resends inside the duplicate window, batches,
transactions committed and rolled back, pulls, requests that must be refused, a broken frame)
and must answer the same and store the same bytes, record for record, in the commit log.

Without a build (compiling is opt-in: ``TXMQ_COMPILE=1 make install``) there is nothing to
compare: the test is skipped, except when ``TXMQ_COMPILE=1`` is set (``TXMQ_COMPILE=1 make
test``), and then it fails."""

from __future__ import annotations

import asyncio
import os
import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.support.fastpath import comparable
from tests.support.process import BrokerProcess
from tests.support.raw import RawClient, connected
from txmq import _compiled
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import EndTransactionRequestHeader, SendMessageRequestHeader
from txmq.protocol.message import (
    BatchBody,
    MessageConst,
    MessageSysFlag,
    decode_message,
    decode_offset_msg_id,
)
from txmq.protocol.message import properties_to_string as props_text

pytestmark = pytest.mark.external

C = MessageConst
F = MessageSysFlag
MAX_BODY = 2048
TOPICS = ("cy-a", "cy-b")
#: In a stored record (12-byte frame head, then RocketMQ's layout): the frame's CRC and the
#: payload's BORNHOST, STORETIMESTAMP and STOREHOST differ between two brokers.
_FRAME_CRC = slice(8, 12)
_PER_BROKER = slice(12 + 48, 12 + 72)
_RECORD_MAGIC = 0x54584D51
_OP_TOPIC = b"RMQ_SYS_TRANS_OP_HALF_TOPIC"
_HEAD = struct.Struct(">II")
SETTINGS = {
    "maxMessageSize": MAX_BODY,
    # no check-back while the mix runs: every half is decided by the mix itself
    "transactionCheckInterval": 600_000,
    "transactionTimeOut": 600_000,
    "mappedFileSizeCommitLog": 4 * 1024 * 1024,
}


def built() -> bool:
    return bool(_compiled.decide({}).modules)


def require_build() -> None:
    if built():
        return
    if os.environ.get("TXMQ_COMPILE") == "1":
        pytest.fail(
            f"TXMQ_COMPILE=1 asked for a compiled build, but: {_compiled.decide({}).describe()}"
        )
    pytest.skip(
        f"not compiled here ({_compiled.decide({}).describe()}): `TXMQ_COMPILE=1 make install`"
    )


@pytest.fixture
def brokers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, BrokerProcess]]:
    require_build()
    procs = {
        "compiled": BrokerProcess(str(tmp_path / "compiled"), settings=SETTINGS),
        "pure": BrokerProcess(str(tmp_path / "pure"), settings=SETTINGS),
    }
    try:
        monkeypatch.delenv(_compiled.PURE_ENV, raising=False)
        procs["compiled"].start()
        monkeypatch.setenv(_compiled.PURE_ENV, "1")
        procs["pure"].start()
        monkeypatch.delenv(_compiled.PURE_ENV)
        yield procs
    finally:
        for p in procs.values():
            p.stop_quietly()


def code_path(p: BrokerProcess) -> dict[str, Any]:
    lines = [d for d in p.log_lines if d.get("event") == "code_path"]
    assert len(lines) == 1, f"one code_path line expected: {p.log_lines[:10]}"
    return lines[0]


def _walk(raw: bytes | bytearray | memoryview) -> list[Any]:
    """The records of a commit-log segment or a pull answer's body, per-broker bytes zeroed."""
    out = []
    pos = 0
    while pos + 12 <= len(raw):
        magic, length = _HEAD.unpack_from(raw, pos)
        if magic != _RECORD_MAGIC:
            break
        rec = bytearray(raw[pos : pos + 12 + length])
        rec[_FRAME_CRC] = bytes(4)
        rec[_PER_BROKER] = bytes(24)
        out.append(_without_clock(bytes(rec)))
        pos += 12 + length
    return out


def _without_clock(rec: bytes) -> Any:
    """A transaction's op record carries the time of the decision (its BORNTIMESTAMP and the
    body's ``ts``, hence its BODYCRC): every field but those, the body decoded."""
    if _OP_TOPIC not in rec:
        return rec
    m = decode_message(rec[12:])
    d = comparable(m)
    body = msgpack.unpackb(m.body)
    assert isinstance(body.pop("ts"), int), body
    d["body"] = body
    del d["born_timestamp"], d["body_crc"]
    return d


def _pulled(body: bytes) -> list[bytes]:
    """A pull answer's messages (RocketMQ layout, no frame head), per-broker bytes zeroed."""
    out = []
    pos = 0
    while pos + 4 <= len(body):
        (size,) = struct.unpack_from(">i", body, pos)
        rec = bytearray(body[pos : pos + size])
        rec[48:72] = bytes(24)
        out.append(bytes(rec))
        pos += size
    return out


def stored_records(store_dir: str) -> list[Any]:
    folder = Path(store_dir) / "commitlog"
    out: list[Any] = []
    for seg in sorted(folder.iterdir()):
        out += _walk(seg.read_bytes())
    return out


def answer(resp: RemotingCommand) -> dict[str, Any]:
    """What a client sees, less what names the broker (its address inside message ids)."""
    ext = dict(resp.ext_fields or {})
    for key in ("msgId", "offsetMsgId"):
        if key in ext and ext[key]:
            ext[key] = [decode_offset_msg_id(i)[1] for i in str(ext[key]).split(",")]
    body: Any = resp.body
    return {"code": resp.code, "remark": resp.remark, "ext": ext, "body": body}


def _header(rng: random.Random, topic: str, props: dict[str, str], sys_flag: int = 0) -> Any:
    return SendMessageRequestHeader(
        producer_group="cy-g",
        topic=topic,
        queue_id=rng.randrange(4),
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_000 + rng.randrange(10**6),
        flag=rng.choice((0, 0, 7)),
        properties=props_text(props),
    )


def _props(rng: random.Random, n: int) -> dict[str, str]:
    p = {C.UNIQ_KEY: f"CY{n:030X}", C.WAIT_STORE_MSG_OK: "true"}
    if rng.random() < 0.5:
        p[C.TAGS] = rng.choice(("a", "b", "tag-c"))
    if rng.random() < 0.3:
        p[C.KEYS] = f"k{rng.randrange(100)}"
    if rng.random() < 0.2:
        p["user"] = "v" * rng.randrange(1, 40)
    return p


def _body(rng: random.Random) -> bytes:
    return rng.randbytes(rng.choice((0, 1, 16, 200, 1024)))


async def drive(client: RawClient, address: str, seed: int, ops: int) -> list[Any]:
    """The mix: every answer, in order, as :func:`answer` sees it."""
    rng = random.Random(seed)
    out: list[Any] = []
    sent: list[tuple[int, dict[str, Any], bytes]] = []
    n = 0

    async def call(code: int, ext: dict[str, Any], body: bytes = b"") -> RemotingCommand:
        resp = await client.call(code, ext, body)
        out.append((code, answer(resp)))
        return resp

    for _ in range(ops):
        n += 1
        kind = rng.choices(
            ("send", "send_v1", "resend", "batch", "txn", "pull", "bad"),
            weights=(30, 10, 5, 10, 15, 10, 10),
        )[0]
        topic = rng.choice(TOPICS)
        if kind in ("send", "send_v1"):
            h = _header(rng, topic, _props(rng, n))
            ext = h.to_v2_ext_fields() if kind == "send" else h.to_ext_fields()
            code = RequestCode.SEND_MESSAGE_V2 if kind == "send" else RequestCode.SEND_MESSAGE
            body = _body(rng)
            sent.append((code, ext, body))
            await call(code, ext, body)
        elif kind == "resend" and sent:
            await call(*rng.choice(sent))
        elif kind == "batch":
            bb = BatchBody()
            for i in range(rng.randrange(1, 20)):
                p = {C.UNIQ_KEY: f"CB{n:024X}{i:06X}"}
                if rng.random() < 0.3:
                    p[C.TAGS] = "t"
                bb.add(_body(rng), props_text(p).encode(), 0)
            h = _header(rng, topic, {C.WAIT_STORE_MSG_OK: "true"})
            h.batch = True
            await call(RequestCode.SEND_BATCH_MESSAGE, h.to_v2_ext_fields(), bb.encode())
        elif kind == "txn":
            halves = []
            for i in range(rng.randrange(1, 4)):
                p = _props(rng, n * 10 + i)
                p[C.TRAN_MSG] = "true"
                p[C.PGROUP] = "cy-g"
                h = _header(rng, topic, p, sys_flag=F.TRANSACTION_PREPARED_TYPE)
                resp = await call(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext_fields(), _body(rng))
                if resp.code == ResponseCode.SUCCESS:
                    halves.append(resp)
            decision = rng.choice((F.TRANSACTION_COMMIT_TYPE, F.TRANSACTION_ROLLBACK_TYPE))
            for half in halves:
                sh = RawClient.send_header(half)
                end = EndTransactionRequestHeader(
                    producer_group="cy-g",
                    tran_state_table_offset=sh.queue_offset,
                    commit_log_offset=decode_offset_msg_id(sh.msg_id)[1],
                    commit_or_rollback=decision,
                    from_transaction_check=False,
                    msg_id=sh.msg_id,
                    transaction_id=sh.transaction_id,
                )
                await call(RequestCode.END_TRANSACTION, end.to_ext_fields())
        elif kind == "pull":
            resp, _ = await client.pull(topic, rng.randrange(4), rng.randrange(5), max_nums=8)
            out.append(("pull", resp.code, resp.ext_fields, _pulled(resp.body)))
        else:
            case = rng.randrange(5)
            if case == 0:  # no topic
                ext = _header(rng, topic, _props(rng, n)).to_v2_ext_fields()
                del ext["b"]
                await call(RequestCode.SEND_MESSAGE_V2, ext, b"x")
            elif case == 1:  # a field that is not a number
                ext = _header(rng, topic, _props(rng, n)).to_v2_ext_fields()
                ext["e"] = "not-a-queue"
                await call(RequestCode.SEND_MESSAGE_V2, ext, b"x")
            elif case == 2:  # a body over maxMessageSize
                ext = _header(rng, topic, _props(rng, n)).to_v2_ext_fields()
                await call(RequestCode.SEND_MESSAGE_V2, ext, bytes(MAX_BODY + 1))
            elif case == 3:  # an unknown request code
                await call(9_999, {"x": "y"}, b"")
            else:  # a batch body that is cut short
                bb = BatchBody()
                bb.add(b"abc", props_text({C.UNIQ_KEY: f"CX{n:030X}"}).encode(), 0)
                h = _header(rng, topic, {})
                h.batch = True
                await call(RequestCode.SEND_BATCH_MESSAGE, h.to_v2_ext_fields(), bb.encode()[:-2])
    # A frame whose header length is larger than the frame (skipped, the connection goes on),
    # then an HTTP request (no frame at all: the broker closes the connection).
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(struct.pack(">ii", 8, 100) + b"{}{}" + b"GET / HTTP/1.1\r\n\r\n")
        await writer.drain()
        out.append(("broken-frame", await asyncio.wait_for(reader.read(), 10)))
    finally:
        writer.close()
    return out


@pytest.mark.parametrize("seed", [1, 2])
async def test_compiled_and_pure_answer_and_store_the_same(
    brokers: dict[str, BrokerProcess], seed: int
) -> None:
    compiled, pure = code_path(brokers["compiled"]), code_path(brokers["pure"])
    assert compiled["compiled"] == len(_compiled.decide({}).modules) > 0, compiled
    assert pure["compiled"] == 0 and "TXMQ_PURE_PYTHON" in pure["path"], pure
    answers = {}
    for name, p in brokers.items():
        async with connected(p.address) as client:
            answers[name] = await drive(client, p.address, seed, 150)
    a, b = answers["compiled"], answers["pure"]
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x == y, f"answer {i} differs: compiled {x!r} pure {y!r}"
    codes = {r[1]["code"] for r in a if isinstance(r[0], int)}
    assert ResponseCode.SUCCESS in codes and len(codes) > 2, f"the mix met too few outcomes {codes}"
    assert any(r[0] == "pull" and r[3] for r in a), "no pull found a message"
    for p in brokers.values():
        assert p.terminate(30) == 0
    left, right = (stored_records(p.store_dir) for p in brokers.values())
    assert len(left) > 100, len(left)
    assert len(left) == len(right)
    for i, (x, y) in enumerate(zip(left, right, strict=True)):
        assert x == y, f"stored record {i} differs: compiled {x!r} pure {y!r}"

"""Damage to any file of a stopped broker's store, chosen by hypothesis (which file, where, how:
bytes flipped or the file cut short): the broker starts, and every acknowledged message whose
own record was not hit is read back exactly once, as sent; nothing damaged is served and a
rolled-back transaction's message never appears."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import scratch
from tests.support.brokers import started
from tests.support.raw import connected
from txmq.broker.config import BrokerConfig
from txmq.broker.store.commit_log import RECORD_HEADER_SIZE
from txmq.protocol.message import decode_message

TOPIC = "orders"
COMMIT, ROLLBACK = 8, 12
#: Small files, so that every kind is small enough to copy for each example.
SETTINGS = dict(
    listen_port=0,
    mapped_file_size_commit_log=16 * 1024,
    max_message_size=4 * 1024,
    mapped_file_size_consume_queue=64 * 20,
    max_hash_slot_num=64,
    max_index_num=256,
    transaction_check_interval=600_000,
)


@dataclass(frozen=True)
class Template:
    root: str
    #: every file of the stopped store (relative path) and the length of its written part
    files: tuple[tuple[str, int], ...]
    #: body -> (commit-log offset, stored size) of each acknowledged, visible message
    records: dict[bytes, tuple[int, int]]
    rolled_back: bytes


def _config(root: str) -> BrokerConfig:
    return BrokerConfig(store_path_root_dir=root, **SETTINGS)  # type: ignore[arg-type]


async def _fill(root: str) -> tuple[dict[bytes, tuple[int, int]], bytes]:
    async with started(_config(root)) as b:
        async with connected(b.address) as c:
            for i in range(60):  # several commit-log segments and consume-queue files
                body = f"m{i:03d}-".encode() + bytes([65 + i % 26]) * (37 * (i % 9))
                sent = await c.send(TOPIC, body, queue_id=i % 2, props={"KEYS": f"k{i}"})
                assert sent.code == 0, sent.remark
            half = await c.send(TOPIC, b"tx-committed", group="g", transactional=True)
            assert (await c.end_transaction("g", half, COMMIT)).code == 0
            gone = await c.send(TOPIC, b"tx-rolled-back", group="g", transactional=True)
            assert (await c.end_transaction("g", gone, ROLLBACK)).code == 0
        b.ctx.offsets.commit("billing", TOPIC, 0, 2)
        records = {}
        for qid in b.store.queue_ids(TOPIC):
            r = b.store.get_messages(TOPIC, qid, 0, 1000)
            for raw in r.messages:
                m = decode_message(raw)
                records[m.body] = (m.commit_log_offset, RECORD_HEADER_SIZE + len(raw))
    return records, b"tx-rolled-back"


@functools.cache
def template() -> Template:
    root = scratch.mkdtemp("damage-")
    records, rolled_back = asyncio.run(_fill(root))
    files = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel == "lock":
                continue
            written = len(Path(path).read_bytes().rstrip(b"\0"))
            if written:
                files.append((rel, written))
    return Template(root, tuple(sorted(files)), records, rolled_back)


async def _read_back(root: str) -> list[bytes]:
    async with started(_config(root)) as b:  # must not fail, whatever was damaged
        async with connected(b.address) as c:
            bodies: list[bytes] = []
            for qid in (0, 1):
                offset = 0
                while True:  # past gaps (damaged records) to the queue's end
                    resp, msgs = await c.pull(TOPIC, qid, offset, group="auditor")
                    bodies += [m.body for m in msgs]
                    nxt = int(resp.ext_fields.get("nextBeginOffset", offset))
                    if not msgs and nxt <= offset:
                        break
                    offset = nxt
            return bodies


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_damage_to_any_file_costs_at_most_the_records_it_hit(data: st.DataObject) -> None:
    t = template()
    rel, written = data.draw(st.sampled_from(t.files), label="file")
    pos = data.draw(st.integers(0, max(0, written - 1)), label="position")
    how = data.draw(st.sampled_from(["flip", "cut"]), label="how")
    garbage = data.draw(st.binary(min_size=1, max_size=48), label="garbage")
    with tempfile.TemporaryDirectory() as folder:
        root = os.path.join(folder, "store")
        shutil.copytree(t.root, root)
        path = os.path.join(root, rel)
        with open(path, "r+b") as fh:
            if how == "cut":
                fh.truncate(pos)
                hit = (pos, 1 << 62)
            else:
                fh.seek(pos)
                old = fh.read(len(garbage))
                fh.seek(pos)
                fh.write(bytes(a ^ (g or 0x5A) for a, g in zip(old, garbage, strict=False)))
                hit = (pos, pos + len(old))
        bodies = asyncio.run(_read_back(root))

    assert len(bodies) == len(set(bodies)), f"a message served twice after damage to {rel}"
    assert t.rolled_back not in bodies, f"a rolled-back message served after damage to {rel}"
    unknown = [b[:40] for b in bodies if b not in t.records]
    assert not unknown, f"damaged bytes served after damage to {rel}: {unknown}"
    segment = int(os.path.basename(rel)) if rel.startswith("commitlog/") else None
    for body, (offset, size) in t.records.items():
        if segment is not None:
            start, end = hit[0] + segment, hit[1] + segment
            if offset < end and start < offset + size:
                continue  # its own record was hit: it may be gone
            if how == "cut" and offset >= start:
                continue  # the file was cut before it
        assert body in bodies, f"{body[:12]!r} lost after {how} of {rel} at {pos}"

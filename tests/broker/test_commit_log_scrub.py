"""The commit-log scrub: a record body byte flipped below the checkpoint (which recovery does not
read again) is reported by the scrub with its segment file and commit-log offset, counted in
``txmq_commit_log_damaged_records``, and the broker keeps serving every other record."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.brokers import started
from tests.support.logs import fresh_loggers
from tests.support.raw import connected
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.store.mapped_file import segment_name
from txmq.broker.store.scrub import check_chunk
from txmq.protocol.message import decode_message

TOPIC = "orders"
SMALL = dict(mapped_file_size_commit_log=16 * 1024, max_message_size=4 * 1024)
RATE = 64 * 1024 * 1024


@pytest.fixture(autouse=True)
def _fresh_loggers(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh_loggers(monkeypatch)


async def _filled(cfg: BrokerConfig) -> tuple[int, dict[bytes, int], int]:
    """60 messages over several segments; the port, each body's commit-log offset, and the
    end of the log."""
    async with started(cfg) as b:
        async with connected(b.address) as c:
            for i in range(60):
                body = f"m{i:03d}-".encode() + bytes([65 + i % 26]) * (50 * (i % 7) + 200)
                assert (await c.send(TOPIC, body)).code == 0
        offsets = {}
        for raw in b.store.get_messages(TOPIC, 0, 0, 1000).messages:
            m = decode_message(raw)
            offsets[m.body] = m.commit_log_offset
        end = b.store.max_phy_offset
    return b.port, offsets, end


def _segment_of(root: str, offset: int, size: int) -> tuple[Path, int]:
    start = offset - offset % size
    return Path(root) / "commitlog" / segment_name(start), start


def _damage_body(root: str, offset: int, body: bytes, size: int) -> Path:
    path, start = _segment_of(root, offset, size)
    data = bytearray(path.read_bytes())
    at = data.index(body, offset - start) + len(body) // 2
    data[at] ^= 0x20
    path.write_bytes(bytes(data))
    return path


def _events(logs: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == event]


async def test_a_damaged_record_below_the_checkpoint_is_reported_by_the_scrub(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config(**SMALL, commit_log_scrub_bytes_per_second=0)
    port, offsets, end = await _filled(cfg)
    bodies = sorted(offsets, key=offsets.__getitem__)
    victim = [b for b in bodies if offsets[b] >= 16 * 1024][1]  # in the second segment
    segment = _damage_body(cfg.store_path_root_dir, offsets[victim], victim, 16 * 1024)
    assert offsets[victim] < offsets[bodies[-1]]

    scrubbing = dataclasses.replace(cfg, listen_port=port, commit_log_scrub_bytes_per_second=RATE)
    with capture_logs() as logs:
        async with started(scrubbing) as b:
            # recovery starts at the checkpoint: it does not see the damage
            assert b.recovery["store"].damaged_records == 0
            scrub = b.scrub
            assert scrub is not None
            await wait_until(lambda: scrub.passes >= 1, 30, "a scrub pass")
            (pass_line,) = _events(logs, "commit_log_scrub_pass")
            assert pass_line["bytes_checked"] == end - b.store.min_phy_offset
            assert pass_line["records"] >= len(bodies) - 1
            assert pass_line["damaged_records"] == 1
            (line,) = _events(logs, "commit_log_record_damaged")
            assert line["log_level"] == "error"
            assert line["file"] == str(segment) and line["offset"] == offsets[victim]
            text = b.metrics.registry.collect()
            samples = {s.name: s.value for m in text for s in m.samples}
            assert samples["txmq_commit_log_damaged_records"] == 1
            assert samples["txmq_commit_log_scrubbed_bytes_total"] >= end - b.store.min_phy_offset

            # every other record is served
            async with connected(b.address) as c:
                got: list[bytes] = []
                offset = 0
                while True:
                    resp, msgs = await c.pull(TOPIC, 0, offset, group="auditor")
                    got += [m.body for m in msgs]
                    nxt = int(resp.ext_fields.get("nextBeginOffset", offset))
                    if not msgs and nxt <= offset:
                        break
                    offset = nxt
            assert sorted(got) == sorted(set(bodies) - {victim})
            failed = _events(logs, "message_read_failed")  # the read names the file too
            assert failed, "the damaged record was read"
            assert {(e["file"], e["commit_log_offset"]) for e in failed} == {
                (str(segment), offsets[victim])
            }


async def test_chunks_of_any_size_find_the_same_damage(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """The scrub of one segment, a few hundred bytes at a time (records larger than a chunk
    included), finds every record once and the damaged one at its offset."""
    cfg = make_broker_config(**SMALL, commit_log_scrub_bytes_per_second=0)
    _, offsets, end = await _filled(cfg)
    size = 16 * 1024
    bodies = sorted(offsets, key=offsets.__getitem__)
    victim = bodies[3]
    path = _damage_body(cfg.store_path_root_dir, offsets[victim], victim, size)
    seg_end = min(end, size)
    in_segment = [b for b in bodies if offsets[b] < seg_end]
    for budget in (100, 700, 5000, size):
        pos, records, damaged = 0, 0, []
        while pos < seg_end:
            got = check_chunk(str(path), 0, os.path.getsize(path), pos, end, budget)
            assert got.next_pos > pos
            pos, records = got.next_pos, records + got.records
            damaged += got.damaged
        assert records == len(in_segment) - 1, budget
        assert [d[0] for d in damaged] == [offsets[victim]], budget
        assert damaged[0][1] == offsets[bodies[4]] - offsets[victim]  # to the next record

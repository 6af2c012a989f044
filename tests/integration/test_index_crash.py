"""The message index survives SIGKILL: every acknowledged message can still be found by key and
by message id once the broker is back, and a damaged index file is set aside and rebuilt."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.client.helpers import FAST_CLIENT
from tests.support.process import BrokerProcess
from tests.support.waiting import wait_until
from txmq.broker.store.index import IndexFile, IndexFileDamaged
from txmq.client import AsyncProducer, Message
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.errors import SystemBusyError, TxmqError

pytestmark = pytest.mark.slow

TOPIC = "indexed"
#: Small index files, so a run spans several and rolls over under load.
SETTINGS = {
    "mappedFileSizeCommitLog": 1024 * 1024,
    "maxMessageSize": 65536,
    "maxIndexNum": 600,
    "maxHashSlotNum": 128,
}


async def _send(address: str, acked: dict[str, str], stop: asyncio.Event, worker: int) -> None:
    """Send batches of keyed messages until stopped or the broker is gone; remember each
    acknowledged message id with its key."""
    try:
        async with AsyncProducer(f"idx-{worker}", broker=address, config=FAST_CLIENT) as p:
            i = 0
            while not stop.is_set():
                keys = [f"w{worker}-{i + j}" for j in range(10)]
                batch = [Message(TOPIC, k, keys=f"{k} batch-{worker}-{i}") for k in keys]
                try:
                    res = await p.send_batch(batch)
                except TxmqError:
                    return
                acked.update(zip(res.msg_ids, keys, strict=True))
                i += 10
    except (TxmqError, OSError):
        return


async def _all_found(address: str, acked: dict[str, str]) -> list[str]:
    """The acknowledged message ids the broker cannot find by key or by id (empty: all)."""
    async with AsyncAdminClient(address, timeout=30.0) as admin:

        async def found(msg_id: str, key: str) -> bool:
            by_key = await admin.query_messages(TOPIC, key)
            by_id = await admin.query_messages(TOPIC, msg_id, unique=True)
            return [m.msg_id for m in by_key.messages] == [msg_id] and len(by_id.messages) == 1

        items = list(acked.items())
        missing: list[str] = []
        for at in range(0, len(items), 200):  # 200 queries in flight on the connection
            chunk = items[at : at + 200]
            ok = await asyncio.gather(*(found(i, k) for i, k in chunk))
            missing += [i for (i, _k), good in zip(chunk, ok, strict=True) if not good]
    return missing


async def _caught_up(address: str, acked: dict[str, str]) -> bool:
    """The index has reached the newest acknowledged message (found by its id)."""
    last = list(acked)[-1]
    async with AsyncAdminClient(address) as admin:
        try:
            return bool((await admin.query_messages(TOPIC, last, unique=True)).messages)
        except SystemBusyError:  # still rebuilding: the broker says so instead of "not found"
            return False


def _rebuilt(bp: BrokerProcess, seen: int) -> bool:
    """The broker reported that its index has caught up with the commit log it found at the
    start (every record stored before the kill is indexed)."""
    bp.drain_logs(0.1)  # the lines written since the start
    return any(x.get("event") == "index_caught_up" for x in bp.log_lines[seen:])


def _index_events(bp: BrokerProcess, seen: int) -> list[dict[str, object]]:
    return [x for x in bp.log_lines[seen:] if str(x.get("event", "")).startswith("index_")]


def _synced_entries(index_dir: Path) -> int:
    """Index entries the files' headers say are synced."""
    total = 0
    for name in os.listdir(index_dir) if index_dir.exists() else []:
        try:
            f = IndexFile.open(str(index_dir / name))
        except (IndexFileDamaged, OSError):
            continue
        total += f.count
        f.close()
    return total


async def _load_then_kill(bp: BrokerProcess, acked: dict[str, str], at_least: int) -> None:
    stop = asyncio.Event()
    workers = [asyncio.ensure_future(_send(bp.address, acked, stop, w)) for w in range(3)]
    index_dir = Path(bp.store_dir) / "index"
    await wait_until(lambda: _synced_entries(index_dir) > 0, timeout=60, what="an index sync")
    at_least += len(acked)  # and more after it, so the kill leaves unsynced entries
    await wait_until(lambda: len(acked) >= at_least, timeout=60, what=f"{at_least} acks")
    bp.kill()  # mid-load: the index is behind and its newest file unsynced
    stop.set()
    await asyncio.wait_for(asyncio.gather(*workers), 30)


async def test_sigkill_under_load_every_acknowledged_message_is_still_found(
    tmp_path: Path,
) -> None:
    bp = BrokerProcess(str(tmp_path / "store"), settings=SETTINGS)
    bp.start()
    acked: dict[str, str] = {}
    try:
        await _load_then_kill(bp, acked, 1500)
        files = sorted(os.listdir(tmp_path / "store" / "index"))
        assert len(files) >= 2, f"the index did not roll over: {files}"
        seen = len(bp.log_lines)
        bp.start()
        loaded = [x for x in bp.log_lines[seen:] if x.get("event") == "index_loaded"]
        assert loaded and loaded[0]["entries"] > 0, bp.log_lines[seen:]
        # It resumes from its last synced position and re-reads the rest from the commit log,
        # and says when it has caught up with what it found stored (every acknowledged message).
        assert loaded[0]["behind_bytes"] > 0, loaded[0]
        await wait_until(lambda: _rebuilt(bp, seen), 120, "the index_caught_up report")
        assert await _caught_up(bp.address, acked)
        missing = await _all_found(bp.address, acked)
        assert missing == [], (len(missing), len(acked), missing[:5], _index_events(bp, seen))
        assert bp.terminate() == 0
        # A clean stop after the rebuild: everything is found at once after the next start.
        seen = len(bp.log_lines)
        bp.start()
        missing = await _all_found(bp.address, acked)
        assert missing == [], (len(missing), len(acked), missing[:5], _index_events(bp, seen))
    finally:
        bp.stop_quietly()


async def test_a_damaged_index_file_is_set_aside_and_rebuilt(tmp_path: Path) -> None:
    bp = BrokerProcess(str(tmp_path / "store"), settings=SETTINGS)
    bp.start()
    acked: dict[str, str] = {}
    try:
        await _load_then_kill(bp, acked, 1000)
        index_dir = tmp_path / "store" / "index"
        first = sorted(os.listdir(index_dir))[0]
        with open(index_dir / first, "r+b") as fh:
            fh.write(b"\x00" * 64)  # the header is gone
        seen = len(bp.log_lines)
        bp.start()
        damaged = [x for x in bp.log_lines[seen:] if x.get("event") == "index_file_damaged"]
        assert damaged and damaged[0]["file"].endswith(first), bp.log_lines[-20:]
        assert (index_dir / f"{first}.damaged").exists()
        await wait_until(lambda: _rebuilt(bp, seen), 120, "the index_caught_up report")
        missing = await _all_found(bp.address, acked)
        assert missing == [], (len(missing), len(acked), missing[:5], _index_events(bp, seen))
    finally:
        bp.stop_quietly()

"""Child process of test_store_crash.py: append to a store until killed.

Usage: ``python crash_child.py STORE_DIR SEED MODE`` with MODE ``sync`` or ``async``.

* sync: after every append, ``flush()``; once it returns, the line
  ``A <commit offset> <queue id> <queue offset> <body hex>`` is written to stdout: the message
  is acknowledged.
* async: appends without flushing; a background thread flushes and writes
  ``F <flushed offset>`` after each flush.

In both modes a background thread also runs ``flush_consume_queues()`` (checkpoints) in a loop,
as the broker does.  Message ``i`` goes to queue ``rng.randrange(3)`` with body
``b"<seed>:<i>:" + rng.randbytes(rng.randrange(400))`` (``rng = random.Random(seed)``), so the
parent can regenerate every message.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import structlog

from txmq.broker.store import MessageStore, StoreConfig
from txmq.protocol.message import MessageExt

TOPIC = "Crash"


def message(rng: random.Random, seed: int, i: int) -> tuple[int, bytes]:
    qid = rng.randrange(3)
    return qid, f"{seed}:{i}:".encode() + rng.randbytes(rng.randrange(400))


def main() -> None:
    store_dir, seed, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # logs to stderr: stdout carries the acknowledgements
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    store = MessageStore(
        StoreConfig(
            store_dir, mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 50
        ),
        ("127.0.0.1", 10911),
    )
    store.load()

    def out(line: str) -> None:
        os.write(1, (line + "\n").encode())

    def background() -> None:
        while True:
            if mode == "async":
                out(f"F {store.flush()}")
            store.flush_consume_queues()
            time.sleep(0.002)

    threading.Thread(target=background, daemon=True).start()
    out("READY")
    rng = random.Random(seed)
    i = 0
    while True:
        qid, body = message(rng, seed, i)
        r = store.put_message(
            MessageExt(topic=TOPIC, body=body, queue_id=qid, properties={"TAGS": f"t{i % 2}"})
        )
        if mode == "sync":
            if store.flush() < r.end_offset:
                raise SystemExit("flush returned before covering the message")
            out(f"A {r.commit_log_offset} {qid} {r.queue_offset} {body.hex()}")
        i += 1


if __name__ == "__main__":
    main()

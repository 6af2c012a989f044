"""txmq figures for the peer harness (txmq's asyncio SDK, ``txmq.client``).

This is the harness's adapter (``extra/bench_txmq.py`` of the peers harness) with the
idempotent-send figures added; copy it over that file in a copy of the harness to run them
(see docs/performance.md).

Two broker instances, both started by peers.sh from extra/*.start:

* ``txmq``       flushDiskType ASYNC_FLUSH (the default): a send / END_TRANSACTION is answered
  once its record is written to the commit-log file (page cache); fsync every 500 ms.
  Compare with NATS 2.9 and Redis ``everysec``.
* ``txmq-sync``  SYNC_FLUSH: answered only after an fsync covering the record (group commit
  across concurrent requests).  Compare with RabbitMQ confirm/tx and Redis ``always``.
  These figures are named ``sync.*``; their broker CPU is taken from the txmq-sync PID.

Figures (same comparison classes as the peers):

  pub.one         AsyncProducer.send, wait for each SEND_OK before the next
  pub.win100/1000 AsyncProducer.send with up to 100 / 1000 sends in flight on one connection
                  (common.Window: one task per send, like the aio-pika / nats figures)
  pub.batch100    (no class) send_batch of 100 messages per SEND_BATCH_MESSAGE request
  txn.k           AsyncTransactionProducer.transaction(): k half messages (sent concurrently,
                  each acknowledged), then END_TRANSACTION commit, waiting for its answer
  txn.seq.k       (no class) as txn.k with the halves sent one after the other
  dedup.one       as pub.one, each message with its own id (``Message.msg_id``, what NATS'
                  Nats-Msg-Id is), and every 10th resent after its answer: the resend must be
                  answered with the first send's offsetMsgId and not stored (the topic holds N)
  dedup.win1000   the same with up to 1000 sends in flight
  consume         N messages already stored in the topic (4 queues); AsyncPullConsumer pulls
                  up to 1000 per PULL_MESSAGE, and commits the queue offset (one
                  UPDATE_CONSUMER_OFFSET request) after every batch

Every run writes to a fresh topic (created untimed with 4 queues), so the checks are exact:

  pub/txn  sum over the topic's queues of GET_MAX_OFFSET == messages the run counted
  txn      + the broker lists no PENDING/DISCARDED transaction of the run's topic and exactly
           ``commits`` COMMITTED ones
  consume  every queue's committed group offset == its max offset, and the sum == N
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any

from common import BODY, Result, Window  # type: ignore[import-not-found]  # the harness's

PID_NAME = "txmq"
SYNC_PID_NAME = "txmq-sync"
QUEUES = int(os.environ.get("TXMQ_QUEUES", "4"))
PULL_BATCH = int(os.environ.get("TXMQ_PULL_BATCH", "1000"))
SYNC_FIGURES = os.environ.get("TXMQ_SYNC_FIGURES", "1") == "1"


def _port(name: str, env: str) -> int | None:
    v = os.environ.get(env)
    if v:
        return int(v)
    state = os.environ.get(
        "PEERS_STATE",
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".state"),
    )
    try:
        with open(os.path.join(state, name, "port")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _quiet() -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


_seq = itertools.count(1)


async def run(ctx) -> None:
    _quiet()
    port = _port("txmq", "TXMQ_PORT")
    if port is None:
        raise RuntimeError("no txmq port: extra/txmq.start did not run (or set TXMQ_PORT)")
    await _suite(ctx, f"127.0.0.1:{port}", prefix="")
    sport = _port("txmq-sync", "TXMQ_SYNC_PORT")
    if SYNC_FIGURES and sport is not None:
        ctx.pid_name = SYNC_PID_NAME
        try:
            await _suite(ctx, f"127.0.0.1:{sport}", prefix="sync.")
        finally:
            ctx.pid_name = PID_NAME


# One function, as the harness's other adapters are: every figure's run and check is a closure
# over the clients and the topic made here.
async def _suite(ctx, address: str, prefix: str) -> None:
    from txmq.client import (
        AsyncProducer,
        AsyncPullConsumer,
        AsyncTransactionProducer,
        LocalTransactionState,
        Message,
        SendStatus,
        TransactionListener,
    )
    from txmq.client.admin import AsyncAdminClient

    class Listener(TransactionListener):  # only consulted by check-back (should not happen)
        async def execute_local_transaction(self, message, arg):  # type: ignore[override]
            return LocalTransactionState.COMMIT_MESSAGE

        async def check_local_transaction(self, message):  # type: ignore[override]
            return LocalTransactionState.COMMIT_MESSAGE

    tag = "SYNC_FLUSH" if prefix else "ASYNC_FLUSH"
    admin = AsyncAdminClient(address, timeout=30.0)
    await admin.__aenter__()
    producer = AsyncProducer("peers-bench-producer", address, request_timeout=30.0)
    txp = AsyncTransactionProducer("peers-bench-tx", Listener(), address, request_timeout=30.0)
    checker = AsyncPullConsumer("peers-bench-check", address, request_timeout=30.0)
    await producer.start()
    await txp.start()
    await checker.start()
    state: dict[str, Any] = {"topic": None}

    async def fresh_topic(_n=None):
        topic = f"peersbench-{prefix.rstrip('.') or 'async'}-{next(_seq)}"
        await admin.create_topic(topic, queues=QUEUES)
        state["topic"] = topic
        # warm the producers' route cache (untimed)
        await producer._route_for(topic)
        await txp.producer._route_for(topic)

    async def stored(topic: str) -> int:
        return sum([await checker.max_offset(topic, q) for q in range(QUEUES)])

    async def vstored(res: Result):
        m = await stored(state["topic"])
        return None if m == res.count else f"topic holds {m}, expected {res.count}"

    async def vtxn(res: Result):
        err = await vstored(res)
        if err:
            return err
        open_ = await admin.list_transactions(
            topic=state["topic"], state="PENDING,DISCARDED", limit=1_000_000
        )
        if open_:
            return f"{len(open_)} transactions still pending/discarded"
        done = await admin.list_transactions(
            topic=state["topic"], state="COMMITTED", limit=1_000_000
        )
        return (
            None
            if len(done) == res.commits
            else f"{len(done)} COMMITTED transactions, expected {res.commits}"
        )

    def ok(r) -> None:
        if r.status is not SendStatus.SEND_OK:
            raise RuntimeError(f"send answered {r.status}")

    async def send_one():
        ok(await producer.send(Message(state["topic"], BODY)))

    async def pub_one(n, deadline):
        done = 0
        while done < n and time.perf_counter() < deadline:
            await send_one()
            done += 1
        return Result(done)

    async def pub_window(n, deadline, win):
        w = Window(win)
        sent = 0
        while sent < n and time.perf_counter() < deadline:
            await w.submit(send_one())
            sent += 1
        await w.drain()
        return Result(w.done, note=f"{w.errors} errors" if w.errors else "")

    run_ids = itertools.count()

    async def send_with_id(topic, prefix_, i):
        mid = f"{prefix_}-{i}"
        r = await producer.send(Message(topic, BODY, msg_id=mid))
        ok(r)
        if i % 10 == 0:  # a resend of every 10th: answered with the first result, not stored
            again = await producer.send(Message(topic, BODY, msg_id=mid))
            ok(again)
            if again.offset_msg_id != r.offset_msg_id:
                raise RuntimeError(
                    f"resend of {mid} answered {again.offset_msg_id}, first {r.offset_msg_id}"
                )

    async def dedup_one(n, deadline):
        topic, run = state["topic"], f"d{next(run_ids)}"
        done = 0
        while done < n and time.perf_counter() < deadline:
            await send_with_id(topic, run, done)
            done += 1
        return Result(done)

    async def dedup_window(n, deadline, win):
        topic, run = state["topic"], f"w{next(run_ids)}"
        w = Window(win)
        sent = 0
        while sent < n and time.perf_counter() < deadline:
            await w.submit(send_with_id(topic, run, sent))
            sent += 1
        await w.drain()
        return Result(w.done, note=f"{w.errors} errors" if w.errors else "")

    async def pub_batch(n, deadline, k):
        done = 0
        topic = state["topic"]
        while done < n and time.perf_counter() < deadline:
            ok(await producer.send_batch([Message(topic, BODY) for _ in range(k)]))
            done += k
        return Result(done)

    async def txn(n, deadline, k, concurrent=True):
        done = commits = 0
        topic = state["topic"]
        while done < n and time.perf_counter() < deadline:
            async with txp.transaction() as t:
                if k == 1 or not concurrent:
                    for _ in range(k):
                        await t.send(Message(topic, BODY))
                else:
                    await asyncio.gather(*(t.send(Message(topic, BODY)) for _ in range(k)))
            # leaving the block without an exception = END_TRANSACTION commit, acknowledged
            if t.state is not LocalTransactionState.COMMIT_MESSAGE:
                raise RuntimeError(f"transaction ended {t.state}")
            done += k
            commits += 1
        return Result(done, commits)

    # --- consume: N stored messages, pull <=1000 per request, commit offset per batch ------
    cgroup: dict[str, Any] = {"name": None}

    async def fill(n):
        await fresh_topic()
        topic = state["topic"]
        left = n
        while left:
            k = min(256, left)
            ok(await producer.send_batch([Message(topic, BODY) for _ in range(k)]))
            left -= k
        cgroup["name"] = f"peers-bench-consumer-{next(_seq)}"

    async def consume(n, deadline):
        topic = state["topic"]
        got = 0
        async with AsyncPullConsumer(cgroup["name"], address, request_timeout=30.0) as c:
            offsets = {q: 0 for q in range(QUEUES)}
            empty: set[int] = set()
            while got < n and time.perf_counter() < deadline and len(empty) < QUEUES:
                for q in range(QUEUES):
                    if q in empty:
                        continue
                    r = await c.pull(topic, q, offsets[q], max_nums=min(PULL_BATCH, n - got))
                    if not r.messages:
                        empty.add(q)
                        continue
                    offsets[q] = r.next_begin_offset
                    await c.commit_offset(topic, q, offsets[q])  # the "ack" of the batch
                    got += len(r.messages)
                    if got >= n:
                        break
        return Result(got)

    async def vconsumed(res: Result):
        topic = state["topic"]
        total = 0
        async with AsyncPullConsumer(cgroup["name"], address, request_timeout=30.0) as c:
            for q in range(QUEUES):
                mx = await c.max_offset(topic, q)
                co = await c.committed_offset(topic, q)
                if (co or 0) != mx:
                    return f"queue {q}: committed offset {co}, max offset {mx}"
                total += mx
        return None if total == res.count else f"consumed {res.count}, stored {total}"

    async def figure(name: str, what: str, run: Any, verify: Any, cls: str | None) -> None:
        """One figure on a fresh topic; ``cls``: its comparison class (None: none)."""
        classed = {} if cls is None else {"cls": cls}
        await ctx.figure(
            name, f"{what} ({tag})", run, prepare=fresh_topic, verify=verify, **classed
        )

    try:
        await figure(f"{prefix}pub.one", "send, wait for each SEND_OK", pub_one, vstored, "pub.one")
        for win in (100, 1000):
            await figure(
                f"{prefix}pub.win{win}",
                f"send, <= {win} in flight",
                lambda n, d, win=win: pub_window(n, d, win),
                vstored,
                f"pub.win{win}",
            )
        if not prefix:
            await figure(
                "dedup.one",
                "send with a message id, each 10th resent",
                dedup_one,
                vstored,
                "dedup.one",
            )
            await figure(
                "dedup.win1000",
                "as dedup.one, <= 1000 in flight",
                lambda n, d: dedup_window(n, d, 1000),
                vstored,
                "dedup.win1000",
            )
            await figure(
                "pub.batch100",
                "send_batch, 100 per request",
                lambda n, d: pub_batch(n, d, 100),
                vstored,
                None,
            )
        for k in (1, 10, 100) if not prefix else (1, 100):
            await figure(
                f"{prefix}txn.{k}",
                f"transaction(): {k} half(s) + END_TRANSACTION commit",
                lambda n, d, k=k: txn(n, d, k),
                vtxn,
                f"txn.{k}",
            )
        if not prefix:
            await figure(
                "txn.seq.10",
                "as txn.10, halves one after the other",
                lambda n, d: txn(n, d, 10, concurrent=False),
                vtxn,
                None,
            )
            await ctx.figure(
                "consume",
                f"pull <= {PULL_BATCH}/request from {QUEUES} queues + "
                f"offset commit per batch ({tag})",
                consume,
                prepare=fill,
                cls="consume",
                verify=vconsumed,
            )
    finally:
        await checker.shutdown()
        await txp.shutdown()
        await producer.shutdown()
        await admin.__aexit__(None, None, None)

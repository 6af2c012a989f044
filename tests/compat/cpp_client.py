"""Drives Apache rocketmq-client-cpp through its PyPI ctypes wheel (``rocketmq==0.4.4``).

Runs in its own virtualenv (its top-level package ``rocketmq`` clashes with the RocketMQ 5
gRPC client's), started by the tests as a subprocess.  Every result is one JSON line on stdout;
a failure is a non-zero exit with the error on stderr.

    cpp_client.py send ADDR TOPIC --mode sync|oneway|orderly|batch --count N [--tags T]
                  [--body-size S] [--prefix P] [--property K=V ...] [--interval S]
                  [--keep-going] [--sharding-key K | --keys N]
    cpp_client.py push ADDR TOPIC GROUP --expect N [--expr "A || B"] [--fail-first]
                  [--timeout S] [--stop-file PATH] [--orderly] [--threads T]
    cpp_client.py pull ADDR TOPIC GROUP --expect N [--timeout S]

``send`` and ``push`` take ``--access-key AK --secret-key SK`` to sign every request (the
broker's ACL), through the client's ``set_session_credentials(ak, sk, "")``.

``push --stop-file PATH`` keeps consuming after the expected messages until PATH exists: the
test creates it once the group's offsets show every message consumed, so anything delivered
twice is in the output (instead of lingering a fixed time and hoping).

``send --mode orderly --keys N`` sends message ``i`` with sharding key ``i % N`` (one queue per
key); ``push --orderly`` consumes with the client's orderly consumer (it locks each queue on
the broker before consuming it, one callback at a time per queue); each received event then
carries the callback's ``start`` and ``end`` (monotonic seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from rocketmq.client import Message, Producer, PullConsumer, PushConsumer


def emit(**doc: object) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def body_of(prefix: str, i: int, size: int) -> bytes:
    head = f"{prefix}-{i}".encode()
    return head + b"." * max(size - len(head), 0)


def make_message(args: argparse.Namespace, i: int) -> Message:
    m = Message(args.topic)
    if args.tags:
        m.set_tags(args.tags)
    m.set_keys(f"{args.prefix}-key-{i}")
    m.set_body(body_of(args.prefix, i, args.body_size))
    for kv in args.property or []:
        k, _, v = kv.partition("=")
        m.set_property(k, v)
    return m


def cmd_send(args: argparse.Namespace) -> None:
    p = Producer(args.group)
    p.set_namesrv_addr(args.addr)
    if args.access_key:
        p.set_session_credentials(args.access_key, args.secret_key, "")
    p.start()
    try:
        if args.mode == "batch":
            r = p.send_batch([make_message(args, i) for i in range(args.count)])
            emit(status=int(r.status), msg_id=r.msg_id, offset=r.offset, count=args.count)
            return
        for i in range(args.count):
            m = make_message(args, i)
            if args.interval:
                time.sleep(args.interval)
            if args.mode == "sync" and args.keep_going:
                try:
                    r = p.send_sync(m)
                except Exception as exc:  # a failover in progress: note it, go on
                    emit(i=i, error=str(exc)[:200])
                    continue
                emit(i=i, status=int(r.status), msg_id=r.msg_id, offset=r.offset)
            elif args.mode == "sync":
                r = p.send_sync(m)
                emit(i=i, status=int(r.status), msg_id=r.msg_id, offset=r.offset)
            elif args.mode == "oneway":
                p.send_oneway(m)
                emit(i=i, sent=True)
            elif args.mode == "orderly":
                key = i % args.keys if args.keys else args.sharding_key
                r = p.send_orderly(m, key)
                emit(i=i, status=int(r.status), msg_id=r.msg_id, offset=r.offset)
        if args.linger:
            time.sleep(args.linger)  # stay connected (e.g. for a transaction check-back)
    finally:
        p.shutdown()


def recv_doc(msg: object) -> dict[str, object]:
    return {
        "body": msg.body[:64].decode("utf-8", "replace"),  # type: ignore[attr-defined]
        "body_len": len(msg.body),  # type: ignore[attr-defined]
        "tags": msg.tags.decode() if isinstance(msg.tags, bytes) else msg.tags,  # type: ignore[attr-defined]
        "keys": msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys,  # type: ignore[attr-defined]
        "msg_id": msg.id.decode() if isinstance(msg.id, bytes) else msg.id,  # type: ignore[attr-defined]
        "queue_id": msg.queue_id,  # type: ignore[attr-defined]
        "queue_offset": msg.queue_offset,  # type: ignore[attr-defined]
        "reconsume_times": msg.reconsume_times,  # type: ignore[attr-defined]
    }


def cmd_push(args: argparse.Namespace) -> None:
    got: list[dict[str, object]] = []
    lock = threading.Lock()
    failed_once: set[str] = set()
    done = threading.Event()

    def on_message(msg: object) -> None:
        doc = recv_doc(msg)
        start = time.monotonic()
        if args.orderly:
            time.sleep(0.002)  # room for a second callback of the queue to overlap, were it run
            doc.update(start=start, end=time.monotonic())
        with lock:
            if args.fail_first and doc["body"] not in failed_once:
                failed_once.add(str(doc["body"]))
                emit(event="reconsume_later", **doc)
                raise RuntimeError("RECONSUME_LATER on purpose")
            got.append(doc)
            emit(event="received", **doc)
            if len(got) >= args.expect:
                done.set()

    if args.expect <= 0:
        done.set()
    c = PushConsumer(args.group, orderly=args.orderly)
    c.set_namesrv_addr(args.addr)
    if args.access_key:
        c.set_session_credentials(args.access_key, args.secret_key, "")
    c.set_thread_count(args.threads)
    c.subscribe(args.topic, on_message, args.expr)
    c.start()
    try:
        if not done.wait(args.timeout):
            print(f"received {len(got)} of {args.expect} within {args.timeout}s", file=sys.stderr)
            sys.exit(3)
        if args.stop_file:
            # consume on (a duplicate would show) until the test has seen the group settle
            deadline = time.monotonic() + args.timeout
            while not os.path.exists(args.stop_file):
                if time.monotonic() > deadline:
                    print(f"no {args.stop_file} within {args.timeout}s", file=sys.stderr)
                    sys.exit(3)
                time.sleep(0.05)
    finally:
        c.shutdown()
    emit(event="done", count=len(got))


def cmd_pull(args: argparse.Namespace) -> None:
    c = PullConsumer(args.group)
    c.set_namesrv_addr(args.addr)
    c.start()
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + args.timeout
    try:
        while len(got) < args.expect and time.monotonic() < deadline:
            for msg in c.pull(args.topic):
                got.append(recv_doc(msg))
                emit(event="received", **got[-1])
                if len(got) >= args.expect:
                    break
    finally:
        c.shutdown()
    if len(got) < args.expect:
        print(f"pulled {len(got)} of {args.expect} within {args.timeout}s", file=sys.stderr)
        sys.exit(3)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send")
    s.add_argument("addr")
    s.add_argument("topic")
    s.add_argument("--group", default="cpp-producer")
    s.add_argument("--mode", default="sync", choices=["sync", "oneway", "orderly", "batch"])
    s.add_argument("--count", type=int, default=1)
    s.add_argument("--tags", default="")
    s.add_argument("--body-size", type=int, default=0)
    s.add_argument("--prefix", default="cpp")
    s.add_argument("--sharding-key", type=int, default=7)
    s.add_argument("--keys", type=int, default=0, help="orderly: message i gets key i %% N")
    s.add_argument("--property", action="append")
    s.add_argument("--linger", type=float, default=0.0)
    s.add_argument("--interval", type=float, default=0.0, help="seconds between sends")
    s.add_argument("--keep-going", action="store_true", help="report a failed send, go on")
    p = sub.add_parser("push")
    p.add_argument("addr")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--expr", default="*")
    p.add_argument("--fail-first", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--stop-file", default="", help="after --expect, run until this file exists")
    p.add_argument("--orderly", action="store_true", help="the client's orderly consumer")
    p.add_argument("--threads", type=int, default=1, help="consume threads")
    q = sub.add_parser("pull")
    q.add_argument("addr")
    q.add_argument("topic")
    q.add_argument("group")
    q.add_argument("--expect", type=int, required=True)
    q.add_argument("--timeout", type=float, default=60.0)
    for sp in (s, p):
        sp.add_argument("--access-key", default="")
        sp.add_argument("--secret-key", default="")
    args = ap.parse_args()
    {"send": cmd_send, "push": cmd_push, "pull": cmd_pull}[args.cmd](args)


if __name__ == "__main__":
    main()

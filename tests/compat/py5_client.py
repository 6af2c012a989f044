"""Drive the official RocketMQ 5 Python client (PyPI ``rocketmq-python-client``) against a
broker; run in the client's own virtualenv by tests/compat/test_grpc_python5.py.

Usage: ``python py5_client.py '<json>'``.  The JSON names the operation and its arguments;
the script prints one JSON document on its last stdout line and exits 0, or prints the error to
stderr and exits 1.  Every wait is bounded by ``timeout`` seconds.

Common arguments: ``endpoint``; ``access_key`` and ``secret_key`` (the client signs every call);
``tls`` (a TLS channel: gRPC's default roots, so the caller names its CA in the environment as
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``).

Operations:

* ``send``: ``messages`` = [{body, tag, keys, properties, group, delay_ms}] -> message ids.
* ``transaction``: one half message, then ``decision`` commit or rollback -> its id.
* ``orphan``: one half message that this process never decides (it prints ``half_sent``);
  the checker answers ``check_answer`` (commit) when the broker asks; the process then stays
  up (its answer is sent in the background) until a line arrives on stdin -> the id and what
  the checker saw.
* ``receive``: a SimpleConsumer of ``group`` receives until ``count`` messages arrived (or the
  timeout), acking each unless ``ack`` is false -> the messages.
* ``push``: a PushConsumer of ``group`` that fails the first delivery of each body in
  ``fail_once``, until ``count`` messages were consumed -> the messages consumed, every call of
  its listener in order (``handled``) and whether the broker made it consume FIFO (``fifo``).
* ``fifo_receive``: a SimpleConsumer of ``group`` that, as a FIFO consumer does, handles each
  received batch in order and leaves the first delivery of each body in ``skip_once`` unacked,
  with the rest of that batch's messages of the same message group, until ``count`` messages
  were acked -> every delivery in order.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from typing import Any

# Imported by name: the txmq venv may hold an unrelated package called ``rocketmq``.
rocketmq: Any = importlib.import_module("rocketmq")
ClientConfiguration = rocketmq.ClientConfiguration
Credentials = rocketmq.Credentials
FilterExpression = rocketmq.FilterExpression
Message = rocketmq.Message
Producer = rocketmq.Producer
SimpleConsumer = rocketmq.SimpleConsumer
TransactionResolution = rocketmq.TransactionResolution


def config(args: dict[str, Any]) -> Any:
    creds = Credentials(args.get("access_key", ""), args.get("secret_key", ""))
    return ClientConfiguration(args["endpoint"], creds, request_timeout=5)


def tls(args: dict[str, Any]) -> bool:
    return bool(args.get("tls", False))


def build(topic: str, spec: dict[str, Any]) -> Any:
    m = Message()
    m.topic = topic
    m.body = spec.get("body", "hello").encode()
    if spec.get("tag"):
        m.tag = spec["tag"]
    if spec.get("keys"):
        m.keys = spec["keys"]
    for k, v in (spec.get("properties") or {}).items():
        m.add_property(k, v)
    if spec.get("group"):
        m.message_group = spec["group"]
    if spec.get("delay_ms"):
        m.delivery_timestamp = int(time.time() * 1000) + int(spec["delay_ms"])
    return m


class Checker(rocketmq.TransactionChecker):  # type: ignore[misc]
    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.seen: list[dict[str, Any]] = []
        self.event = threading.Event()

    def check(self, message: Any) -> Any:
        self.seen.append(
            {
                "message_id": message.message_id,
                "topic": message.topic,
                "body": message.body.decode(),
                "tag": message.tag,
            }
        )
        self.event.set()
        if self.answer == "commit":
            return TransactionResolution.COMMIT
        return TransactionResolution.ROLLBACK


def op_send(args: dict[str, Any]) -> dict[str, Any]:
    producer = Producer(config(args), (args["topic"],), tls_enable=tls(args))
    producer.startup()
    try:
        ids = []
        for spec in args["messages"]:
            receipt = producer.send(build(args["topic"], spec))
            ids.append(receipt.message_id)
        return {"ids": ids}
    finally:
        producer.shutdown()


def op_transaction(args: dict[str, Any]) -> dict[str, Any]:
    checker = Checker("rollback")
    producer = Producer(config(args), (args["topic"],), checker, tls_enable=tls(args))
    producer.startup()
    try:
        tx = producer.begin_transaction()
        receipt = producer.send(build(args["topic"], args.get("message", {})), tx)
        if args["decision"] == "commit":
            tx.commit()
        else:
            tx.rollback()
        return {"id": receipt.message_id, "transaction_id": receipt.transaction_id}
    finally:
        producer.shutdown()


def op_orphan(args: dict[str, Any]) -> dict[str, Any]:
    checker = Checker(args.get("check_answer", "commit"))
    producer = Producer(config(args), (args["topic"],), checker, tls_enable=tls(args))
    producer.startup()
    try:
        tx = producer.begin_transaction()
        receipt = producer.send(build(args["topic"], args.get("message", {})), tx)
        print(json.dumps({"half_sent": receipt.message_id}), flush=True)
        if not checker.event.wait(args.get("timeout", 30)):
            raise TimeoutError("the broker never asked this producer to check the transaction")
        print(json.dumps({"checked": checker.seen[0]["message_id"]}), flush=True)
        # the checker's answer goes out in the background: stay up until told to stop
        done = threading.Event()

        def wait_line() -> None:
            sys.stdin.readline()
            done.set()

        threading.Thread(target=wait_line, daemon=True).start()
        done.wait(args.get("timeout", 30))
        return {"id": receipt.message_id, "checked": checker.seen}
    finally:
        producer.shutdown()


def op_receive(args: dict[str, Any]) -> dict[str, Any]:
    consumer = SimpleConsumer(
        config(args),
        args["group"],
        {args["topic"]: FilterExpression(args.get("filter", "*"))},
        await_duration=args.get("await_s", 3),
        tls_enable=tls(args),
    )
    consumer.startup()
    got: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + args.get("timeout", 30)
        while len(got) < args["count"] and time.monotonic() < deadline:
            for m in consumer.receive(32, args.get("invisible_s", 15)):
                got.append(
                    {
                        "id": m.message_id,
                        "body": m.body.decode(),
                        "tag": m.tag,
                        "keys": sorted(m.keys or []),
                        "properties": dict(m.properties or {}),
                        "group": m.message_group,
                        "attempt": m.delivery_attempt,
                        "born_host": m.born_host,
                        "born_timestamp": m.born_timestamp,
                    }
                )
                if args.get("ack", True):
                    consumer.ack(m)
        return {"messages": got}
    finally:
        consumer.shutdown()


def op_push(args: dict[str, Any]) -> dict[str, Any]:
    """A PushConsumer of ``group``: its listener fails the first delivery of a body listed in
    ``fail_once`` and consumes everything else, until ``count`` messages were consumed."""
    got: list[dict[str, Any]] = []
    handled: list[dict[str, Any]] = []
    failed: set[str] = set()
    done = threading.Event()
    lock = threading.Lock()

    class Listener(rocketmq.MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            body = message.body.decode()
            with lock:
                fail = body in args.get("fail_once", []) and body not in failed
                handled.append({"body": body, "group": message.message_group, "failed": fail})
                if fail:
                    failed.add(body)
                    return rocketmq.ConsumeResult.FAILURE
                got.append({"body": body, "attempt": message.delivery_attempt})
                if len(got) >= args["count"]:
                    done.set()
            return rocketmq.ConsumeResult.SUCCESS

    consumer = rocketmq.PushConsumer(
        config(args),
        args["group"],
        Listener(),
        {args["topic"]: FilterExpression(args.get("filter", "*"))},
        tls_enable=tls(args),
    )
    consumer.startup()
    try:
        done.wait(args.get("timeout", 30))
        with lock:
            # what the broker's settings answer made the consumer do (set when it arrived)
            fifo = getattr(consumer, "_PushConsumer__fifo", None)
            return {"messages": list(got), "handled": list(handled), "fifo": fifo}
    finally:
        consumer.shutdown()


def op_fifo_receive(args: dict[str, Any]) -> dict[str, Any]:
    consumer = SimpleConsumer(
        config(args),
        args["group"],
        {args["topic"]: FilterExpression("*")},
        await_duration=args.get("await_s", 2),
        tls_enable=tls(args),
    )
    consumer.startup()
    log: list[dict[str, Any]] = []
    skipped: set[str] = set()
    acked = 0
    try:
        deadline = time.monotonic() + args.get("timeout", 30)
        while acked < args["count"] and time.monotonic() < deadline:
            held: set[str] = set()  # message groups waiting in this batch
            batch = consumer.receive(args.get("batch", 32), args.get("invisible_s", 15))
            for m in batch:
                body = m.body.decode()
                entry = {"body": body, "group": m.message_group, "attempt": m.delivery_attempt}
                log.append(entry)
                if body in args.get("skip_once", []) and body not in skipped:
                    skipped.add(body)
                    held.add(m.message_group)
                if m.message_group in held:
                    entry["acked"] = False
                    continue
                consumer.ack(m)
                entry["acked"] = True
                acked += 1
        return {"deliveries": log}
    finally:
        consumer.shutdown()


OPS = {
    "push": op_push,
    "fifo_receive": op_fifo_receive,
    "send": op_send,
    "transaction": op_transaction,
    "orphan": op_orphan,
    "receive": op_receive,
}


def main() -> int:
    args = json.loads(sys.argv[1])
    try:
        result = OPS[args["op"]](args)
    except Exception as exc:
        print(f"{args['op']} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

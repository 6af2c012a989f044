"""The official RocketMQ 5 Python client (PyPI ``rocketmq-python-client==5.1.2``) against the
broker's gRPC front end.

The client lives in its own virtualenv, ``build/clients/py5`` (its import name ``rocketmq`` is
also the name of an unrelated PyPI package), made by ``make py5-client``, which ``make test``
runs before pytest.  Each case runs ``tests/compat/py5_client.py`` in that venv as a subprocess
with bounded timeouts.  Without the venv the tests are skipped with the reason, and fail when
the environment variable CI is set.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.stock import run_setup, sdk_messages
from tests.conftest import BrokerThread
from tests.support.unavailable import unavailable
from tests.support.waiting import wait_until_sync
from txmq.client import Message, Producer

pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "build" / "clients" / "py5"
PY5 = VENV / "bin" / "python"
SCRIPT = Path(__file__).resolve().parent / "py5_client.py"
#: Seconds one client run may take.
RUN_TIMEOUT = 60.0


CLIENT = "rocketmq-python-client==5.1.2"
STAMP = VENV / ".installed"


def _client_missing() -> str | None:
    """Install the client if ``make py5-client`` has not (same steps); the reason if it
    cannot be."""
    if not STAMP.exists():
        print(f"installing {CLIENT} into {VENV}", file=sys.stderr)
        err = run_setup([sys.executable, "-m", "venv", "--clear", str(VENV)]) or run_setup(
            [str(PY5), "-m", "pip", "install", "--quiet", CLIENT]
        )
        if err is not None:
            return err
        STAMP.write_text(CLIENT + "\n")
    return run_setup([str(PY5), "-c", "import rocketmq.v5, rocketmq; rocketmq.Producer"])


@pytest.fixture(scope="module")
def py5() -> Path:
    reason = _client_missing()
    if reason is not None:
        unavailable(f"RocketMQ 5 Python client unavailable: {reason}")
    return PY5


@pytest.fixture
def grpc_broker(broker_thread_factory: Callable[..., BrokerThread]) -> Iterator[BrokerThread]:
    yield broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, transaction_check_max=10_000
    )


def endpoint(bt: BrokerThread) -> str:
    assert bt.controller is not None
    return f"127.0.0.1:{bt.controller.grpc_port}"


def _client_run(
    py5: Path, env: dict[str, str] | None, args: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(py5), str(SCRIPT), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env=None if env is None else {**os.environ, **env},
    )


def run(py5: Path, env: dict[str, str] | None = None, **args: Any) -> dict[str, Any]:
    """Run one client operation (``env``: added to the client's environment); its result, or
    a failure with the client's output."""
    proc = _client_run(py5, env, args)
    if proc.returncode != 0:
        pytest.fail(
            f"client {args['op']} exited {proc.returncode}\n--- stderr ---\n"
            f"{proc.stderr[-4000:]}\n--- stdout ---\n{proc.stdout[-2000:]}"
        )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run_refused(py5: Path, env: dict[str, str] | None = None, **args: Any) -> str:
    """Run one client operation that must fail; the error it printed."""
    proc = _client_run(py5, env, args)
    if proc.returncode == 0:
        pytest.fail(f"client {args['op']} succeeded but should have been refused: {proc.stdout}")
    return proc.stderr


def stock_send(
    py5: Path, ep: str, topic: str, *messages: dict[str, Any], **args: Any
) -> dict[str, Any]:
    """The client's ``send`` of ``messages`` to ``topic`` at ``ep`` (``args``: more of its
    arguments, an account's keys say); its result."""
    return run(py5, op="send", endpoint=ep, topic=topic, messages=list(messages), **args)


def stock_receive(
    py5: Path, ep: str, topic: str, group: str, count: int, **args: Any
) -> dict[str, Any]:
    """The client's ``receive`` of up to ``count`` messages of ``topic`` at ``ep`` for ``group``
    (``args``: more of its arguments: a filter, no ack, the invisible time, the timeout); its
    result."""
    return run(py5, op="receive", endpoint=ep, topic=topic, group=group, count=count, **args)


def stock_send_refused(
    py5: Path, ep: str, topic: str, *messages: dict[str, Any], **args: Any
) -> str:
    """:func:`stock_send` that must be refused; the error the client printed."""
    return run_refused(py5, op="send", endpoint=ep, topic=topic, messages=list(messages), **args)


def tx_state(bt: BrokerThread, txid: str) -> str | None:
    def get() -> str | None:
        assert bt.controller is not None
        rec = bt.controller.transactions.records.get(txid)
        return None if rec is None else rec.state.value

    return bt.run(get)  # type: ignore[no-any-return]


def test_send_then_simple_consumer_receives_and_acks(grpc_broker: BrokerThread, py5: Path) -> None:
    ep, topic = endpoint(grpc_broker), "py5-normal"
    sent = stock_send(
        py5,
        ep,
        topic,
        {"body": "one", "tag": "TagA", "keys": "k1", "properties": {"color": "red"}},
        {"body": "two", "tag": "TagB"},
        {"body": "three", "group": "order-1"},
    )
    assert len(sent["ids"]) == 3
    got = stock_receive(py5, ep, topic, "py5-g", 3, timeout=20)
    by_body = {m["body"]: m for m in got["messages"]}
    assert sorted(by_body) == ["one", "three", "two"]
    assert by_body["one"]["tag"] == "TagA" and by_body["one"]["keys"] == ["k1"]
    assert by_body["one"]["properties"] == {"color": "red"}
    assert by_body["three"]["group"] == "order-1"
    assert {m["id"] for m in got["messages"]} == set(sent["ids"])
    # acked: the committed offsets cover every message, and nothing comes again
    again = stock_receive(py5, ep, topic, "py5-g", 1, timeout=2)
    assert again["messages"] == []

    def committed() -> int:
        assert grpc_broker.controller is not None
        return sum(grpc_broker.controller.offsets.offsets("py5-g", topic).values())

    assert grpc_broker.run(committed) == 3


def test_tag_filter_and_unacked_message_comes_back(grpc_broker: BrokerThread, py5: Path) -> None:
    ep, topic = endpoint(grpc_broker), "py5-redeliver"
    stock_send(py5, ep, topic, {"body": "a", "tag": "X"}, {"body": "b", "tag": "Y"})
    first = stock_receive(
        py5, ep, topic, "g-re", 1, filter="Y", ack=False, invisible_s=1, timeout=10
    )
    assert [m["body"] for m in first["messages"]] == ["b"]
    second = stock_receive(py5, ep, topic, "g-re", 1, filter="Y", invisible_s=5, timeout=15)
    assert [(m["body"], m["attempt"]) for m in second["messages"]] == [("b", 2)]


def test_transaction_commit_and_rollback(grpc_broker: BrokerThread, py5: Path) -> None:
    ep, topic = endpoint(grpc_broker), "py5-tx"
    committed = run(
        py5, op="transaction", endpoint=ep, topic=topic, decision="commit", message={"body": "yes"}
    )
    rolled = run(
        py5, op="transaction", endpoint=ep, topic=topic, decision="rollback", message={"body": "no"}
    )
    assert tx_state(grpc_broker, committed["transaction_id"]) == "COMMITTED"
    assert tx_state(grpc_broker, rolled["transaction_id"]) == "ROLLED_BACK"
    got = stock_receive(py5, ep, topic, "g-tx", 2, timeout=4)
    assert [m["body"] for m in got["messages"]] == ["yes"]
    # and the committed message reaches a remoting consumer too
    assert [m.body for m in sdk_messages(grpc_broker.address, topic)] == [b"yes"]


def test_orphaned_half_is_resolved_by_check_back(grpc_broker: BrokerThread, py5: Path) -> None:
    ep, topic = endpoint(grpc_broker), "py5-orphan"
    args = {
        "op": "orphan",
        "endpoint": ep,
        "topic": topic,
        "timeout": 40,
        "check_answer": "commit",
        "message": {"body": "orphan", "tag": "O"},
    }
    proc = subprocess.Popen(
        [str(py5), str(SCRIPT), json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        stdout, stderr = proc.stdout, proc.stderr
        lines: list[str] = []

        def line() -> str:
            ready, _, _ = select.select([stdout], [], [], 0.1)
            if ready:
                text = stdout.readline()
                if text:
                    lines.append(text)
                    return text
            if proc.poll() is not None:
                pytest.fail(f"orphan client exited {proc.returncode}: {stderr.read()[-4000:]}")
            return ""

        half = json.loads(wait_until_sync(line, 30, "the half message to be sent"))["half_sent"]
        # The producer never decides; the broker's check makes its checker commit.
        wait_until_sync(
            lambda: tx_state(grpc_broker, half) == "COMMITTED", 30, "the check-back commit"
        )
        proc.stdin.write("done\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-4000:]
        result = json.loads(out.strip().splitlines()[-1])
        assert result["checked"][0]["message_id"] == half
        assert result["checked"][0]["body"] == "orphan"

        def record() -> Any:
            assert grpc_broker.controller is not None
            return grpc_broker.controller.transactions.records[half]

        rec = grpc_broker.run(record)
        assert rec.decided_by == "check" and rec.check_times >= 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    bodies = [m.body for m in sdk_messages(grpc_broker.address, topic)]
    assert bodies == [b"orphan"]


def test_grpc_producer_to_txmq_sdk_consumer(grpc_broker: BrokerThread, py5: Path) -> None:
    ep, topic = endpoint(grpc_broker), "py5-to-sdk"
    sent = stock_send(
        py5, ep, topic, {"body": "cross", "tag": "T1", "keys": "key-1", "properties": {"p": "v"}}
    )
    [m] = sdk_messages(grpc_broker.address, topic)
    assert m.body == b"cross" and m.tags == "T1" and m.keys == "key-1"
    assert m.user_properties == {"p": "v"}
    assert m.msg_id == sent["ids"][0]
    assert m.born_timestamp > 0 and m.born_host[0]


def test_txmq_sdk_producer_to_grpc_consumer(grpc_broker: BrokerThread, py5: Path) -> None:
    topic = "sdk-to-py5"
    with Producer("sdk-producer", broker=grpc_broker.address) as p:
        r = p.send(Message(topic, b"from-sdk", tags="S", keys="sk", properties={"x": "1"}))
    got = stock_receive(py5, endpoint(grpc_broker), topic, "g-x", 1, timeout=20)
    [m] = got["messages"]
    assert m["body"] == "from-sdk" and m["tag"] == "S" and m["keys"] == ["sk"]
    assert m["properties"] == {"x": "1"}
    assert m["id"] == r.msg_id


def test_push_consumer_consumes_and_retries_a_failure(grpc_broker: BrokerThread, py5: Path) -> None:
    ep, topic = endpoint(grpc_broker), "py5-push"
    stock_send(py5, ep, topic, {"body": "p1"}, {"body": "p2"})
    got = run(
        py5,
        op="push",
        endpoint=ep,
        topic=topic,
        group="g-push",
        count=2,
        fail_once=["p2"],
        timeout=40,
    )
    attempts = {m["body"]: m["attempt"] for m in got["messages"]}
    assert attempts["p1"] == 1
    assert attempts["p2"] == 2  # failed once, delivered again

    def committed() -> int:
        assert grpc_broker.controller is not None
        return sum(grpc_broker.controller.offsets.offsets("g-push", topic).values())

    wait_until_sync(lambda: grpc_broker.run(committed) == 2, 10, "both messages acked")

"""``-o json`` on the commands that change things, each run as ``txmq`` in a process of its own
against a real broker: what they print parses as JSON and says what happened, and the broker
holds what the JSON says."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.support.acl_files import acl2_with_root
from tests.support.raw import RawClient, connected
from txmq.broker.server import BrokerController
from txmq.protocol.acl import Credentials
from txmq.protocol.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.external

ROOT_DIR = Path(__file__).resolve().parents[2]
ROOT = Credentials("root-user", "root-secret-123")


def txmq(
    address: str, *args: str, input: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``txmq ARGS`` against the broker at ``address``, in a process of its own (the broker
    runs in this one, and its log lines must not mix with what the command prints)."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT_DIR), environ.get("PYTHONPATH", "")])
    environ["TXMQ_BROKER"] = address
    for key in ("TXMQ_ACCESS_KEY", "TXMQ_SECRET_KEY", "TXMQ_ACL_PASSWORD"):
        environ.pop(key, None)
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "txmq", *args],
        env=environ,
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # no terminal: a password asked for is read from stdin
    )


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    """What a command printed, parsed: it must have succeeded and printed JSON only."""
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_topic_create_and_delete(broker_thread: BrokerController) -> None:
    addr = broker_thread.address
    created = as_json(txmq(addr, "topic", "create", "jt", "-q", "3", "-o", "json"))
    assert created["readQueueNums"] == created["writeQueueNums"] == 3
    assert created["perm"] == 6
    assert broker_thread.ctx.topics.get("jt") is not None
    # the question goes to stderr: stdout holds only the JSON
    deleted = txmq(addr, "topic", "delete", "jt", "-o", "json", input="y\n")
    assert "delete topic jt" in deleted.stderr
    assert as_json(deleted) == {"topic": "jt", "deleted": True, "brokerGroups": []}
    assert broker_thread.ctx.topics.get("jt") is None
    # the table stays as it was
    assert txmq(addr, "topic", "create", "jt2").stdout == "topic jt2 created with 4 queues\n"


def test_group_delete(broker_thread: BrokerController) -> None:
    addr = broker_thread.address

    async def commit_offset() -> None:
        async with connected(addr) as c:
            resp = await c.call(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "jg", "topic": "jgt", "queueId": 0, "commitOffset": 1},
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark

    as_json(txmq(addr, "topic", "create", "jgt", "-o", "json"))
    asyncio.run(commit_offset())
    assert broker_thread.offsets.offsets("jg", "jgt") == {0: 1}
    doc = as_json(txmq(addr, "group", "delete", "jg", "--yes", "-o", "json"))
    assert doc == {"group": "jg", "deleted": True, "brokerGroups": []}
    assert broker_thread.offsets.offsets("jg", "jgt") == {}


def test_txn_resume_commit_and_rollback(broker_thread: BrokerController) -> None:
    addr = broker_thread.address
    as_json(txmq(addr, "topic", "create", "jtx", "-o", "json"))

    async def halves() -> None:
        async with connected(addr) as c:
            for body in (b"a", b"b"):
                RawClient.send_header(await c.send("jtx", body, group="jp", transactional=True))

    asyncio.run(halves())
    pending = as_json(txmq(addr, "txn", "list", "--group", "jp", "-o", "json"))
    first, second = (r["transactionId"] for r in pending)

    resumed = as_json(txmq(addr, "txn", "resume", first, "-o", "json"))
    assert "under checking again" in resumed["answer"]
    assert resumed["transaction"]["transactionId"] == first
    assert resumed["transaction"]["state"] == "PENDING"

    committed = as_json(txmq(addr, "txn", "commit", first, "--reason", "ok", "-o", "json"))
    assert committed["transaction"]["state"] == "COMMITTED", committed
    assert committed["answer"]
    rolled_back = as_json(txmq(addr, "txn", "rollback", second, "-o", "json"))
    assert rolled_back["transaction"]["transactionId"] == second
    assert rolled_back["transaction"]["state"] == "ROLLED_BACK", rolled_back

    # a refused decision is an error, not JSON
    again = txmq(addr, "txn", "commit", second, "-o", "json")
    assert again.returncode == 1 and again.stdout == ""


@pytest.fixture
def acl_broker(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(**acl2_with_root(ROOT.access_key, ROOT.secret_key))


def test_acl_users_and_policies(acl_broker: BrokerThread) -> None:
    assert acl_broker.controller is not None
    addr = acl_broker.controller.address
    root = {"TXMQ_ACCESS_KEY": ROOT.access_key, "TXMQ_SECRET_KEY": ROOT.secret_key}

    def run(*args: str, password: str = "") -> Any:
        env = dict(root, TXMQ_ACL_PASSWORD=password) if password else root
        return as_json(txmq(addr, "acl", *args, "-o", "json", env=env))

    user = run("user", "create", "alice", password="alice-secret-1")
    assert user["username"] == "alice" and user["userType"] == "Normal"
    assert "password" not in user
    user = run("user", "update", "alice", "--disable")
    assert user["username"] == "alice" and user["userStatus"].lower() == "disable", user

    acl = run("policy", "create", "alice", "-r", "Topic:orders", "-a", "Pub", "-a", "Sub")
    assert acl["subject"] == "User:alice"
    (entry,) = [e for p in acl["policies"] for e in p["entries"]]
    assert entry["resource"] == "Topic:orders" and entry["decision"] == "Allow"
    assert sorted(entry["actions"]) == ["Pub", "Sub"]

    deleted = run("policy", "delete", "alice", "-r", "Topic:orders")
    assert deleted == {
        "subject": "User:alice",
        "resource": "Topic:orders",
        "policyType": None,
        "deleted": True,
    }
    assert run("policy", "list") == []
    assert run("user", "delete", "alice") == {"username": "alice", "deleted": True}
    assert [u["username"] for u in run("user", "list")] == [ROOT.access_key]

    # a password asked for is asked on stderr: stdout holds only the JSON
    asked = txmq(addr, "acl", "user", "create", "bob", "-o", "json", input="bob-1\n", env=root)
    assert "Password" in asked.stderr
    assert as_json(asked)["username"] == "bob"
    assert sorted(u["username"] for u in run("user", "list")) == ["bob", ROOT.access_key]

"""``txmq acl``, run as a subprocess against a real broker with ACL 2.0 on: users and policies
created, listed and deleted, each change deciding the next signed send; and ``txmq acl migrate``
turning a real plain_acl.yml into users and policies that allow and refuse what the file did."""

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
from tests.support.acl_files import account, acl2_with_root, acl_file, write_acl
from tests.support.raw import connected
from txmq.protocol.acl import Credentials
from txmq.protocol.codes import ResponseCode

pytestmark = pytest.mark.external

ROOT_DIR = Path(__file__).resolve().parents[2]
ROOT = Credentials("root-user", "root-secret-123")

PLAIN_ACL = acl_file(
    account(
        "shop-producer", "shop-secret-1", topics=("orders=PUB", "audit=DENY"), groups=("shop=PUB",)
    ),
    account(
        "billing-reader",
        "billing-secret-1",
        defaultTopicPerm="SUB",
        topics=("orders=SUB", "payroll=DENY"),
        groups=("billing=SUB",),
    ),
    account("operator", "operator-secret-1", admin=True),
    account(
        "faraway",
        "faraway-secret-1",
        whiteRemoteAddress="10.20.30.*",
        admin=True,
        topics=("orders=PUB",),
    ),
    account("newsdesk", "newsdesk-secret-1", defaultTopicPerm="SUB", topics=("news=PUB",)),
    white_listed=True,
)


@pytest.fixture
def bt(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(**acl2_with_root(ROOT.access_key, ROOT.secret_key))


def address(bt: BrokerThread) -> str:
    assert bt.controller is not None
    return bt.controller.address


def txmq(
    bt: BrokerThread, *args: str, who: Credentials = ROOT, password: str = ""
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT_DIR), env.get("PYTHONPATH", "")])
    env["TXMQ_ACCESS_KEY"], env["TXMQ_SECRET_KEY"] = who.access_key, who.secret_key
    env["TXMQ_BROKER"] = address(bt)
    env.pop("TXMQ_ACL_PASSWORD", None)
    if password:
        env["TXMQ_ACL_PASSWORD"] = password
    return subprocess.run(
        [sys.executable, "-m", "txmq", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def send(bt: BrokerThread, who: Credentials, topic: str, group: str = "g") -> int:
    async def go() -> int:
        async with connected(address(bt), credentials=who) as c:
            return (await c.send(topic, b"x", group=group, transactional=group != "g")).code

    return asyncio.run(go())


def pull(bt: BrokerThread, who: Credentials, topic: str, group: str) -> int:
    async def go() -> int:
        async with connected(address(bt), credentials=who) as c:
            resp, _ = await c.pull(topic, group=group)
            return resp.code

    return asyncio.run(go())


def create_topics(bt: BrokerThread, *topics: str) -> None:
    for t in topics:
        ok(txmq(bt, "topic", "create", t))


def test_cli_manages_users_and_policies(bt: BrokerThread) -> None:
    alice = Credentials("alice", "alice-secret-1")
    create_topics(bt, "orders")
    out = ok(txmq(bt, "acl", "user", "create", "alice", password=alice.secret_key))
    assert "created user alice" in out
    assert send(bt, alice, "orders") == ResponseCode.NO_PERMISSION  # no policy yet
    ok(txmq(bt, "acl", "policy", "create", "alice", "-r", "Topic:ord*", "-a", "Pub"))
    assert send(bt, alice, "orders") == ResponseCode.SUCCESS
    users = json.loads(ok(txmq(bt, "acl", "user", "list", "-o", "json")))
    assert {u["username"]: u["userType"] for u in users} == {
        "alice": "Normal",
        "root-user": "Super",
    }
    table = ok(txmq(bt, "acl", "policy", "list", "--user", "alice"))
    assert "User:alice" in table and "Topic:ord*" in table and "Allow" in table
    # alice may not manage users
    refused = txmq(bt, "acl", "user", "create", "eve", password="eve-secret-1", who=alice)
    assert refused.returncode == 1
    assert "NoPermissionError" in refused.stderr and "Cluster" in refused.stderr
    # a Deny of the literal topic beats the prefix
    ok(
        txmq(
            bt, "acl", "policy", "create", "alice", "-r", "Topic:orders", "-a", "All",
            "--decision", "Deny",
        )
    )  # fmt: skip
    assert send(bt, alice, "orders") == ResponseCode.NO_PERMISSION
    ok(txmq(bt, "acl", "policy", "delete", "alice", "-r", "Topic:orders"))
    assert send(bt, alice, "orders") == ResponseCode.SUCCESS
    ok(txmq(bt, "acl", "user", "update", "alice", "--disable"))
    assert send(bt, alice, "orders") == ResponseCode.NO_PERMISSION
    ok(txmq(bt, "acl", "user", "delete", "alice"))
    users = json.loads(ok(txmq(bt, "acl", "user", "list", "-o", "json")))
    assert [u["username"] for u in users] == ["root-user"]
    assert json.loads(ok(txmq(bt, "acl", "policy", "list", "-o", "json"))) == []


def test_migrate_a_plain_acl_file(bt: BrokerThread, tmp_path: Path) -> None:
    path = write_acl(tmp_path, PLAIN_ACL)
    create_topics(bt, "orders", "audit", "payroll", "news")

    dry = txmq(bt, "acl", "migrate", "--from", str(path), "--dry-run")
    plan = json.loads(ok(dry))
    assert [p["user"]["username"] for p in plan] == [
        "shop-producer",
        "billing-reader",
        "operator",
        "faraway",
        "newsdesk",
    ]
    assert all("password" not in p["user"] for p in plan)
    assert plan[2]["user"]["userType"] == "Super" and plan[2]["acl"] is None
    # an admin bound to addresses is no super user: super users are checked nowhere
    assert plan[3]["user"]["userType"] == "Normal"
    assert dry.stderr.strip().splitlines() == [
        f"warning: {who}: Topic:{topic}: ACL 1.0 allowed PUB only; the Default policy now also "
        "allows SUB"
        for who, topic in (("faraway", "orders"), ("newsdesk", "news"))
    ]
    users = json.loads(ok(txmq(bt, "acl", "user", "list", "-o", "json")))
    assert [u["username"] for u in users] == ["root-user"]  # a dry run changes nothing

    rows = json.loads(ok(txmq(bt, "acl", "migrate", "--from", str(path), "-o", "json")))
    assert [r["result"] for r in rows] == ["created"] * 5
    rows = json.loads(ok(txmq(bt, "acl", "migrate", "--from", str(path), "-o", "json")))
    assert [r["result"] for r in rows] == ["exists"] * 5

    producer = Credentials("shop-producer", "shop-secret-1")
    reader = Credentials("billing-reader", "billing-secret-1")
    operator = Credentials("operator", "operator-secret-1")
    faraway = Credentials("faraway", "faraway-secret-1")
    no = ResponseCode.NO_PERMISSION
    assert send(bt, producer, "orders") == ResponseCode.SUCCESS
    assert send(bt, producer, "orders", group="shop") == ResponseCode.SUCCESS  # a half
    assert send(bt, producer, "orders", group="other-shop") == no
    assert send(bt, producer, "audit") == no
    assert send(bt, producer, "news") == no  # defaultTopicPerm DENY
    assert pull(bt, reader, "orders", "billing") != no
    assert pull(bt, reader, "news", "billing") != no  # defaultTopicPerm SUB
    assert pull(bt, reader, "payroll", "billing") == no
    assert pull(bt, reader, "orders", "other") == no  # defaultGroupPerm DENY
    assert send(bt, reader, "orders") == no
    assert send(bt, operator, "payroll") == ResponseCode.SUCCESS  # admin: a super user
    assert send(bt, faraway, "orders") == no  # only from 10.20.30.*
    assert send(bt, faraway, "payroll") == no  # its admin rights too

    acls: Any = json.loads(ok(txmq(bt, "acl", "policy", "list", "--user", "faraway", "-o", "json")))
    entries = {p["policyType"]: p["entries"] for p in acls[0]["policies"]}
    assert entries == {
        "Custom": [
            {
                "resource": "Topic:orders",
                "actions": ["Pub"],
                "sourceIps": ["10.20.30.*"],
                "decision": "Allow",
            }
        ],
        "Default": [
            {"resource": "*", "actions": ["All"], "sourceIps": ["10.20.30.*"], "decision": "Allow"}
        ],
    }

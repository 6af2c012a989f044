"""ACL 2.0 (RocketMQ 5.3's users and policies) on the remoting port: a real broker with
``authenticationEnabled`` and ``authorizationEnabled``, users and policies created over remoting
by the initial super user, then signed sends and pulls allowed or refused as the policies say
(the most specific entry decides, Deny wins a tie, Default only when Custom has nothing), the
user and policy requests themselves guarded, and everything still in force after a restart."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.acl_files import acl2_with_root, write_acl
from tests.support.brokers import started
from tests.support.raw import RawClient, connected
from txmq.broker.auth2 import Acl, PolicyEntry, Resource, decide
from txmq.broker.config import BrokerConfig, ConfigError
from txmq.broker.server import BrokerController
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.acl import Credentials
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import BrokerSystemError, NoPermissionError

ROOT = Credentials("root-user", "root-secret-123")
ALICE = Credentials("alice", "alice-secret-1")
BOB = Credentials("bob-user", "bob-secret-12")

SETTINGS: dict[str, Any] = acl2_with_root(ROOT.access_key, ROOT.secret_key)


def admin(broker: BrokerController, who: Credentials = ROOT) -> AsyncAdminClient:
    return AsyncAdminClient(broker.address, access_key=who.access_key, secret_key=who.secret_key)


def entry(resource: str, actions: list[str], decision: str = "Allow", ips: Any = ()) -> Any:
    return {"resource": resource, "actions": actions, "sourceIps": list(ips), "decision": decision}


@pytest.fixture
async def auth_broker(
    make_broker_config: Callable[..., BrokerConfig],
) -> AsyncIterator[BrokerController]:
    async with started(make_broker_config(**SETTINGS)) as b:
        yield b


async def setup_users(broker: BrokerController) -> None:
    async with admin(broker) as a:
        await a.create_topic("orders")
        await a.create_topic("order-audit")
        await a.create_topic("secret")
        await a.create_user(ALICE.access_key, ALICE.secret_key)
        await a.create_user(BOB.access_key, BOB.secret_key)
        await a.create_acl(
            f"User:{ALICE.access_key}",
            [
                {
                    "policyType": "Custom",
                    "entries": [
                        entry("Topic:order*", ["Pub"]),
                        entry("Topic:order-audit", ["Pub"], "Deny"),
                        entry("Topic:orders", ["Sub"]),
                        entry("Group:billing", ["Sub"]),
                        entry("Group:shop", ["Pub"]),
                    ],
                },
                {"policyType": "Default", "entries": [entry("Topic:*", ["Sub"])]},
            ],
        )
        await a.update_acl(
            f"User:{ALICE.access_key}",
            [{"policyType": "Custom", "entries": [entry("Topic:secret", ["All"], "Deny")]}],
        )


async def send_code(broker: BrokerController, who: Credentials | None, topic: str) -> int:
    async with connected(broker.address, credentials=who) as c:
        return (await c.send(topic, b"x")).code


async def pull_code(broker: BrokerController, who: Credentials, topic: str, group: str) -> int:
    async with connected(broker.address, credentials=who) as c:
        resp, _ = await c.pull(topic, group=group)
        return resp.code


async def check_policies(broker: BrokerController) -> None:
    ok, denied = ResponseCode.SUCCESS, ResponseCode.NO_PERMISSION
    assert await send_code(broker, ALICE, "orders") == ok  # prefix Topic:order*
    assert await send_code(broker, ALICE, "order-audit") == denied  # literal Deny beats prefix
    assert await send_code(broker, ALICE, "secret") == denied  # nothing allows Pub
    assert await send_code(broker, BOB, "orders") == denied  # no policies at all
    assert await send_code(broker, ROOT, "secret") == ok  # a super user
    assert await pull_code(broker, ALICE, "orders", "billing") != denied
    assert await pull_code(broker, ALICE, "orders", "other-group") == denied
    # Sub on Topic:order-audit comes from the Default policy (Custom has no Sub entry for it)
    assert await pull_code(broker, ALICE, "order-audit", "billing") != denied
    # ... but not on secret, where the Custom Deny of All matches first
    assert await pull_code(broker, ALICE, "secret", "billing") == denied


async def test_policies_decide_sends_and_pulls(auth_broker: BrokerController) -> None:
    await setup_users(auth_broker)
    await check_policies(auth_broker)
    # unsigned, unknown user, wrong password
    assert await send_code(auth_broker, None, "orders") == ResponseCode.NO_PERMISSION
    async with connected(auth_broker.address, credentials=Credentials("alice", "wrong-1")) as c:
        resp = await c.send("orders", b"x")
    assert resp.code == ResponseCode.NO_PERMISSION
    assert "bad signature" in (resp.remark or "")
    async with connected(auth_broker.address, credentials=ALICE) as c:
        resp = await c.send("order-audit", b"x")
    assert "User:alice has no permission to Pub Topic:order-audit" in (resp.remark or "")
    assert "denied by Topic:order-audit" in (resp.remark or "")


async def test_user_and_policy_requests(auth_broker: BrokerController) -> None:
    await setup_users(auth_broker)
    async with admin(auth_broker) as a:
        users = {u["username"]: u for u in await a.list_users()}
        assert set(users) == {"root-user", "alice", "bob-user"}
        assert users["root-user"]["userType"] == "Super"
        assert all("password" not in u for u in users.values())
        assert await a.get_user("nobody") is None
        acl = await a.get_acl("User:alice")
        assert acl is not None
        custom = next(p for p in acl["policies"] if p["policyType"] == "Custom")
        assert {e["resource"] for e in custom["entries"]} >= {"Topic:order*", "Topic:secret"}
        assert [x["subject"] for x in await a.list_acls(resource_filter="Group:shop")] == [
            "User:alice"
        ]
        with pytest.raises(NoPermissionError, match="The user is existed"):
            await a.create_user("alice", "another-one")
        with pytest.raises(NoPermissionError, match="not exist"):
            await a.create_acl("User:ghost", [{"entries": [entry("Topic:x", ["Pub"])]}])
        # deleting one entry takes its permission away at once
        await a.delete_acl("User:alice", resource="Topic:order*")
    assert await send_code(auth_broker, ALICE, "orders") == ResponseCode.NO_PERMISSION
    # a normal user may not manage users without Update on the cluster ...
    async with admin(auth_broker, ALICE) as a:
        with pytest.raises(NoPermissionError, match="Update Cluster:DefaultCluster"):
            await a.create_user("carol", "carol-secret")
    async with admin(auth_broker) as a:
        await a.create_acl("User:alice", [{"entries": [entry("Cluster:*", ["Update", "Get"])]}])
    # ... and with it, still not create or change a super user
    async with admin(auth_broker, ALICE) as a:
        with pytest.raises(NoPermissionError, match="super user"):
            await a.create_user("carol", "carol-secret", super_user=True)
        with pytest.raises(NoPermissionError, match="super user"):
            await a.update_user("root-user", password="taken-over")
        await a.create_user("carol", "carol-secret")
    # a disabled user is refused; a deleted user too
    async with admin(auth_broker) as a:
        await a.update_user("alice", enabled=False)
    assert await send_code(auth_broker, ALICE, "secret") == ResponseCode.NO_PERMISSION
    async with admin(auth_broker) as a:
        await a.delete_user("bob-user")
        assert await a.get_user("bob-user") is None
    async with connected(auth_broker.address, credentials=BOB) as c:
        resp = await c.call(RequestCode.GET_MAX_OFFSET, {"topic": "orders", "queueId": 0})
    assert resp.remark == "ACL: unknown AccessKey 'bob-user'"


async def test_users_and_policies_survive_a_restart(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    config = make_broker_config(**SETTINGS)
    async with started(config) as b:
        await setup_users(b)
    # no initial user this time: everything comes from the store
    async with started(config.replace(init_authentication_user="")) as b:
        await check_policies(b)
    stored = Path(config.store_path_root_dir) / "config" / "auth.json"
    doc = json.loads(stored.read_text(encoding="utf-8"))
    assert {u["username"] for u in doc["state"]["users"]} == {"root-user", "alice", "bob-user"}
    # a file altered behind the broker's back fails its checksum: the backup (the state before
    # the last change, the policy update) is read instead
    doc["state"]["users"][0]["userType"] = "Super"
    stored.write_text(json.dumps(doc), encoding="utf-8")
    async with started(config) as b:
        assert not b.acl.state.users["alice"].super  # type: ignore[union-attr]
        async with admin(b) as a:
            acl = await a.get_acl("User:alice")
        assert acl is not None
        assert "Topic:secret" not in json.dumps(acl)  # the last change was lost with the file
    # the damaged file was set aside and the state written again, the backup left as it was
    assert [p.name.split("-")[0] for p in stored.parent.glob("auth.json.damaged-*")] == [
        "auth.json.damaged"
    ]
    assert "Topic:secret" not in stored.read_text(encoding="utf-8")
    # with the backup damaged too, the broker does not start
    Path(str(stored) + ".bak").write_text("{}", encoding="utf-8")
    stored.write_text("{", encoding="utf-8")
    with pytest.raises(ConfigError, match="auth.json"):
        await BrokerController(config).start()


async def test_auth_requests_say_acl2_is_off(broker: BrokerController) -> None:
    async with AsyncAdminClient(broker.address) as a:
        with pytest.raises(BrokerSystemError, match="authenticationEnabled"):
            await a.list_users()


def test_config_switches() -> None:
    with pytest.raises(ConfigError, match="needs authenticationEnabled"):
        BrokerConfig(authorization_enabled=True)
    with pytest.raises(ConfigError, match="cannot both be on"):
        BrokerConfig(acl_enable=True, authentication_enabled=True)


def test_the_most_specific_entry_decides_and_deny_wins_a_tie() -> None:
    def e(resource: str, decision: str = "Allow", ips: Any = ()) -> PolicyEntry:
        return PolicyEntry.from_info(entry(resource, ["Pub"], decision, ips))

    acl: Acl = {
        "Custom": (
            e("*", "Deny"),
            e("Topic:*"),
            e("Topic:ord*", "Deny"),
            e("Topic:order*"),
            e("Topic:orders", "Deny"),
            e("Topic:orders"),
            e("Topic:lan", ips=["10.0.0.0/8"]),
        )
    }

    def winner(kind: str, name: str, action: str = "Pub", host: str = "1.2.3.4") -> str:
        found = decide(acl, kind, name, [action], host)
        return "none" if found is None else f"{found.decision} {found.resource.key}"

    assert winner("Topic", "orders") == "Deny Topic:orders"  # a tie: Deny wins
    assert winner("Topic", "order-2") == "Allow Topic:order*"  # the longer prefix
    assert winner("Topic", "ordinal") == "Deny Topic:ord*"
    assert winner("Topic", "other") == "Allow Topic:*"  # a type's every name before anything
    assert winner("Group", "g") == "Deny *"
    assert winner("Topic", "other", "Sub") == "none"
    assert winner("Topic", "lan", host="10.1.2.3") == "Allow Topic:lan"
    assert winner("Topic", "lan", host="192.168.1.1") == "Allow Topic:*"  # not from there
    # the Default policy is asked only when no Custom entry matches
    two: Acl = {"Custom": (e("Topic:a", "Deny"),), "Default": (e("Topic:*"),)}
    assert decide(two, "Topic", "a", ["Pub"], "h") == two["Custom"][0]
    assert decide(two, "Topic", "b", ["Pub"], "h") == two["Default"][0]
    assert Resource.parse("topic:x*") == Resource("Topic", "x", "prefixed")


async def test_every_request_code_is_decided_as_acl1_decided_it_after_migration(
    auth_broker: BrokerController, tmp_path: Path
) -> None:
    """test_acl.py's file, migrated to users and policies, allows and refuses every request
    code as ACL 1.0 did (the user and policy requests themselves are covered above)."""
    from tests.broker import test_acl as v1
    from txmq.broker.auth2 import migrate_plain_acl

    path = write_acl(tmp_path, v1.ACL_FILE)
    async with admin(auth_broker) as a:
        for m in migrate_plain_acl(str(path)):
            assert not m.notes
            name = m.user["username"]
            await a.create_user(name, m.user["password"], super_user=m.user["userType"] == "Super")
            if m.acl is not None:
                await a.create_acl(m.acl["subject"], m.acl["policies"])
    auth_codes = {c for c in RequestCode if 3001 <= c <= 3010}
    table = [c for c in await v1.cases(auth_broker) if c.code not in auth_codes]
    assert {c.code for c in table} | auth_codes == set(auth_broker._processors)
    clients = {
        cred.access_key: await RawClient.connect(auth_broker.address, credentials=cred)
        for cred in (v1.P, v1.B, v1.C, v1.ADMIN)
    }
    try:
        for case in table:
            await v1.answered_as_the_file_says(case, clients)
    finally:
        for client in clients.values():
            await client.close()


async def test_malformed_user_and_policy_requests_are_answered_and_change_nothing(
    auth_broker: BrokerController,
) -> None:
    await setup_users(auth_broker)
    R = RequestCode
    bad: list[tuple[int, dict[str, Any], bytes]] = [
        (R.AUTH_CREATE_USER, {"username": "x"}, b"not json"),
        (R.AUTH_CREATE_USER, {"username": "x"}, b"[]"),
        (R.AUTH_CREATE_USER, {"username": "x"}, b'{"password": ""}'),
        (R.AUTH_CREATE_USER, {"username": "x"}, b'{"password": "p", "userType": "Root"}'),
        (R.AUTH_CREATE_USER, {}, b'{"password": "p"}'),
        (R.AUTH_CREATE_ACL, {"subject": "User:alice"}, b"{}"),
        (R.AUTH_CREATE_ACL, {"subject": "alice"}, b'{"policies": [{"entries": []}]}'),
        (R.AUTH_CREATE_ACL, {"subject": "User:alice"}, b'{"policies": [{"entries": [5]}]}'),
        *(
            (
                R.AUTH_CREATE_ACL,
                {"subject": "User:alice"},
                json.dumps({"policies": [{"entries": [e]}]}).encode(),
            )
            for e in (
                entry("Queue:q", ["Pub"]),
                entry("Topic:", ["Pub"]),
                entry("Topic:t", []),
                entry("Topic:t", ["Publish"]),
                entry("Topic:t", ["Pub"], "Maybe"),
                entry("Topic:t", ["Pub"], ips=["not-an-address"]),
                {"resource": "Topic:t", "actions": "Pub", "decision": "Allow"},
            )
        ),
        (R.AUTH_DELETE_ACL, {"subject": "User:alice", "resource": "Nothing"}, b""),
        (R.AUTH_GET_ACL, {"subject": "Group:g"}, b""),
    ]
    before = json.dumps(auth_broker.acl.state.to_json())  # type: ignore[union-attr]
    async with connected(auth_broker.address, credentials=ROOT) as c:
        for code, ext, body in bad:
            resp = await c.call(code, ext, body)
            assert resp.code == ResponseCode.INVALID_PARAMETER, (code, ext, body, resp)
    assert json.dumps(auth_broker.acl.state.to_json()) == before  # type: ignore[union-attr]
    await check_policies(auth_broker)

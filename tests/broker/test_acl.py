"""ACL 1.0 (plain access) on the remoting port: a real broker, a real plain_acl.yml, signed
requests over TCP.  Every request code the broker serves is allowed or refused as the file says;
forged signatures, unknown keys and forbidden addresses are refused; one account cannot decide
or be asked about another account's transaction; the file is re-read without a restart."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import acl_files
from tests.support.acl_files import account, write_acl
from tests.support.brokers import started
from tests.support.raw import RawClient, connected, end_header
from tests.support.waiting import wait_until
from txmq.broker.acl import AclConfigError, AddressPattern, parse_acl_document
from txmq.broker.config import BrokerConfig, ConfigError
from txmq.broker.server import BrokerController
from txmq.protocol.acl import SIGNATURE, Credentials, calc_signature, signed_content
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    CreateTopicRequestHeader,
    DecideBatchRequestHeader,
    ForceDecideRequestHeader,
    SendMessageRequestHeader,
)
from txmq.protocol.message import (
    MessageConst,
    UniqIdGenerator,
    encode_batch,
    properties_to_string,
)

ACL_FILE = acl_files.acl_file(
    account(
        "producerA",
        "secret-a-123",
        defaultTopicPerm="DENY",
        defaultGroupPerm="DENY",
        topics=("orders=PUB",),
        groups=("groupA=PUB",),
    ),
    account("producerB", "secret-b-123", topics=("orders=PUB",), groups=("groupB=PUB",)),
    account(
        "consumerC",
        "secret-c-123",
        defaultTopicPerm="DENY",
        topics=("orders=SUB", "hidden=DENY"),
        groups=("cgroup=SUB",),
    ),
    account("operator", "secret-op-123", admin=True),
    account("elsewhere", "secret-e-123", whiteRemoteAddress="10.20.30.*", admin=True),
    white_listed=True,
)

P = Credentials("producerA", "secret-a-123")
B = Credentials("producerB", "secret-b-123")
C = Credentials("consumerC", "secret-c-123")
ADMIN = Credentials("operator", "secret-op-123")

_ids = UniqIdGenerator()


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    return write_acl(tmp_path, ACL_FILE)


@pytest.fixture
async def acl_broker(
    make_broker_config: Callable[..., BrokerConfig], acl_file: Path
) -> AsyncIterator[BrokerController]:
    async with started(
        make_broker_config(acl_enable=True, plain_acl_file=str(acl_file))
    ) as controller:
        yield controller


def send_header(topic: str, group: str, *, transactional: bool = False) -> dict[str, Any]:
    props = {MessageConst.UNIQ_KEY: _ids.next_id()}
    if transactional:
        props[MessageConst.TRAN_MSG] = "true"
        props[MessageConst.PGROUP] = group
    return SendMessageRequestHeader(
        producer_group=group,
        topic=topic,
        queue_id=0,
        sys_flag=0x4 if transactional else 0,
        born_timestamp=int(time.time() * 1000),
        properties=properties_to_string(props),
    ).to_ext_fields()


async def half_of(broker: BrokerController, group: str = "groupA") -> RemotingCommand:
    """A pending half message of ``group`` on topic orders, sent by an admin."""
    async with connected(broker.address, credentials=ADMIN) as c:
        resp = await c.call(
            RequestCode.SEND_MESSAGE, send_header("orders", group, transactional=True), b"half"
        )
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp


def end_tx_fields(half: RemotingCommand, group: str, decision: int = 0) -> dict[str, Any]:
    return end_header(group, half, decision).to_ext_fields()


def heartbeat_body(consumer: str | None = None, topic: str = "orders") -> bytes:
    consumers = (
        [{"groupName": consumer, "subscriptionDataSet": [{"topic": topic, "subString": "*"}]}]
        if consumer
        else []
    )
    doc = {"clientID": "acl-test", "producerDataSet": [], "consumerDataSet": consumers}
    return json.dumps(doc).encode()


@dataclass
class Case:
    code: RequestCode
    ext: dict[str, Any]
    body: bytes
    allowed: frozenset[str]  # access keys the file allows


def _allow(*keys: str) -> frozenset[str]:
    return frozenset(keys)


LOCK_BODY = b'{"clientId":"x","consumerGroup":"cgroup","mqSet":[{"queueId":0,"topic":"orders"}]}'
PUBLISHERS = _allow("producerA", "producerB", "operator")
SUBSCRIBER = _allow("consumerC", "operator")
ADMIN_ONLY = _allow("operator")
EVERYONE = _allow("producerA", "producerB", "consumerC", "operator")


async def answered_as_the_file_says(
    case: Case, clients: dict[str, RawClient], refusal_prefix: str | None = None
) -> None:
    """Each client (by access key) sends ``case``: served if the case allows its key, else
    refused (NO_PERMISSION, the remark starting with ``refusal_prefix`` when given)."""
    for key, client in clients.items():
        resp = await client.call(case.code, dict(case.ext), case.body)
        if key in case.allowed:
            assert resp.code != ResponseCode.NO_PERMISSION, (case.code.name, key, resp)
        else:
            assert resp.code == ResponseCode.NO_PERMISSION, (case.code.name, key, resp)
            if refusal_prefix is not None:
                assert resp.remark is not None and resp.remark.startswith(refusal_prefix)


async def cases(broker: BrokerController) -> list[Case]:
    R = RequestCode
    half = await half_of(broker)
    txid = RawClient.send_header(half).transaction_id
    assert txid is not None
    offset_fields = {"consumerGroup": "cgroup", "topic": "orders", "queueId": 0}
    send = send_header("orders", "plain-producers")
    return [
        Case(R.SEND_MESSAGE, send, b"x", PUBLISHERS),
        Case(
            R.SEND_MESSAGE_V2, {"a": "g", "b": "orders", "e": 0, "g": 0, "f": 0}, b"x", PUBLISHERS
        ),
        Case(R.SEND_BATCH_MESSAGE, send, encode_batch([]), PUBLISHERS),
        Case(R.RECALL_MESSAGE, {"topic": "orders", "recallHandle": "x"}, b"", PUBLISHERS),
        Case(
            R.CONSUMER_SEND_MSG_BACK,
            {"group": "cgroup", "offset": 0, "delayLevel": 0, "originTopic": "orders"},
            b"",
            SUBSCRIBER,
        ),
        Case(
            R.PULL_MESSAGE,
            {**offset_fields, "queueOffset": 0, "maxMsgNums": 1, "sysFlag": 0},
            b"",
            SUBSCRIBER,
        ),
        Case(
            R.POP_MESSAGE,
            {
                **offset_fields,
                "maxMsgNums": 1,
                "invisibleTime": 60000,
                "pollTime": 0,
                "bornTime": 0,
                "initMode": 0,
            },
            b"",
            SUBSCRIBER,
        ),
        Case(
            R.ACK_MESSAGE,
            {**offset_fields, "extraInfo": "0 1 2 0 0 b 0 0", "offset": 0},
            b"",
            SUBSCRIBER,
        ),
        Case(
            R.CHANGE_MESSAGE_INVISIBLETIME,
            {**offset_fields, "extraInfo": "0 1 2 0 0 b 0 0", "offset": 0, "invisibleTime": 1000},
            b"",
            SUBSCRIBER,
        ),
        Case(
            R.BATCH_ACK_MESSAGE,
            {},
            json.dumps(
                {"acks": [{"c": "cgroup", "t": "orders", "so": 0, "q": 0, "pt": 1, "b": ""}]}
            ).encode(),
            SUBSCRIBER,
        ),
        Case(R.HEART_BEAT, {}, heartbeat_body("cgroup"), SUBSCRIBER),
        Case(R.UNREGISTER_CLIENT, {"clientID": "x", "consumerGroup": "cgroup"}, b"", SUBSCRIBER),
        Case(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cgroup"}, b"", SUBSCRIBER),
        Case(R.LOCK_BATCH_MQ, {}, LOCK_BODY, SUBSCRIBER),
        Case(R.UNLOCK_BATCH_MQ, {}, LOCK_BODY, SUBSCRIBER),
        Case(R.QUERY_CONSUMER_OFFSET, offset_fields, b"", SUBSCRIBER),
        Case(R.UPDATE_CONSUMER_OFFSET, {**offset_fields, "commitOffset": 0}, b"", SUBSCRIBER),
        Case(R.GET_MAX_OFFSET, {"topic": "orders", "queueId": 0}, b"", SUBSCRIBER),
        Case(R.GET_MIN_OFFSET, {"topic": "orders", "queueId": 0}, b"", SUBSCRIBER),
        Case(
            R.SEARCH_OFFSET_BY_TIMESTAMP,
            {"topic": "orders", "queueId": 0, "timestamp": 0},
            b"",
            SUBSCRIBER,
        ),
        Case(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}, b"", PUBLISHERS | SUBSCRIBER),
        Case(R.GET_TOPIC_STATS_INFO, {"topic": "orders"}, b"", PUBLISHERS | SUBSCRIBER),
        Case(R.VIEW_MESSAGE_BY_ID, {"offset": 0}, b"", ADMIN_ONLY),
        Case(R.QUERY_MESSAGE, {"topic": "orders", "key": "k", "maxNum": 1}, b"", SUBSCRIBER),
        Case(
            R.UPDATE_AND_CREATE_TOPIC,
            CreateTopicRequestHeader(topic="orders", read_queue_nums=4).to_ext_fields(),
            b"",
            ADMIN_ONLY,
        ),
        Case(R.GET_ALL_TOPIC_CONFIG, {}, b"", ADMIN_ONLY),
        Case(R.TXMQ_CLUSTER_STATUS, {}, b"", EVERYONE),
        Case(
            R.CHECK_CLIENT_CONFIG,
            {},
            b'{"group": "cgroup", "subscriptionData": {"topic": "orders", "subString": "*"}}',
            EVERYONE,
        ),
        Case(R.GET_BROKER_RUNTIME_INFO, {}, b"", ADMIN_ONLY),
        # the admin tools' views (mqadmin, the dashboard): an operator's
        Case(R.GET_BROKER_CLUSTER_INFO, {}, b"", ADMIN_ONLY),
        Case(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {}, b"", ADMIN_ONLY),
        Case(R.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"}, b"", ADMIN_ONLY),
        Case(R.GET_SYSTEM_TOPIC_LIST_FROM_NS, {}, b"", ADMIN_ONLY),
        Case(R.GET_SYSTEM_TOPIC_LIST_FROM_BROKER, {}, b"", ADMIN_ONLY),
        Case(R.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "orders"}, b"", ADMIN_ONLY),
        Case(R.QUERY_TOPICS_BY_CONSUMER, {"group": "cgroup"}, b"", ADMIN_ONLY),
        Case(
            R.VIEW_BROKER_STATS_DATA,
            {"statsName": "TOPIC_PUT_NUMS", "statsKey": "orders"},
            b"",
            ADMIN_ONLY,
        ),
        Case(R.GET_TOPIC_CONFIG, {"topic": "orders"}, b"", ADMIN_ONLY),
        Case(R.GET_BROKER_CONFIG, {}, b"", ADMIN_ONLY),
        Case(R.UPDATE_BROKER_CONFIG, {}, b"maxReconsumeTimes=16\n", ADMIN_ONLY),
        Case(
            R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            {},
            b'{"groupName": "cgroup", "consumeMessageOrderly": true}',
            ADMIN_ONLY,
        ),
        Case(R.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "cgroup"}, b"", ADMIN_ONLY),
        Case(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}, b"", ADMIN_ONLY),
        Case(R.GET_CONSUME_STATS, {"consumerGroup": "cgroup"}, b"", ADMIN_ONLY),
        Case(R.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "cgroup"}, b"", ADMIN_ONLY),
        Case(R.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "groupA"}, b"", ADMIN_ONLY),
        Case(R.DELETE_SUBSCRIPTIONGROUP, {"groupName": "no-such-group"}, b"", ADMIN_ONLY),
        Case(R.DELETE_TOPIC_IN_BROKER, {"topic": "no-such-topic"}, b"", ADMIN_ONLY),
        Case(
            R.INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": "no-such-topic", "group": "cgroup", "timestamp": 0, "isForce": "true"},
            b"",
            ADMIN_ONLY,
        ),
        Case(R.TXMQ_GET_METRICS, {}, b"", ADMIN_ONLY),
        # ACL 2.0's user and policy requests (answered SYSTEM_ERROR when it is off)
        *(
            Case(code, {"username": "u", "subject": "User:u"}, b"{}", ADMIN_ONLY)
            for code in R
            if R.AUTH_CREATE_USER <= code <= R.AUTH_LIST_ACL
        ),
        Case(R.RESUME_CHECK_HALF_MESSAGE, {"msgId": "nothing-like-it"}, b"", ADMIN_ONLY),
        Case(R.TXMQ_LIST_TRANSACTIONS, {"limit": 10}, b"", ADMIN_ONLY),
        Case(R.TXMQ_GET_TRANSACTION, {"transactionId": txid}, b"", ADMIN_ONLY),
        Case(
            R.TXMQ_FORCE_DECIDE,
            ForceDecideRequestHeader(txid, 8).to_ext_fields(),
            b"",
            ADMIN_ONLY,
        ),
        # decision 0 (UNKNOWN) leaves the transaction pending for the next account
        Case(
            R.END_TRANSACTION, end_tx_fields(half, "groupA"), b"", _allow("producerA", "operator")
        ),
        Case(
            R.TXMQ_DECIDE_BATCH,
            DecideBatchRequestHeader(
                producer_group="groupA", batch_key="b1", query_only=True
            ).to_ext_fields(),
            b"",
            _allow("producerA", "operator"),
        ),
    ]


async def test_every_request_code_is_allowed_or_refused_as_the_file_says(
    acl_broker: BrokerController,
) -> None:
    table = await cases(acl_broker)
    # A request code the broker serves without a row here fails the test: decide its rule.
    assert {c.code for c in table} == set(acl_broker._processors)
    clients = {
        cred.access_key: await RawClient.connect(acl_broker.address, credentials=cred)
        for cred in (P, B, C, ADMIN)
    }
    anonymous = await RawClient.connect(acl_broker.address)
    try:
        for case in table:
            await answered_as_the_file_says(case, clients, refusal_prefix="ACL: ")
            resp = await anonymous.call(case.code, dict(case.ext), case.body)
            assert resp.code == ResponseCode.NO_PERMISSION
            assert "carries no AccessKey" in (resp.remark or "")
    finally:
        for client in [*clients.values(), anonymous]:
            await client.close()


async def test_refusals_say_which_check_failed_and_never_log_the_secret(
    acl_broker: BrokerController,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def call(cred: Credentials | None, **ext: Any) -> RemotingCommand:
        async with connected(acl_broker.address, credentials=cred) as c:
            return await c.call(
                RequestCode.GET_MAX_OFFSET, {"topic": "orders", "queueId": 0, **ext}
            )

    forged = await call(Credentials("consumerC", "not-the-secret"))
    assert forged.code == ResponseCode.NO_PERMISSION
    assert forged.remark == "ACL: bad signature for AccessKey 'consumerC'"
    unknown = await call(Credentials("nobody-here", "whatever-123"))
    assert unknown.remark == "ACL: unknown AccessKey 'nobody-here'"
    away = await call(Credentials("elsewhere", "secret-e-123"))
    assert away.code == ResponseCode.NO_PERMISSION
    assert away.remark is not None and away.remark.startswith("ACL: forbidden address")
    hidden = await call(C, topic="hidden")
    assert hidden.remark is not None and "missing permission" in hidden.remark
    assert "DENY on topic 'hidden'" in hidden.remark

    # a valid signature replayed onto other content (another topic) does not verify
    async with connected(acl_broker.address) as c:
        cmd = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "orders", "queueId": 0})
        C.sign(cmd)
        cmd.ext_fields["queueId"] = 1
        tampered = await c.conn.request(cmd)
        assert tampered.remark == "ACL: bad signature for AccessKey 'consumerC'"
        again = RemotingCommand.request(
            RequestCode.GET_MAX_OFFSET, {"topic": "orders", "queueId": 0}
        )
        C.sign(again)
        assert (await c.conn.request(again)).code == ResponseCode.SUCCESS

    # Where the lines go depends on how logging was configured earlier in this process (printed,
    # or through the standard library once the CLI configured it): look at both.
    out = capsys.readouterr()
    logs = out.out + out.err + caplog.text
    assert "acl_refused" in logs
    for secret in ("secret-c-123", "secret-e-123", "not-the-secret"):
        assert secret not in logs


async def test_a_refused_send_creates_no_topic_on_any_path(acl_broker: BrokerController) -> None:
    """A send is admitted (permission, then quota) by the send use case before its topic is
    looked up: one the account may not send to is refused without auto-creating the topic,
    whether a direct path could store it (SEND_MESSAGE_V2 of one plain message or one half, a
    batch) or only the generic one (SEND_MESSAGE with a delay)."""
    async with connected(acl_broker.address, credentials=P) as c:
        plain = SendMessageRequestHeader.from_ext_fields(send_header("fresh-1", "groupA"))
        half = SendMessageRequestHeader.from_ext_fields(
            send_header("fresh-2", "groupA", transactional=True)
        )
        delayed = send_header("fresh-3", "groupA")
        delayed["properties"] += f"{MessageConst.DELAY}\x012\x02"
        batch = send_header("fresh-4", "groupA")
        batch["batch"] = True
        for code, ext, body in (
            (RequestCode.SEND_MESSAGE_V2, plain.to_v2_ext_fields(), b"p"),
            (RequestCode.SEND_MESSAGE_V2, half.to_v2_ext_fields(), b"h"),
            (RequestCode.SEND_MESSAGE, delayed, b"d"),
            (RequestCode.SEND_BATCH_MESSAGE, batch, b""),
        ):
            resp = await c.call(code, ext, body)
            assert resp.code == ResponseCode.NO_PERMISSION, (code, resp.remark)
            assert resp.remark is not None and "missing permission" in resp.remark
        # groupA may send to orders, but not as the producer group of another account's halves
        other = SendMessageRequestHeader.from_ext_fields(
            send_header("orders", "groupB", transactional=True)
        )
        resp = await c.call(RequestCode.SEND_MESSAGE_V2, other.to_v2_ext_fields(), b"h")
        assert resp.code == ResponseCode.NO_PERMISSION, resp.remark
        assert resp.remark is not None and "group 'groupB'" in resp.remark
    for topic in ("fresh-1", "fresh-2", "fresh-3", "fresh-4"):
        assert acl_broker.topics.get(topic) is None, f"{topic} was created by a refused send"


async def test_a_producer_of_another_account_cannot_decide_or_be_checked(
    acl_broker: BrokerController,
) -> None:
    checks: dict[str, list[str]] = {"producerA": [], "producerB": []}

    def recorder(key: str) -> Any:
        async def handler(conn: Any, cmd: RemotingCommand) -> RemotingCommand | None:
            if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
                h = CheckTransactionStateRequestHeader.from_ext_fields(cmd.ext_fields)
                checks[key].append(str(h.transaction_id))
            return cmd.response()

        return handler

    # producerB registers first, claiming group A: it must get no check-back for group A
    b = await RawClient.connect(acl_broker.address, recorder("producerB"), credentials=B)
    await b.heartbeat(producer_groups=["groupA"])
    a = await RawClient.connect(acl_broker.address, recorder("producerA"), credentials=P)
    await a.heartbeat(producer_groups=["groupA"])
    try:
        half = await a.send("orders", b"pay", group="groupA", transactional=True, v2=False)
        assert half.code == ResponseCode.SUCCESS, half.remark
        txid = RawClient.send_header(half).transaction_id

        # deciding it as B: neither under A's group name nor under its own
        for group in ("groupA", "groupB"):
            resp = await b.call(RequestCode.END_TRANSACTION, end_tx_fields(half, group, 8))
            assert resp.code == ResponseCode.NO_PERMISSION, resp.remark
            assert "group 'groupA'" in (resp.remark or "")
        forced = await b.call(
            RequestCode.TXMQ_FORCE_DECIDE, ForceDecideRequestHeader(str(txid), 12).to_ext_fields()
        )
        assert forced.code == ResponseCode.NO_PERMISSION
        batch = await b.call(
            RequestCode.TXMQ_DECIDE_BATCH,
            DecideBatchRequestHeader(producer_group="groupA", batch_key="k").to_ext_fields(),
            json.dumps({"commit": [txid]}).encode(),
        )
        assert batch.code == ResponseCode.NO_PERMISSION
        assert acl_broker.transactions.records[str(txid)].state.value == "PENDING"

        # three check rounds reach A; none ever reaches B
        await wait_until(
            lambda: len(checks["producerA"]) >= 3, what="three check-backs to producerA"
        )
        assert checks["producerB"] == []

        resp = await a.call(RequestCode.END_TRANSACTION, end_tx_fields(half, "groupA", 8))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    finally:
        await a.close()
        await b.close()


async def test_the_file_is_reloaded_without_a_restart(
    acl_broker: BrokerController, acl_file: Path
) -> None:
    async with connected(acl_broker.address, credentials=C) as c:

        async def max_offset(topic: str) -> RemotingCommand:
            return await c.call(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})

        assert (await max_offset("payments")).code == ResponseCode.NO_PERMISSION
        acl_file.write_text(
            ACL_FILE.replace("      - orders=SUB\n", "      - orders=SUB\n      - payments=SUB\n"),
            encoding="utf-8",
        )
        assert acl_broker.acl is not None
        reloads = acl_broker.acl.reloads
        await wait_until(
            lambda: acl_broker.acl is not None and acl_broker.acl.reloads > reloads, what="reload"
        )
        assert (await max_offset("payments")).code == ResponseCode.SUCCESS

        # a file that no longer parses keeps the accounts in force
        acl_file.write_text("accounts: [unclosed\n", encoding="utf-8")
        stamp = (acl_file.stat().st_mtime, acl_file.stat().st_size)
        await wait_until(
            lambda: acl_broker.acl is not None and acl_broker.acl._stamp == stamp, what="poll"
        )
        assert (await max_offset("payments")).code == ResponseCode.SUCCESS
        assert (await max_offset("elsewhere")).code == ResponseCode.NO_PERMISSION


async def test_global_white_addresses_are_trusted_without_credentials(
    make_broker_config: Callable[..., BrokerConfig], tmp_path: Path
) -> None:
    path = tmp_path / "acl.yml"
    path.write_text("globalWhiteRemoteAddresses:\n  - 127.0.0.*\naccounts: []\n")
    async with started(make_broker_config(acl_enable=True, plain_acl_file=str(path))) as broker:
        async with connected(broker.address) as c:
            resp = await c.call(RequestCode.GET_BROKER_RUNTIME_INFO)
            assert resp.code == ResponseCode.SUCCESS, resp.remark


async def test_with_acl_off_signed_and_unsigned_requests_are_served(
    broker: BrokerController,
) -> None:
    assert broker.acl is None
    for cred in (None, Credentials("anything", "whatever")):
        async with connected(broker.address, credentials=cred) as c:
            resp = await c.call(RequestCode.GET_BROKER_RUNTIME_INFO)
            assert resp.code == ResponseCode.SUCCESS


async def test_a_missing_or_broken_file_stops_the_broker_from_starting(
    make_broker_config: Callable[..., BrokerConfig], tmp_path: Path
) -> None:
    missing = BrokerController(
        make_broker_config(acl_enable=True, plain_acl_file=str(tmp_path / "none.yml"))
    )
    with pytest.raises(ConfigError, match="ACL file not found"):
        await missing.start()
    bad = tmp_path / "bad.yml"
    bad.write_text("accounts:\n  - accessKey: short\n    secretKey: x\n")
    broken = BrokerController(make_broker_config(acl_enable=True, plain_acl_file=str(bad)))
    with pytest.raises(ConfigError, match=r"accounts\[0\]: accessKey and secretKey"):
        await broken.start()


def test_the_signature_is_rocketmqs_hmac_sha1_over_sorted_values_and_body() -> None:
    ext = {"topic": "T", "AccessKey": "ak", "queueId": 3, "unitMode": False}
    content = signed_content(ext, b"BODY")
    # sorted keys: AccessKey, queueId, topic, unitMode
    assert content == b"ak3TfalseBODY"
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T"}, b"BODY")
    Credentials("ak-123456", "sk-123456", "tok").sign(cmd)
    expected = calc_signature(b"ak-123456tokTBODY", "sk-123456")
    assert cmd.ext_fields[SIGNATURE] == expected
    assert cmd.ext_fields["SecurityToken"] == "tok"
    assert "sk-123456" not in repr(Credentials("ak-123456", "sk-123456"))


def test_address_patterns_and_file_errors() -> None:
    p = AddressPattern("192.168.1.{10,11}", "t")
    assert p.match("192.168.1.10") and not p.match("192.168.1.12")
    r = AddressPattern("10.1.1-5.*", "t")
    assert r.match("10.1.3.200") and not r.match("10.1.6.1")
    assert AddressPattern("10.0.0.0/8", "t").match("10.9.9.9")
    assert AddressPattern("*", "t").match("::1")
    assert AddressPattern("127.0.0.1", "t").match("::ffff:127.0.0.1")
    with pytest.raises(AclConfigError, match="invalid octet"):
        AddressPattern("10.1.x.1", "f")
    with pytest.raises(AclConfigError, match=r"topicPerms\[0\].*PUB, SUB, PUB\|SUB or DENY"):
        parse_acl_document(
            {"accounts": [{"accessKey": "abcdef", "secretKey": "abcdef", "topicPerms": ["t=ALL"]}]},
            "f",
        )
    with pytest.raises(AclConfigError, match="listed twice"):
        parse_acl_document({"accounts": [{"accessKey": "abcdef", "secretKey": "abcdef"}] * 2}, "f")

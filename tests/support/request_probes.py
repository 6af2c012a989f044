"""What each remoting request code docs/compatibility.md calls *served* does, tried on a running
broker: one probe per code sends the request (after what it needs) and checks the answer and
its effect, not only that the code is dispatched.  ``tests/broker/test_request_code_audit.py``
runs one per served code and fails for a served code without a probe."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tests.broker.test_remoting_pop import GROUP as POP_GROUP
from tests.broker.test_remoting_pop import TOPIC as POP_TOPIC
from tests.broker.test_remoting_pop import ack as pop_ack
from tests.broker.test_remoting_pop import create_topic as pop_create_topic
from tests.broker.test_remoting_pop import pop, pop_all
from tests.support.acl_files import acl2_with_root
from tests.support.brokers import stored
from tests.support.property_probes import COMMIT, FAR_FUTURE, in_topic, ok
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.broker.sql_filter import SUBSCRIPTION_PARSE_FAILED
from txmq.broker.topics import TIMER_TOPIC
from txmq.protocol import fastjson
from txmq.protocol.acl import Credentials
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.fastjson import ObjectKeyMap
from txmq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    DecideBatchRequestHeader,
    ForceDecideRequestHeader,
    GetConsumerListByGroupRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from txmq.protocol.message import MessageConst as C
from txmq.protocol.message import (
    decode_message,
    decode_messages,
    decode_offset_msg_id,
    encode_batch,
)

R = RequestCode
TOPIC = "audit-requests"
GROUP = "audit-cg"

Probe = Callable[[BrokerController, RawClient], Awaitable[None]]


def body_json(resp: RemotingCommand) -> Any:
    """The answer's body as RocketMQ's fastjson writes it (objects as map keys allowed)."""
    ok(resp)
    return fastjson.loads(resp.body)


async def _sent(c: RawClient, n: int = 1, **kw: Any) -> list[RemotingCommand]:
    return [ok(await c.send(TOPIC, f"m{i}".encode(), **kw)) for i in range(n)]


async def _send(b: BrokerController, c: RawClient) -> None:
    """SEND_MESSAGE (V1 header) and SEND_MESSAGE_V2: stored, readable, the answer's msgId."""
    offsets = [
        decode_offset_msg_id(RawClient.send_header(ok(await c.send(TOPIC, body, v2=v2))).msg_id)[1]
        for body, v2 in ((b"v1", False), (b"v2", True))
    ]
    got = await in_topic(c, TOPIC)
    assert [m.body for m in got] == [b"v1", b"v2"]
    assert [m.commit_log_offset for m in got] == offsets  # the answer's msgId is the offset id


async def _send_batch(b: BrokerController, c: RawClient) -> None:
    ok(await c.send(TOPIC, b"create"))
    batch = encode_batch([(f"b{i}".encode(), 0, {C.UNIQ_KEY: f"{i:032X}"}) for i in range(3)])
    ext = {"producerGroup": "audit-p", "topic": TOPIC, "queueId": 0, "sysFlag": 0}
    ext.update(bornTimestamp=int(time.time() * 1000), flag=0, properties="", batch="true")
    ok(await c.call(R.SEND_BATCH_MESSAGE, ext, batch))
    assert [m.body for m in await in_topic(c, TOPIC)] == [b"create", b"b0", b"b1", b"b2"]


async def _send_back(b: BrokerController, c: RawClient) -> None:
    await _sent(c)
    [m] = await in_topic(c, TOPIC)
    h = ConsumerSendMsgBackRequestHeader(offset=m.commit_log_offset, group=GROUP, delay_level=1)
    ok(await c.call(R.CONSUMER_SEND_MSG_BACK, h.to_ext_fields()))
    got = await wait_until(lambda: in_topic(c, f"%RETRY%{GROUP}"), 10, "the retry copy")
    assert [x.body for x in got] == [b"m0"] and got[0].reconsume_times == 1


async def _recall(b: BrokerController, c: RawClient) -> None:
    deliver = int(time.time() * 1000) + 30_000
    sent = ok(await c.send(TOPIC, b"t", props={"TIMER_DELIVER_MS": str(deliver)}))
    ext = {"producerGroup": "p", "topic": TOPIC, "recallHandle": sent.ext_fields["recallHandle"]}
    r = ok(await c.call(R.RECALL_MESSAGE, ext))
    [held] = [m for m in stored(b, TIMER_TOPIC) if m.queue_id == 0]
    assert r.ext_fields["msgId"] == held.msg_id
    assert b.timer.pending == 0


async def _pull(b: BrokerController, c: RawClient) -> None:
    await _sent(c, 3)
    resp, msgs = await c.pull(TOPIC, 0, 1)
    ok(resp)
    assert [m.body for m in msgs] == [b"m1", b"m2"]
    assert int(resp.ext_fields["nextBeginOffset"]) == 3


async def _consumer_list(c: RawClient) -> list[str]:
    h = GetConsumerListByGroupRequestHeader(consumer_group=GROUP)
    resp = await c.call(R.GET_CONSUMER_LIST_BY_GROUP, h.to_ext_fields())
    if resp.code != ResponseCode.SUCCESS:
        return []
    return list(json.loads(resp.body)["consumerIdList"])


async def _heartbeat_and_unregister(b: BrokerController, c: RawClient) -> None:
    """HEART_BEAT registers the consumer, GET_CONSUMER_LIST_BY_GROUP lists it,
    UNREGISTER_CLIENT takes it out."""
    await c.heartbeat(consumer_groups={GROUP: {TOPIC: "*"}})
    assert await _consumer_list(c) == [c.client_id]
    h = UnregisterClientRequestHeader(client_id=c.client_id, consumer_group=GROUP)
    ok(await c.call(R.UNREGISTER_CLIENT, h.to_ext_fields()))
    assert await _consumer_list(c) == []


async def _check_client_config(b: BrokerController, c: RawClient) -> None:
    def body(expr: str) -> bytes:
        sub = {"topic": TOPIC, "subString": expr, "expressionType": "SQL92"}
        return json.dumps({"group": GROUP, "subscriptionData": sub}).encode()

    ok(await c.call(R.CHECK_CLIENT_CONFIG, {}, body("a > 1")))
    bad = await c.call(R.CHECK_CLIENT_CONFIG, {}, body("a > "))
    assert bad.code == SUBSCRIPTION_PARSE_FAILED, bad.remark


async def _consumer_offsets(b: BrokerController, c: RawClient) -> None:
    """UPDATE_CONSUMER_OFFSET commits, QUERY_CONSUMER_OFFSET reads it back; INVOKE_BROKER_TO_
    RESET_OFFSET moves it to a time; GET_CONSUME_STATS reports it."""
    await _sent(c, 3)
    up = UpdateConsumerOffsetRequestHeader(
        consumer_group=GROUP, topic=TOPIC, queue_id=0, commit_offset=2
    )
    ok(await c.call(R.UPDATE_CONSUMER_OFFSET, up.to_ext_fields()))
    q = QueryConsumerOffsetRequestHeader(consumer_group=GROUP, topic=TOPIC, queue_id=0)
    assert (
        int(ok(await c.call(R.QUERY_CONSUMER_OFFSET, q.to_ext_fields())).ext_fields["offset"]) == 2
    )
    stats = ok(await c.call(R.GET_CONSUME_STATS, {"consumerGroup": GROUP})).body.decode()
    # ConsumeStats as fastjson writes it (objects as map keys: not JSON)
    assert f'"topic":"{TOPIC}"' in stats and '"consumerOffset":2' in stats, stats
    reset = {"topic": TOPIC, "group": GROUP, "timestamp": 0, "isForce": "true"}
    ok(await c.call(R.INVOKE_BROKER_TO_RESET_OFFSET, reset))
    assert (
        int(ok(await c.call(R.QUERY_CONSUMER_OFFSET, q.to_ext_fields())).ext_fields["offset"]) == 0
    )


async def _offsets(b: BrokerController, c: RawClient) -> None:
    """GET_MAX_OFFSET, GET_MIN_OFFSET and SEARCH_OFFSET_BY_TIMESTAMP of a queue of 3."""
    sent = await _sent(c, 3)
    mx = GetMaxOffsetRequestHeader(topic=TOPIC, queue_id=0)
    assert int(ok(await c.call(R.GET_MAX_OFFSET, mx.to_ext_fields())).ext_fields["offset"]) == 3
    mn = GetMinOffsetRequestHeader(topic=TOPIC, queue_id=0)
    assert int(ok(await c.call(R.GET_MIN_OFFSET, mn.to_ext_fields())).ext_fields["offset"]) == 0
    [m2] = [m for m in await in_topic(c, TOPIC) if m.queue_offset == 2]
    s = SearchOffsetRequestHeader(topic=TOPIC, queue_id=0, timestamp=m2.store_timestamp)
    found = int(
        ok(await c.call(R.SEARCH_OFFSET_BY_TIMESTAMP, s.to_ext_fields())).ext_fields["offset"]
    )
    assert found <= 2 and len(sent) == 3


async def _view_and_query(b: BrokerController, c: RawClient) -> None:
    """VIEW_MESSAGE_BY_ID reads the record at an offset; QUERY_MESSAGE finds it by key."""
    ok(await c.send(TOPIC, b"viewed", props={C.KEYS: "vk"}))
    [m] = await in_topic(c, TOPIC)
    view = ok(await c.call(R.VIEW_MESSAGE_BY_ID, {"offset": m.commit_log_offset}))
    assert decode_message(view.body).body == b"viewed"

    async def found() -> list[Any]:
        ext = {"topic": TOPIC, "key": "vk", "maxNum": 4, "beginTimestamp": 0}
        resp = await c.call(R.QUERY_MESSAGE, dict(ext, endTimestamp=FAR_FUTURE))
        return decode_messages(resp.body) if resp.code == ResponseCode.SUCCESS else []

    assert [x.body for x in await wait_until(found, 10, "found by key")] == [b"viewed"]


async def _topics(b: BrokerController, c: RawClient) -> None:
    """UPDATE_AND_CREATE_TOPIC makes a topic GET_ALL_TOPIC_CONFIG lists and whose route
    GET_ROUTEINFO_BY_TOPIC answers; GET_TOPIC_STATS_INFO counts its messages;
    DELETE_TOPIC_IN_BROKER removes it."""
    h = CreateTopicRequestHeader(topic="audit-made", read_queue_nums=3, write_queue_nums=3)
    ok(await c.call(R.UPDATE_AND_CREATE_TOPIC, h.to_ext_fields()))
    table = body_json(await c.call(R.GET_ALL_TOPIC_CONFIG))
    assert table["topicConfigTable"]["audit-made"]["writeQueueNums"] == 3
    route = body_json(await c.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "audit-made"}))
    assert [q["writeQueueNums"] for q in route["queueDatas"]] == [3]
    ok(await c.send("audit-made", b"x", queue_id=2))
    stats = body_json(await c.call(R.GET_TOPIC_STATS_INFO, {"topic": "audit-made"}))
    assert '"maxOffset":1' in json.dumps(stats, separators=(",", ":")), stats
    ok(await c.call(R.DELETE_TOPIC_IN_BROKER, {"topic": "audit-made"}))
    gone = await c.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "audit-made"})
    assert gone.code == ResponseCode.TOPIC_NOT_EXIST


async def _runtime(b: BrokerController, c: RawClient) -> None:
    """GET_BROKER_RUNTIME_INFO, TXMQ_GET_METRICS and TXMQ_CLUSTER_STATUS describe this
    broker."""
    await _sent(c, 2)
    info = body_json(await c.call(R.GET_BROKER_RUNTIME_INFO))
    assert "table" in info and info["table"], info
    metrics = ok(await c.call(R.TXMQ_GET_METRICS))
    assert metrics.body, "no metrics"
    # A single broker has no cluster to describe, and says so.
    status = await c.call(R.TXMQ_CLUSTER_STATUS)
    assert status.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "single node" in (status.remark or "")


async def _broker_config(b: BrokerController, c: RawClient) -> None:
    """UPDATE_BROKER_CONFIG changes a setting GET_BROKER_CONFIG then answers."""
    ok(await c.call(R.UPDATE_BROKER_CONFIG, {}, b"maxReconsumeTimes=7\n"))
    got = ok(await c.call(R.GET_BROKER_CONFIG)).body.decode()
    assert "maxReconsumeTimes=7" in got.splitlines(), got[:200]
    assert b.config.max_reconsume_times == 7


async def _groups(b: BrokerController, c: RawClient) -> None:
    """The subscription-group requests: create, get, list, delete."""
    doc = {"groupName": "audit-sg", "consumeMessageOrderly": True, "retryMaxTimes": 3}
    ok(await c.call(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(doc).encode()))
    one = body_json(await c.call(R.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "audit-sg"}))
    assert (one["consumeMessageOrderly"], one["retryMaxTimes"]) == (True, 3)
    every = body_json(await c.call(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    assert "audit-sg" in every["subscriptionGroupTable"]
    ok(await c.call(R.DELETE_SUBSCRIPTIONGROUP, {"groupName": "audit-sg"}))
    gone = await c.call(R.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "audit-sg"})
    assert gone.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


async def _connections(b: BrokerController, c: RawClient) -> None:
    """GET_CONSUMER_CONNECTION_LIST and GET_PRODUCER_CONNECTION_LIST list the clients."""
    await c.heartbeat(producer_groups=["audit-pg"], consumer_groups={GROUP: {TOPIC: "*"}})
    cons = body_json(await c.call(R.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": GROUP}))
    assert [x["clientId"] for x in cons["connectionSet"]] == [c.client_id]
    prod = body_json(await c.call(R.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "audit-pg"}))
    assert [x["clientId"] for x in prod["connectionSet"]] == [c.client_id]


async def _locks(b: BrokerController, c: RawClient) -> None:
    """LOCK_BATCH_MQ gives the queue to one client; UNLOCK_BATCH_MQ frees it for another."""
    await _sent(c)
    async with connected(b.address) as other:

        def lock_body(client: RawClient) -> bytes:
            mq = {"topic": TOPIC, "queueId": 0, "brokerName": b.config.broker_name}
            doc = {"consumerGroup": GROUP, "clientId": client.client_id, "mqSet": [mq]}
            return json.dumps(doc).encode()

        mine = body_json(await c.call(R.LOCK_BATCH_MQ, {}, lock_body(c)))
        assert len(mine["lockOKMQSet"]) == 1
        theirs = body_json(await other.call(R.LOCK_BATCH_MQ, {}, lock_body(other)))
        assert theirs["lockOKMQSet"] == []
        ok(await c.call(R.UNLOCK_BATCH_MQ, {}, lock_body(c)))
        theirs = body_json(await other.call(R.LOCK_BATCH_MQ, {}, lock_body(other)))
        assert len(theirs["lockOKMQSet"]) == 1


async def _transactions(b: BrokerController, c: RawClient) -> None:
    """END_TRANSACTION commits a half; TXMQ_LIST_TRANSACTIONS / TXMQ_GET_TRANSACTION show the
    pending one; TXMQ_FORCE_DECIDE commits it as an operator."""
    h1, h2 = [
        ok(await c.send(TOPIC, body, group="audit-tx", transactional=True))
        for body in (b"by-producer", b"by-operator")
    ]
    ok(await c.end_transaction("audit-tx", h1, COMMIT))
    txid = RawClient.send_header(h2).transaction_id
    assert txid is not None
    listed = body_json(await c.call(R.TXMQ_LIST_TRANSACTIONS, {"limit": 10}))
    assert [t["transactionId"] for t in listed] == [txid]
    one = body_json(await c.call(R.TXMQ_GET_TRANSACTION, {"transactionId": txid}))
    assert one["state"] == "PENDING"
    ok(await c.call(R.TXMQ_FORCE_DECIDE, ForceDecideRequestHeader(txid, COMMIT).to_ext_fields()))
    assert [m.body for m in await in_topic(c, TOPIC)] == [b"by-producer", b"by-operator"]


async def _resume(b: BrokerController, c: RawClient) -> None:
    """RESUME_CHECK_HALF_MESSAGE puts a parked (discarded) transaction back under checking."""
    half = ok(await c.send(TOPIC, b"parked", group="audit-tx", transactional=True))
    txid = RawClient.send_header(half).transaction_id
    assert txid is not None
    b.transactions.park(b.transactions.records[txid], "audit")
    assert b.transactions.records[txid].state.value == "DISCARDED"
    assert [m.body for m in stored(b, "TRANS_CHECK_MAX_TIME_TOPIC")] == [b"parked"]
    ok(await c.call(R.RESUME_CHECK_HALF_MESSAGE, {"msgId": txid}))
    assert b.transactions.records[txid].state.value == "PENDING"


async def _decide_batch(b: BrokerController, c: RawClient) -> None:
    """TXMQ_DECIDE_BATCH commits the listed halves of a batch key and rolls back the rest."""
    keep, drop = [
        ok(
            await c.send(
                TOPIC,
                body,
                group="audit-tx",
                transactional=True,
                props={C.TXMQ_BATCH_KEY: "audit-batch"},
            )
        )
        for body in (b"kept", b"dropped")
    ]
    keep_id = RawClient.send_header(keep).transaction_id
    h = DecideBatchRequestHeader(producer_group="audit-tx", batch_key="audit-batch")
    body = json.dumps({"commit": [keep_id]}).encode()
    ok(await c.call(R.TXMQ_DECIDE_BATCH, h.to_ext_fields(), body))
    assert [m.body for m in await in_topic(c, TOPIC)] == [b"kept"]
    drop_id = RawClient.send_header(drop).transaction_id
    assert drop_id is not None
    assert b.transactions.records[drop_id].state.value == "ROLLED_BACK"


async def _pop(b: BrokerController, c: RawClient) -> None:
    """POP_MESSAGE hands messages out invisible; ACK_MESSAGE and BATCH_ACK_MESSAGE ack them;
    CHANGE_MESSAGE_INVISIBLETIME renews one (its old extraInfo no longer acks): the group's
    offset is the acked prefix."""
    await pop_create_topic(c, queues=1)
    for i in range(3):
        ok(await c.send(POP_TOPIC, f"p{i}".encode()))
    got, infos = await pop_all(c, 3)
    by = {m.body: m for m in got}
    r, none = await pop(c, 3)
    assert none == [], "handed out while invisible"
    ok(await pop_ack(c, by[b"p0"], infos[b"p0"]))
    p1 = by[b"p1"]
    ext = {
        "consumerGroup": POP_GROUP,
        "topic": POP_TOPIC,
        "queueId": str(p1.queue_id),
        "extraInfo": infos[b"p1"],
        "offset": str(p1.queue_offset),
        "invisibleTime": "60000",
    }
    ok(await c.call(R.CHANGE_MESSAGE_INVISIBLETIME, ext, b"", SerializeType.JSON))
    stale = await pop_ack(c, p1, infos[b"p1"])
    assert stale.code == ResponseCode.NO_MESSAGE and "expired" in (stale.remark or "")
    p2 = by[b"p2"]
    one = {
        "c": POP_GROUP,
        "t": POP_TOPIC,
        "r": "0",
        "so": p2.queue_offset,
        "q": p2.queue_id,
        "rq": 0,
        "pt": int(infos[b"p2"].split(" ")[1]),
        "it": 60000,
        "b": base64.b64encode(b"\x01").decode(),
    }
    body = json.dumps({"brokerName": b.config.broker_name, "acks": [one]}).encode()
    ok(await c.call(R.BATCH_ACK_MESSAGE, {}, body, SerializeType.JSON))
    assert b.offsets.query(POP_GROUP, POP_TOPIC, 0) == 1  # p1 is still out


async def _name_server_views(b: BrokerController, c: RawClient) -> None:
    """What mqadmin and the dashboard ask a name server, answered by the broker."""
    ok(
        await c.call(
            R.UPDATE_AND_CREATE_TOPIC, CreateTopicRequestHeader(topic=TOPIC).to_ext_fields()
        )
    )
    bn, cluster = b.config.broker_name, b.config.broker_cluster_name
    info = body_json(await c.call(R.GET_BROKER_CLUSTER_INFO))
    assert info["clusterAddrTable"] == {cluster: [bn]}
    assert info["brokerAddrTable"][bn]["brokerAddrs"] == ObjectKeyMap([(0, b.advertised_address)])
    topics = body_json(await c.call(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))["topicList"]
    assert TOPIC in topics
    by_cluster = body_json(await c.call(R.GET_TOPICS_BY_CLUSTER, {"cluster": cluster}))
    assert by_cluster["topicList"] == topics
    ns = body_json(await c.call(R.GET_SYSTEM_TOPIC_LIST_FROM_NS))
    assert ns["brokerAddr"] == b.advertised_address
    system = body_json(await c.call(R.GET_SYSTEM_TOPIC_LIST_FROM_BROKER))["topicList"]
    assert "RMQ_SYS_TRANS_HALF_TOPIC" in system and TOPIC not in system


async def _broker_views(b: BrokerController, c: RawClient) -> None:
    """Who consumes a topic, what a group consumes, a topic's config, the put counts."""
    await _sent(c, 2)
    up = UpdateConsumerOffsetRequestHeader(
        consumer_group=GROUP, topic=TOPIC, queue_id=0, commit_offset=1
    )
    ok(await c.call(R.UPDATE_CONSUMER_OFFSET, up.to_ext_fields()))
    who = body_json(await c.call(R.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": TOPIC}))
    assert who["groupList"] == [GROUP]
    what = body_json(await c.call(R.QUERY_TOPICS_BY_CONSUMER, {"group": GROUP}))
    assert what["topicList"] == [TOPIC]
    tc = body_json(await c.call(R.GET_TOPIC_CONFIG, {"topic": TOPIC}))
    assert (tc["topicName"], tc["writeQueueNums"]) == (TOPIC, b.config.default_topic_queue_nums)
    missing = await c.call(R.GET_TOPIC_CONFIG, {"topic": "nowhere"})
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST
    ext = {"statsName": "TOPIC_PUT_NUMS", "statsKey": TOPIC}
    stats = body_json(await c.call(R.VIEW_BROKER_STATS_DATA, ext))
    assert stats["statsMinute"]["sum"] == 2


#: ACL 2.0 on, its first super user (the AUTH_* requests need both).
ROOT = Credentials("audit-root", "audit-root-secret")
AUTH_CONFIG: dict[str, Any] = acl2_with_root(ROOT.access_key, ROOT.secret_key)


async def _auth(b: BrokerController, _: RawClient) -> None:
    """The ACL 2.0 requests: a user and its policy made, read, listed, changed and removed by
    the super user, and the policy deciding the user's sends."""
    root = await RawClient.connect(b.address, credentials=ROOT)
    user = Credentials("audit-user", "audit-user-secret")
    try:
        ok(
            await root.call(
                R.UPDATE_AND_CREATE_TOPIC, CreateTopicRequestHeader(topic=TOPIC).to_ext_fields()
            )
        )
        info = {"username": user.access_key, "password": user.secret_key, "userType": "Normal"}
        ext = {"username": user.access_key}
        ok(await root.call(R.AUTH_CREATE_USER, ext, json.dumps(info).encode()))
        assert body_json(await root.call(R.AUTH_GET_USER, ext))["username"] == user.access_key
        listed = body_json(await root.call(R.AUTH_LIST_USER, {}))
        assert user.access_key in [u["username"] for u in listed]
        subject = f"User:{user.access_key}"
        pub = {"resource": f"Topic:{TOPIC}", "actions": ["Pub"], "decision": "Allow"}
        policies = [{"policyType": "Custom", "entries": [pub]}]
        doc = json.dumps({"subject": subject, "policies": policies}).encode()
        ok(await root.call(R.AUTH_CREATE_ACL, {"subject": subject}, doc))

        async def send_code() -> int:
            async with connected(b.address, credentials=user) as u:
                return int((await u.send(TOPIC, b"by-user")).code)

        assert await send_code() == ResponseCode.SUCCESS
        got = body_json(await root.call(R.AUTH_GET_ACL, {"subject": subject}))
        assert "Topic:" + TOPIC in json.dumps(got)
        assert subject in json.dumps(body_json(await root.call(R.AUTH_LIST_ACL, {})))
        deny = dict(pub, decision="Deny")
        denied = [{"policyType": "Custom", "entries": [deny]}]
        doc = json.dumps({"subject": subject, "policies": denied}).encode()
        ok(await root.call(R.AUTH_UPDATE_ACL, {"subject": subject}, doc))
        assert await send_code() == ResponseCode.NO_PERMISSION
        ok(await root.call(R.AUTH_DELETE_ACL, {"subject": subject}))
        assert await send_code() == ResponseCode.NO_PERMISSION  # nothing allows it now
        update = {"username": user.access_key, "userStatus": "disable"}
        ok(await root.call(R.AUTH_UPDATE_USER, ext, json.dumps(update).encode()))
        assert body_json(await root.call(R.AUTH_GET_USER, ext))["userStatus"] == "disable"
        ok(await root.call(R.AUTH_DELETE_USER, ext))
        listed = body_json(await root.call(R.AUTH_LIST_USER, {}))
        assert user.access_key not in [u["username"] for u in listed]
    finally:
        await root.close()


#: Settings a probe's broker needs (none: the tests' defaults).
CONFIG: dict[int, dict[str, Any]] = {code: AUTH_CONFIG for code in range(3001, 3011)}

PROBES: dict[int, Probe] = {
    R.SEND_MESSAGE: _send,
    R.SEND_MESSAGE_V2: _send,
    R.SEND_BATCH_MESSAGE: _send_batch,
    R.CONSUMER_SEND_MSG_BACK: _send_back,
    R.RECALL_MESSAGE: _recall,
    R.PULL_MESSAGE: _pull,
    R.HEART_BEAT: _heartbeat_and_unregister,
    R.UNREGISTER_CLIENT: _heartbeat_and_unregister,
    R.GET_CONSUMER_LIST_BY_GROUP: _heartbeat_and_unregister,
    R.CHECK_CLIENT_CONFIG: _check_client_config,
    R.QUERY_CONSUMER_OFFSET: _consumer_offsets,
    R.UPDATE_CONSUMER_OFFSET: _consumer_offsets,
    R.INVOKE_BROKER_TO_RESET_OFFSET: _consumer_offsets,
    R.GET_CONSUME_STATS: _consumer_offsets,
    R.GET_MAX_OFFSET: _offsets,
    R.GET_MIN_OFFSET: _offsets,
    R.SEARCH_OFFSET_BY_TIMESTAMP: _offsets,
    R.VIEW_MESSAGE_BY_ID: _view_and_query,
    R.QUERY_MESSAGE: _view_and_query,
    R.UPDATE_AND_CREATE_TOPIC: _topics,
    R.GET_ALL_TOPIC_CONFIG: _topics,
    R.GET_ROUTEINFO_BY_TOPIC: _topics,
    R.GET_TOPIC_STATS_INFO: _topics,
    R.DELETE_TOPIC_IN_BROKER: _topics,
    R.GET_BROKER_RUNTIME_INFO: _runtime,
    R.TXMQ_GET_METRICS: _runtime,
    R.TXMQ_CLUSTER_STATUS: _runtime,
    R.GET_BROKER_CONFIG: _broker_config,
    R.UPDATE_BROKER_CONFIG: _broker_config,
    R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: _groups,
    R.GET_SUBSCRIPTIONGROUP_CONFIG: _groups,
    R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: _groups,
    R.DELETE_SUBSCRIPTIONGROUP: _groups,
    R.GET_CONSUMER_CONNECTION_LIST: _connections,
    R.GET_PRODUCER_CONNECTION_LIST: _connections,
    R.LOCK_BATCH_MQ: _locks,
    R.UNLOCK_BATCH_MQ: _locks,
    R.END_TRANSACTION: _transactions,
    R.TXMQ_LIST_TRANSACTIONS: _transactions,
    R.TXMQ_GET_TRANSACTION: _transactions,
    R.TXMQ_FORCE_DECIDE: _transactions,
    R.RESUME_CHECK_HALF_MESSAGE: _resume,
    R.TXMQ_DECIDE_BATCH: _decide_batch,
    R.POP_MESSAGE: _pop,
    R.ACK_MESSAGE: _pop,
    R.CHANGE_MESSAGE_INVISIBLETIME: _pop,
    R.BATCH_ACK_MESSAGE: _pop,
    R.GET_BROKER_CLUSTER_INFO: _name_server_views,
    R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: _name_server_views,
    R.GET_TOPICS_BY_CLUSTER: _name_server_views,
    R.GET_SYSTEM_TOPIC_LIST_FROM_NS: _name_server_views,
    R.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: _name_server_views,
    R.QUERY_TOPIC_CONSUME_BY_WHO: _broker_views,
    R.QUERY_TOPICS_BY_CONSUMER: _broker_views,
    R.GET_TOPIC_CONFIG: _broker_views,
    R.VIEW_BROKER_STATS_DATA: _broker_views,
    **{code: _auth for code in range(3001, 3011)},
}

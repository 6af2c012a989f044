"""RocketMQ's numeric codes, kept as they are so RocketMQ users find their way.

Request codes, response codes, serialize types and language codes all use the numbers of
``org.apache.rocketmq.remoting.protocol.RequestCode`` / ``ResponseCode``.  txmq's own extensions
take codes from 10000 up; each is documented where it is defined.
"""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    #: An orderly consumer locks the queues it consumes (JSON body: ``consumerGroup``,
    #: ``clientId``, ``mqSet``); the answer's body lists those granted (``lockOKMQSet``).
    LOCK_BATCH_MQ = 41
    #: An orderly consumer gives up its locks on queues (same body as LOCK_BATCH_MQ).
    UNLOCK_BATCH_MQ = 42
    CHECK_CLIENT_CONFIG = 46
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_TOPIC_STATS_INFO = 202
    GET_BROKER_RUNTIME_INFO = 28
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    RESUME_CHECK_HALF_MESSAGE = 323
    #: RocketMQ 5.3's recall of a pending timer message (header ``RecallMessageRequestHeader``).
    RECALL_MESSAGE = 370
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    #: Create or replace a consumer group's settings (body: ``SubscriptionGroupConfig`` JSON).
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    #: Delete a topic on this broker (``DeleteTopicRequestHeader``: ``topic``).
    DELETE_TOPIC_IN_BROKER = 215
    #: Broker to consumer: move to the offsets of the body (``ResetOffsetBody``, fastjson
    #: object-keyed ``offsetTable``); header as INVOKE_BROKER_TO_RESET_OFFSET.
    RESET_CONSUMER_CLIENT_OFFSET = 220
    #: An operator resets a group's offsets (``ResetOffsetRequestHeader``: ``topic``,
    #: ``group``, ``timestamp``, ``isForce``; RocketMQ 5 also ``queueId``, ``offset``).
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    #: One consumer group's settings (header ``group``; body: ``SubscriptionGroupConfig``).
    GET_SUBSCRIPTIONGROUP_CONFIG = 352
    #: Name-server views a broker answers as its own name server (bodies: ``ClusterInfo``,
    #: ``TopicList``), and the admin tools' views of one broker (``GroupList``, ``TopicList``,
    #: ``BrokerStatsData``, ``TopicConfigAndQueueMapping``); see
    #: :mod:`txmq.broker.processors.tool_views`.
    GET_BROKER_CLUSTER_INFO = 106
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    VIEW_BROKER_STATS_DATA = 315
    QUERY_TOPICS_BY_CONSUMER = 343
    GET_TOPIC_CONFIG = 351

    #: POP consumption (RocketMQ 5's remoting consumers): hand out messages invisible for a
    #: while; ack them, change their invisible time, or ack many at once (body ``BatchAck``s).
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151

    # --- ACL 2.0 (RocketMQ 5.3's users and ACL policies, docs/security.md) --------------
    #: Header ``username``; body: ``UserInfo`` JSON.
    AUTH_CREATE_USER = 3001
    AUTH_UPDATE_USER = 3002
    #: Header ``username``.
    AUTH_DELETE_USER = 3003
    AUTH_GET_USER = 3004
    #: Header ``filter`` (optional); answer: a JSON list of ``UserInfo`` (no passwords).
    AUTH_LIST_USER = 3005
    #: Header ``subject`` (``User:<name>``); body: ``AclInfo`` JSON.
    AUTH_CREATE_ACL = 3006
    AUTH_UPDATE_ACL = 3007
    #: Header ``subject``, optional ``policyType`` and ``resource``.
    AUTH_DELETE_ACL = 3008
    AUTH_GET_ACL = 3009
    #: Headers ``subjectFilter``, ``resourceFilter`` (optional); answer: a JSON list of AclInfo.
    AUTH_LIST_ACL = 3010

    # --- txmq extensions (10000+) -------------------------------------------------------
    #: List transactions (pending, parked after the check budget, or decided).  Header:
    #: ``producerGroup`` (optional), ``topic`` (optional), ``state`` (optional), ``limit``.
    #: Body of the answer: JSON list of transaction records.
    TXMQ_LIST_TRANSACTIONS = 10001
    #: Show one transaction by id.  Header: ``transactionId``.  Body: JSON record.
    TXMQ_GET_TRANSACTION = 10002
    #: Force a decision as an operator.  Header: ``transactionId``, ``commitOrRollback``
    #: (8 commit, 12 rollback).  Goes through the same state machine as END_TRANSACTION.
    TXMQ_FORCE_DECIDE = 10003
    #: Broker metrics as JSON (answer body).
    TXMQ_GET_METRICS = 10004
    #: Decide a batch of transactions atomically and idempotently (the Spark sink's commit).
    #: Header: ``producerGroup``, ``batchKey``; body: JSON ``{"commit": [transactionId, ...]}``.
    #: Commits the listed transactions and rolls back every other pending transaction of the
    #: group tagged with the same batch key.  Asking again returns the first decision.
    #: With ``queryOnly=true`` it decides nothing and answers ``{"decided": bool, ...}``.
    TXMQ_DECIDE_BATCH = 10005
    #: Replication, follower to leader (cluster mode): the leader's epoch history and store
    #: geometry.  Header: ``brokerName``, ``replicaId``, ``epoch``.  Body: JSON.
    TXMQ_HA_HANDSHAKE = 10010
    #: Replication: commit-log bytes from ``offset``, as stored (long-polled up to ``waitMs``).
    #: The offset a follower asks from is also its acknowledgement of everything below it.
    TXMQ_HA_FETCH = 10011
    #: Replication: the leader's state files (consumer offsets, topics, check state).
    TXMQ_HA_META = 10012
    #: Cluster state as this broker sees it (``txmq cluster status``).  Body: JSON.
    TXMQ_CLUSTER_STATUS = 10013


class ResponseCode(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    INVALID_PARAMETER = 29
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    ILLEGAL_OPERATION = 604


class SerializeType(IntEnum):
    JSON = 0
    ROCKETMQ = 1
    MSGPACK = 2


class LanguageCode(IntEnum):
    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13
    UNKNOWN = 14


#: ``flag`` bits of a remoting command.
RPC_TYPE_RESPONSE = 0x1
RPC_ONEWAY = 0x2

#: The version number txmq puts in the ``version`` header field (RocketMQ's V4_9_4 is 413; ours
#: marks txmq's protocol revision).
TXMQ_PROTOCOL_VERSION = 1

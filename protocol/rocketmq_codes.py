"""Every request code of Apache RocketMQ 5.3 (its ``RequestCode`` class, with 5.3.1's
RECALL_MESSAGE) by number, so that a request txmq does not serve is answered with its RocketMQ
name, and so that docs/compatibility.md can list what is served and what is not (``tests/broker/test_request_code_audit.py`` keeps the
two in step).

:class:`txmq.protocol.codes.RequestCode` holds the codes txmq itself uses; this table is the
whole of RocketMQ's, whether served or not.
"""

from __future__ import annotations

#: RocketMQ 5.3's request codes, by number.
ROCKETMQ_REQUEST_CODES: dict[int, str] = {
    10: "SEND_MESSAGE",
    11: "PULL_MESSAGE",
    12: "QUERY_MESSAGE",
    13: "QUERY_BROKER_OFFSET",
    14: "QUERY_CONSUMER_OFFSET",
    15: "UPDATE_CONSUMER_OFFSET",
    17: "UPDATE_AND_CREATE_TOPIC",
    18: "UPDATE_AND_CREATE_TOPIC_LIST",
    21: "GET_ALL_TOPIC_CONFIG",
    22: "GET_TOPIC_CONFIG_LIST",
    23: "GET_TOPIC_NAME_LIST",
    25: "UPDATE_BROKER_CONFIG",
    26: "GET_BROKER_CONFIG",
    27: "TRIGGER_DELETE_FILES",
    28: "GET_BROKER_RUNTIME_INFO",
    29: "SEARCH_OFFSET_BY_TIMESTAMP",
    30: "GET_MAX_OFFSET",
    31: "GET_MIN_OFFSET",
    32: "GET_EARLIEST_MSG_STORETIME",
    33: "VIEW_MESSAGE_BY_ID",
    34: "HEART_BEAT",
    35: "UNREGISTER_CLIENT",
    36: "CONSUMER_SEND_MSG_BACK",
    37: "END_TRANSACTION",
    38: "GET_CONSUMER_LIST_BY_GROUP",
    39: "CHECK_TRANSACTION_STATE",
    40: "NOTIFY_CONSUMER_IDS_CHANGED",
    41: "LOCK_BATCH_MQ",
    42: "UNLOCK_BATCH_MQ",
    43: "GET_ALL_CONSUMER_OFFSET",
    45: "GET_ALL_DELAY_OFFSET",
    46: "CHECK_CLIENT_CONFIG",
    47: "GET_CLIENT_CONFIG",
    50: "UPDATE_AND_CREATE_ACL_CONFIG",
    51: "DELETE_ACL_CONFIG",
    52: "GET_BROKER_CLUSTER_ACL_INFO",
    53: "UPDATE_GLOBAL_WHITE_ADDRS_CONFIG",
    54: "GET_BROKER_CLUSTER_ACL_CONFIG",
    60: "GET_TIMER_CHECK_POINT",
    61: "GET_TIMER_METRICS",
    100: "PUT_KV_CONFIG",
    101: "GET_KV_CONFIG",
    102: "DELETE_KV_CONFIG",
    103: "REGISTER_BROKER",
    104: "UNREGISTER_BROKER",
    105: "GET_ROUTEINFO_BY_TOPIC",
    106: "GET_BROKER_CLUSTER_INFO",
    200: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
    201: "GET_ALL_SUBSCRIPTIONGROUP_CONFIG",
    202: "GET_TOPIC_STATS_INFO",
    203: "GET_CONSUMER_CONNECTION_LIST",
    204: "GET_PRODUCER_CONNECTION_LIST",
    205: "WIPE_WRITE_PERM_OF_BROKER",
    206: "GET_ALL_TOPIC_LIST_FROM_NAMESERVER",
    207: "DELETE_SUBSCRIPTIONGROUP",
    208: "GET_CONSUME_STATS",
    209: "SUSPEND_CONSUMER",
    210: "RESUME_CONSUMER",
    211: "RESET_CONSUMER_OFFSET_IN_CONSUMER",
    212: "RESET_CONSUMER_OFFSET_IN_BROKER",
    213: "ADJUST_CONSUMER_THREAD_POOL",
    214: "WHO_CONSUME_THE_MESSAGE",
    215: "DELETE_TOPIC_IN_BROKER",
    216: "DELETE_TOPIC_IN_NAMESRV",
    217: "REGISTER_TOPIC_IN_NAMESRV",
    219: "GET_KVLIST_BY_NAMESPACE",
    220: "RESET_CONSUMER_CLIENT_OFFSET",
    221: "GET_CONSUMER_STATUS_FROM_CLIENT",
    222: "INVOKE_BROKER_TO_RESET_OFFSET",
    223: "INVOKE_BROKER_TO_GET_CONSUMER_STATUS",
    224: "GET_TOPICS_BY_CLUSTER",
    225: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST",
    300: "QUERY_TOPIC_CONSUME_BY_WHO",
    301: "REGISTER_FILTER_SERVER",
    302: "REGISTER_MESSAGE_FILTER_CLASS",
    303: "QUERY_CONSUME_TIME_SPAN",
    304: "GET_SYSTEM_TOPIC_LIST_FROM_NS",
    305: "GET_SYSTEM_TOPIC_LIST_FROM_BROKER",
    306: "CLEAN_EXPIRED_CONSUMEQUEUE",
    307: "GET_CONSUMER_RUNNING_INFO",
    308: "QUERY_CORRECTION_OFFSET",
    309: "CONSUME_MESSAGE_DIRECTLY",
    310: "SEND_MESSAGE_V2",
    311: "GET_UNIT_TOPIC_LIST",
    312: "GET_HAS_UNIT_SUB_TOPIC_LIST",
    313: "GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST",
    314: "CLONE_GROUP_OFFSET",
    315: "VIEW_BROKER_STATS_DATA",
    316: "CLEAN_UNUSED_TOPIC",
    317: "GET_BROKER_CONSUME_STATS",
    318: "UPDATE_NAMESRV_CONFIG",
    319: "GET_NAMESRV_CONFIG",
    320: "SEND_BATCH_MESSAGE",
    321: "QUERY_CONSUME_QUEUE",
    322: "QUERY_DATA_VERSION",
    323: "RESUME_CHECK_HALF_MESSAGE",
    324: "SEND_REPLY_MESSAGE",
    325: "SEND_REPLY_MESSAGE_V2",
    326: "PUSH_REPLY_MESSAGE_TO_CLIENT",
    327: "ADD_WRITE_PERM_OF_BROKER",
    328: "GET_ALL_PRODUCER_INFO",
    329: "DELETE_EXPIRED_COMMITLOG",
    343: "QUERY_TOPICS_BY_CONSUMER",
    345: "QUERY_SUBSCRIPTION_BY_CONSUMER",
    351: "GET_TOPIC_CONFIG",
    352: "GET_SUBSCRIPTIONGROUP_CONFIG",
    353: "UPDATE_AND_GET_GROUP_FORBIDDEN",
    354: "CHECK_ROCKSDB_CQ_WRITE_PROGRESS",
    361: "LITE_PULL_MESSAGE",
    370: "RECALL_MESSAGE",
    400: "QUERY_ASSIGNMENT",
    401: "SET_MESSAGE_REQUEST_MODE",
    402: "GET_ALL_MESSAGE_REQUEST_MODE",
    513: "UPDATE_AND_CREATE_STATIC_TOPIC",
    901: "GET_BROKER_MEMBER_GROUP",
    902: "ADD_BROKER",
    903: "REMOVE_BROKER",
    904: "BROKER_HEARTBEAT",
    905: "NOTIFY_MIN_BROKER_ID_CHANGE",
    906: "EXCHANGE_BROKER_HA_INFO",
    907: "GET_BROKER_HA_STATUS",
    908: "RESET_MASTER_FLUSH_OFFSET",
    1001: "CONTROLLER_ALTER_SYNC_STATE_SET",
    1002: "CONTROLLER_ELECT_MASTER",
    1003: "CONTROLLER_REGISTER_BROKER",
    1004: "CONTROLLER_GET_REPLICA_INFO",
    1005: "CONTROLLER_GET_METADATA_INFO",
    1006: "CONTROLLER_GET_SYNC_STATE_DATA",
    1007: "GET_BROKER_EPOCH_CACHE",
    1008: "NOTIFY_BROKER_ROLE_CHANGED",
    1009: "UPDATE_CONTROLLER_CONFIG",
    1010: "GET_CONTROLLER_CONFIG",
    1011: "CLEAN_BROKER_DATA",
    1012: "CONTROLLER_GET_NEXT_BROKER_ID",
    1013: "CONTROLLER_APPLY_BROKER_ID",
    1014: "BROKER_CLOSE_CHANNEL_REQUEST",
    1015: "CHECK_NOT_ACTIVE_BROKER_REQUEST",
    1016: "GET_BROKER_LIVE_INFO_REQUEST",
    1017: "GET_SYNC_STATE_DATA_REQUEST",
    1018: "RAFT_BROKER_HEART_BEAT_EVENT_REQUEST",
    2001: "UPDATE_COLD_DATA_FLOW_CTR_CONFIG",
    2002: "REMOVE_COLD_DATA_FLOW_CTR_CONFIG",
    2003: "GET_COLD_DATA_FLOW_CTR_INFO",
    2004: "SET_COMMITLOG_READ_MODE",
    3001: "AUTH_CREATE_USER",
    3002: "AUTH_UPDATE_USER",
    3003: "AUTH_DELETE_USER",
    3004: "AUTH_GET_USER",
    3005: "AUTH_LIST_USER",
    3006: "AUTH_CREATE_ACL",
    3007: "AUTH_UPDATE_ACL",
    3008: "AUTH_DELETE_ACL",
    3009: "AUTH_GET_ACL",
    3010: "AUTH_LIST_ACL",
    200050: "POP_MESSAGE",
    200051: "ACK_MESSAGE",
    200052: "PEEK_MESSAGE",
    200053: "CHANGE_MESSAGE_INVISIBLETIME",
    200054: "NOTIFICATION",
    200055: "POLLING_INFO",
    200056: "POP_ROLLBACK",
    200151: "BATCH_ACK_MESSAGE",
}

#: Requests a RocketMQ broker sends *to clients* (over the client's own connection): a broker
#: never receives them.  txmq sends CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED and
#: RESET_CONSUMER_CLIENT_OFFSET.
BROKER_TO_CLIENT: frozenset[int] = frozenset({39, 40, 220, 221, 307, 309, 326})

#: The ones of :data:`BROKER_TO_CLIENT` txmq sends.
SENT_BY_TXMQ: frozenset[int] = frozenset({39, 40, 220})


def request_code_name(code: int) -> str | None:
    """RocketMQ's name of request ``code``, or None when RocketMQ defines no such code."""
    return ROCKETMQ_REQUEST_CODES.get(code)


def not_supported_remark(code: int) -> str:
    """The remark of a REQUEST_CODE_NOT_SUPPORTED answer: names the request, so a client's
    error says which of its features txmq does not serve."""
    name = ROCKETMQ_REQUEST_CODES.get(code)
    if name is None:
        return f"request code {code} is not a RocketMQ request code txmq knows"
    if code in BROKER_TO_CLIENT:
        return f"request code {code} ({name}) is sent by brokers to clients, not served by them"
    return f"request code {code} ({name}) is not supported by txmq"


# -- message properties and subscription types -------------------------------------------------

#: What txmq does with a property or a subscription type: it acts on it (``served``), keeps it
#: as sent and does nothing more, on purpose (``ignored``), or refuses the request naming it
#: (``refused``).
SERVED, IGNORED, REFUSED = "served", "ignored", "refused"


#: Every property of RocketMQ 5.3's ``MessageConst`` (all its string constants but
#: ``KEY_SEPARATOR``): its value (the key on the wire), the Java
#: constant, what txmq does, and how or why.  docs/compatibility.md's table is made from this
#: (``tests/broker/test_property_audit.py`` checks both, and what a broker does with each).
ROCKETMQ_MESSAGE_PROPERTIES: tuple[tuple[str, str, str, str], ...] = (
    ("KEYS", "PROPERTY_KEYS", SERVED, "indexed (space-separated) for QUERY_MESSAGE"),
    ("TAGS", "PROPERTY_TAGS", SERVED, "tag filters (consume-queue tag code), SQL92 `TAGS`"),
    (
        "WAIT",
        "PROPERTY_WAIT_STORE_MSG_OK",
        IGNORED,
        "every send is answered once durable under the flush mode in force",
    ),
    (
        "DELAY",
        "PROPERTY_DELAY_TIME_LEVEL",
        SERVED,
        "delay levels (on a half: that delay after the commit); a level that is no number is "
        "refused",
    ),
    ("RETRY_TOPIC", "PROPERTY_RETRY_TOPIC", SERVED, "set on retry and dead-letter copies"),
    ("REAL_TOPIC", "PROPERTY_REAL_TOPIC", SERVED, "set on halves, delayed and timer messages"),
    ("REAL_QID", "PROPERTY_REAL_QUEUE_ID", SERVED, "set on halves, delayed and timer messages"),
    ("TRAN_MSG", "PROPERTY_TRANSACTION_PREPARED", SERVED, "makes a half message"),
    ("PGROUP", "PROPERTY_PRODUCER_GROUP", SERVED, "the group a half's check-back goes to"),
    ("MIN_OFFSET", "PROPERTY_MIN_OFFSET", IGNORED, "set by clients on the messages they pull"),
    ("MAX_OFFSET", "PROPERTY_MAX_OFFSET", IGNORED, "set by clients on the messages they pull"),
    ("BUYER_ID", "PROPERTY_BUYER_ID", IGNORED, "unused by RocketMQ itself"),
    (
        "ORIGIN_MESSAGE_ID",
        "PROPERTY_ORIGIN_MESSAGE_ID",
        SERVED,
        "set on retry and dead-letter copies",
    ),
    ("TRANSFER_FLAG", "PROPERTY_TRANSFER_FLAG", IGNORED, "unused by RocketMQ itself"),
    ("CORRECTION_FLAG", "PROPERTY_CORRECTION_FLAG", IGNORED, "unused by RocketMQ itself"),
    ("MQ2_FLAG", "PROPERTY_MQ2_FLAG", IGNORED, "unused by RocketMQ itself"),
    (
        "RECONSUME_TIME",
        "PROPERTY_RECONSUME_TIME",
        IGNORED,
        "the delivery count is the stored record's reconsumeTimes",
    ),
    ("MSG_REGION", "PROPERTY_MSG_REGION", IGNORED, "a client trace setting; one region"),
    (
        "TRACE_ON",
        "PROPERTY_TRACE_SWITCH",
        IGNORED,
        "a client trace setting (broker trace: `traceTopicEnable`)",
    ),
    (
        "UNIQ_KEY",
        "PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX",
        SERVED,
        "the msgId: index, duplicate window",
    ),
    ("EXTEND_UNIQ_INFO", "PROPERTY_EXTEND_UNIQ_INFO", IGNORED, "client-side id detail"),
    (
        "MAX_RECONSUME_TIMES",
        "PROPERTY_MAX_RECONSUME_TIMES",
        IGNORED,
        "the send-back header's maxReconsumeTimes (or `maxReconsumeTimes`) counts",
    ),
    (
        "CONSUME_START_TIME",
        "PROPERTY_CONSUME_START_TIMESTAMP",
        IGNORED,
        "set by consumers for themselves",
    ),
    (
        "INNER_NUM",
        "PROPERTY_INNER_NUM",
        IGNORED,
        "batch consume queues are not implemented: one entry a message",
    ),
    (
        "INNER_BASE",
        "PROPERTY_INNER_BASE",
        IGNORED,
        "batch consume queues are not implemented: one entry a message",
    ),
    ("DUP_INFO", "DUP_INFO", IGNORED, "RocketMQ's broker-internal bookkeeping"),
    (
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS",
        SERVED,
        "delays a half's first check-back",
    ),
    (
        "TRAN_PREPARED_QUEUE_OFFSET",
        "PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET",
        IGNORED,
        "decisions name halves by commit-log offset and transaction id",
    ),
    ("__transactionId__", "PROPERTY_TRANSACTION_ID", SERVED, "a half's transaction id"),
    (
        "TRANSACTION_CHECK_TIMES",
        "PROPERTY_TRANSACTION_CHECK_TIMES",
        SERVED,
        "set on check-backs and parked halves",
    ),
    ("INSTANCE_ID", "PROPERTY_INSTANCE_ID", IGNORED, "namespaces are topic-name prefixes only"),
    (
        "CORRELATION_ID",
        "PROPERTY_CORRELATION_ID",
        IGNORED,
        "request-reply is not served (SEND_REPLY_MESSAGE is refused)",
    ),
    (
        "REPLY_TO_CLIENT",
        "PROPERTY_MESSAGE_REPLY_TO_CLIENT",
        IGNORED,
        "request-reply is not served (SEND_REPLY_MESSAGE is refused)",
    ),
    (
        "TTL",
        "PROPERTY_MESSAGE_TTL",
        IGNORED,
        "request-reply is not served (SEND_REPLY_MESSAGE is refused)",
    ),
    (
        "ARRIVE_TIME",
        "PROPERTY_REPLY_MESSAGE_ARRIVE_TIME",
        IGNORED,
        "request-reply is not served (SEND_REPLY_MESSAGE is refused)",
    ),
    (
        "PUSH_REPLY_TIME",
        "PROPERTY_PUSH_REPLY_TIME",
        IGNORED,
        "request-reply is not served (SEND_REPLY_MESSAGE is refused)",
    ),
    ("CLUSTER", "PROPERTY_CLUSTER", IGNORED, "request-reply is not served; one cluster"),
    (
        "MSG_TYPE",
        "PROPERTY_MESSAGE_TYPE",
        IGNORED,
        "request-reply is not served (SEND_REPLY_MESSAGE is refused)",
    ),
    (
        "POP_CK",
        "PROPERTY_POP_CK",
        IGNORED,
        "set by pop consumers on what they received; the broker keeps its own state",
    ),
    (
        "POP_CK_OFFSET",
        "PROPERTY_POP_CK_OFFSET",
        IGNORED,
        "set by pop consumers on what they received; the broker keeps its own state",
    ),
    (
        "1ST_POP_TIME",
        "PROPERTY_FIRST_POP_TIME",
        IGNORED,
        "set by pop consumers on what they received; the broker keeps its own state",
    ),
    (
        "__SHARDINGKEY",
        "PROPERTY_SHARDING_KEY",
        SERVED,
        "gRPC `message_group` (FIFO); remoting producers pick the queue",
    ),
    (
        "PROPERTY_FORWARD_QUEUE_ID",
        "PROPERTY_FORWARD_QUEUE_ID",
        IGNORED,
        "static topics are not served",
    ),
    ("REDIRECT", "PROPERTY_REDIRECT", IGNORED, "static topics are not served"),
    (
        "INNER_MULTI_DISPATCH",
        "PROPERTY_INNER_MULTI_DISPATCH",
        IGNORED,
        "light message queues are not served: the message is stored in its own topic only",
    ),
    (
        "INNER_MULTI_QUEUE_OFFSET",
        "PROPERTY_INNER_MULTI_QUEUE_OFFSET",
        IGNORED,
        "light message queues are not served",
    ),
    (
        "TRACE_CONTEXT",
        "PROPERTY_TRACE_CONTEXT",
        IGNORED,
        "a client's tracing context, delivered as sent",
    ),
    (
        "TIMER_DELAY_SEC",
        "PROPERTY_TIMER_DELAY_SEC",
        SERVED,
        "timer: delivered that many seconds later",
    ),
    ("TIMER_DELIVER_MS", "PROPERTY_TIMER_DELIVER_MS", SERVED, "timer: delivered at that time"),
    ("__BORNHOST", "PROPERTY_BORN_HOST", IGNORED, "the record's born host is the producer's"),
    (
        "BORN_TIMESTAMP",
        "PROPERTY_BORN_TIMESTAMP",
        IGNORED,
        "the record's born timestamp is the producer's",
    ),
    (
        "__RMQ.TRANSIENT.",
        "PROPERTY_TRANSIENT_PREFIX",
        IGNORED,
        "a client-side prefix; such properties are stored as sent",
    ),
    (
        "__RMQ.TRANSIENT.TOPIC_SYS_FLAG",
        "PROPERTY_TRANSIENT_TOPIC_CONFIG",
        IGNORED,
        "set by clients on the messages they pull",
    ),
    (
        "__RMQ.TRANSIENT.GROUP_SYS_FLAG",
        "PROPERTY_TRANSIENT_GROUP_CONFIG",
        IGNORED,
        "set by clients on the messages they pull",
    ),
    (
        "TIMER_ENQUEUE_MS",
        "PROPERTY_TIMER_ENQUEUE_MS",
        IGNORED,
        "RocketMQ's timer wheel bookkeeping",
    ),
    (
        "TIMER_DEQUEUE_MS",
        "PROPERTY_TIMER_DEQUEUE_MS",
        IGNORED,
        "RocketMQ's timer wheel bookkeeping",
    ),
    (
        "TIMER_ROLL_TIMES",
        "PROPERTY_TIMER_ROLL_TIMES",
        IGNORED,
        "RocketMQ's timer wheel bookkeeping",
    ),
    ("TIMER_OUT_MS", "PROPERTY_TIMER_OUT_MS", IGNORED, "RocketMQ's timer wheel bookkeeping"),
    (
        "TIMER_DEL_UNIQKEY",
        "PROPERTY_TIMER_DEL_UNIQKEY",
        SERVED,
        "recalls the pending timer message `<topic>+<message id>` due at the marker's "
        "`TIMER_DELIVER_MS` (sent alone; in a batch or a transaction: `MESSAGE_ILLEGAL`)",
    ),
    (
        "TIMER_DELAY_LEVEL",
        "PROPERTY_TIMER_DELAY_LEVEL",
        IGNORED,
        "RocketMQ's timer wheel bookkeeping",
    ),
    ("TIMER_DELAY_MS", "PROPERTY_TIMER_DELAY_MS", SERVED, "timer: delivered that many ms later"),
    (
        "__CRC32#",
        "PROPERTY_CRC32",
        IGNORED,
        "records carry their own CRC; gRPC deliveries a body digest",
    ),
    (
        "DLQ_ORIGIN_TOPIC",
        "PROPERTY_DLQ_ORIGIN_TOPIC",
        IGNORED,
        "dead-letter copies carry RETRY_TOPIC instead",
    ),
    (
        "DLQ_ORIGIN_MESSAGE_ID",
        "PROPERTY_DLQ_ORIGIN_MESSAGE_ID",
        IGNORED,
        "dead-letter copies carry ORIGIN_MESSAGE_ID instead",
    ),
)

#: Subscription expression types and consumption styles, remoting and gRPC: (where, name,
#: what txmq does, how or why, how a broker shows it: ``code:<n>`` a remoting request code
#: that is served exactly when the row is, ``rpc:<Name>`` a gRPC RPC that is served exactly
#: when the row is, ``expr:<TYPE>`` an expression type CHECK_CLIENT_CONFIG accepts exactly
#: when the row is served).
SUBSCRIPTION_TYPES: tuple[tuple[str, str, str, str, str], ...] = (
    ("remoting `ExpressionType`", "TAG", SERVED, "`*`, or tags joined by `\\|\\|`", "expr:TAG"),
    (
        "remoting `ExpressionType`",
        "SQL92",
        SERVED,
        "property filters (`enablePropertyFilter`)",
        "expr:SQL92",
    ),
    (
        "remoting `ExpressionType`",
        "any other (e.g. class filters)",
        REFUSED,
        'CHECK_CLIENT_CONFIG and PULL: `SYSTEM_ERROR`, "does not support consumer to filter message by ..."',
        "expr:CLASS",
    ),
    ("gRPC `FilterType`", "TAG", SERVED, "as remoting TAG", "rpc:ReceiveMessage"),
    ("gRPC `FilterType`", "SQL", SERVED, "as remoting SQL92", "rpc:ReceiveMessage"),
    ("gRPC `FilterType`", "FILTER_TYPE_UNSPECIFIED", SERVED, "read as TAG", "rpc:ReceiveMessage"),
    ("remoting consumer", "push (long-polled PULL_MESSAGE)", SERVED, "", "code:11"),
    ("remoting consumer", "pull (PULL_MESSAGE)", SERVED, "", "code:11"),
    (
        "remoting consumer",
        "lite pull (LITE_PULL_MESSAGE)",
        REFUSED,
        "`REQUEST_CODE_NOT_SUPPORTED` (3)",
        "code:361",
    ),
    (
        "remoting consumer",
        "pop (POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, BATCH_ACK_MESSAGE)",
        SERVED,
        "the same POP state as gRPC ReceiveMessage, durable in the commit log",
        "code:200050",
    ),
    ("gRPC `ClientType`", "PUSH_CONSUMER", SERVED, "ReceiveMessage / AckMessage", "rpc:AckMessage"),
    (
        "gRPC `ClientType`",
        "SIMPLE_CONSUMER",
        SERVED,
        "ReceiveMessage / AckMessage (POP consumption)",
        "rpc:ReceiveMessage",
    ),
    (
        "gRPC `ClientType`",
        "PULL_CONSUMER",
        REFUSED,
        "PullMessage and the offset RPCs answer `NOT_IMPLEMENTED`",
        "rpc:PullMessage",
    ),
    (
        "gRPC `ClientType`",
        "LITE_PUSH_CONSUMER, LITE_SIMPLE_CONSUMER",
        REFUSED,
        "lite topics: `UNSUPPORTED`; SyncLiteSubscription answers `NOT_IMPLEMENTED`",
        "rpc:SyncLiteSubscription",
    ),
)

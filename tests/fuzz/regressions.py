"""Inputs that once broke a parser's contract, kept as regression tests.

Each entry is ``(target, name, input)``; ``test_corpus_replay.test_regression`` runs the input
through its target, and ``test_findings.py`` checks the error each kind gets now.  The inputs the
fuzzer wrote (``crash-<sha1>``) are kept as they are under ``findings/<target>/``; the ones
below were written by hand to pin each fix down.
"""

from __future__ import annotations

import gzip
import os
import struct

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb


def _ack(handle: str) -> bytes:
    req = spb.AckMessageRequest()
    req.entries.add(message_id="m", receipt_handle=handle)
    return b"\x02" + req.SerializeToString()


def _send_with_message_id(message_id: str) -> bytes:
    m = pb.Message(body=b"x")
    m.topic.name = "TopicA"
    m.system_properties.message_id = message_id
    return b"\x00" + spb.SendMessageRequest(messages=[m]).SerializeToString()


def send_gzip_body(body: bytes) -> bytes:
    """A SendMessage request whose one message has a GZIP-encoded ``body``."""
    m = pb.Message(body=body)
    m.topic.name = "TopicA"
    m.system_properties.message_id = "U1"
    m.system_properties.body_encoding = pb.GZIP
    return b"\x00" + spb.SendMessageRequest(messages=[m]).SerializeToString()


def _stored_v2_negative_topic() -> bytes:
    """A stored record with the V2 magic code and a topic length of -1."""
    head = struct.pack(
        ">iiiiiqqiq8sq8siqi", 96, -626843477, 0, 0, 0, 0, 0, 0, 0, b"\0" * 8, 0, b"\0" * 8, 0, 0, 0
    )
    return head + struct.pack(">h", -1) + b"\0\0" + b"\0" * 4


REGRESSIONS: list[tuple[str, str, bytes]] = [
    # fastjson.loads: deep nesting escaped as RecursionError (now ValueError).
    ("fastjson", "fastjson-deep-array", b"[" * 5000),
    ("fastjson", "fastjson-deep-object-key", b"{" * 5000),
    # load_acl_file: a file that is not UTF-8 escaped as UnicodeDecodeError.
    ("acl_file", "acl-not-utf8", b"accounts:\n  - accessKey: \xff\xfe\n"),
    # parse_acl_document: unknown top-level keys of mixed types could not be sorted (TypeError).
    ("acl_file", "acl-unknown-int-and-str-keys", b"1: a\nb: c\n"),
    # load_acl_file: YAML nested deeper than the interpreter's recursion limit.
    ("acl_file", "acl-deep-flow-sequence", b"[" * 5000),
    # compile_sql: deep NOT chains and deep parentheses overflowed the stack (RecursionError).
    ("sql_filter", "sql-deep-not", b"NOT " * 3000 + b"a = 1"),
    ("sql_filter", "sql-deep-minus", b"a = " + b"-" * 3000 + b"1"),
    # SqlFilter.matches_stored: a V2 record with a negative topic length raised ProtocolError.
    ("sql_filter", "sql-stored-negative-topic", b"a IS NULL\x00" + _stored_v2_negative_topic()),
    # parse_handle: a non-ASCII digit passed isdigit() and failed int() (ValueError).
    ("grpc_request", "grpc-handle-superscript-digit", _ack("x-\u00b2-1-n")),
    # check_message: a message id holding a property separator passed the checks and could
    # not be stored (ProtocolError at store time, answered as an internal error).
    ("grpc_request", "grpc-message-id-separator", _send_with_message_id("a\x01b")),
    # to_message_ext: a gzip body inflated without a limit (100 KiB of zeros from 130 bytes;
    # gigabytes from a few MiB): now refused past maxMessageSize, MESSAGE_BODY_TOO_LARGE.
    ("grpc_request", "grpc-gzip-bomb", send_gzip_body(gzip.compress(bytes(100 * 1024)))),
    # parse_check_state: a document that is not a map, and bytes that are not UTF-8.
    ("check_state", "check-state-list", b"[1]"),
    ("check_state", "check-state-not-utf8", b"\xff"),
    ("check_state", "check-state-short-row", b'{"checks": {"t": [1]}}'),
    # JSON bodies nested deeper than the recursion limit: RecursionError escaped each parser
    # (heartbeat, queue locks and their answer, transactional offsets) and the ACL's reading.
    *[("remoting_body", f"body-deep-json-{k}", bytes([k]) + b"[" * 5000) for k in range(4)],
    # The ACL's reading of a heartbeat iterated a consumerDataSet that was a number (TypeError).
    ("remoting_body", "heartbeat-consumer-data-set-number", b'\x00{"consumerDataSet": 5}'),
    (
        "remoting_body",
        "heartbeat-subscription-data-set-number",
        b'\x00{"consumerDataSet": [{"groupName": "g", "subscriptionDataSet": 5}]}',
    ),
    # Infinity (JSON) or inf (msgpack) where an integer belongs: int() raised OverflowError,
    # which no parser caught.
    ("check_state", "check-state-infinity", b'{"checks": {"t": [Infinity, 1]}}'),
    ("op_record", "op-halves-inf", b"\x83\xa1v\x01\xa1k\xa6commit\xa1h\x91\xcb\x7f\xf0" + bytes(6)),
    (
        "remoting_body",
        "txn-offsets-generation-infinity",
        b'\x03{"group": "g", "generation": Infinity, "clientId": "c", "offsets": []}',
    ),
    ("store_files", "topics-counter-infinity", b'\x00{"dataVersion": {"counter": Infinity}}'),
    ("store_files", "offsets-infinity", b'\x01{"offsetTable": {"a@g": {"1": Infinity}}}'),
    ("store_files", "checkpoint-version-infinity", b'\x02{"formatVersion": Infinity}'),
    # The store's JSON files nested past the recursion limit (RecursionError).
    *[("store_files", f"store-deep-json-{k}", bytes([k]) + b"[" * 5000) for k in range(3)],
    # OpRecord.decode: a RESUME record carrying "c" kept it, and did not encode back the same.
    (
        "op_record",
        "op-resume-with-committed",
        b"\x85\xa1v\x01\xa1k\xa6resume\xa1g\xa2pg\xa1t\x91\xa1x\xa1c\x91\xa1y",
    ),
]

FINDINGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "findings")


def _found() -> list[tuple[str, str, bytes]]:
    out = []
    for target in sorted(os.listdir(FINDINGS)):
        for name in sorted(os.listdir(os.path.join(FINDINGS, target))):
            with open(os.path.join(FINDINGS, target, name), "rb") as fh:
                out.append((target, f"{target}-{name[:14]}", fh.read()))
    return out


REGRESSIONS += _found()

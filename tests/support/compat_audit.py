"""The audit tables of docs/compatibility.md, made from what a running broker answers: every
request code of RocketMQ 5.3 (served, or refused naming it) and every RPC of
``apache.rocketmq.v2.MessagingService`` (served, or NOT_IMPLEMENTED naming it); and from the
declarations of :mod:`txmq.protocol.rocketmq_codes`: every ``MessageConst`` property and every
subscription type (served, ignored on purpose, or refused).

``tests/broker/test_request_code_audit.py`` and ``tests/broker/test_property_audit.py`` fail
when the document, the declarations and the broker disagree; rewrite the tables with::

    .venv/bin/python -m tests.support.compat_audit
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from txmq.protocol.codes import RequestCode
from txmq.protocol.rocketmq_codes import (
    BROKER_TO_CLIENT,
    IGNORED,
    ROCKETMQ_MESSAGE_PROPERTIES,
    ROCKETMQ_REQUEST_CODES,
    SENT_BY_TXMQ,
    SUBSCRIPTION_TYPES,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
MD = (("x-mq-client-id", "audit-client"), ("x-mq-language", "PYTHON"))


def request_code_table(served: frozenset[int]) -> str:
    rows = ["| code | RocketMQ name | txmq |", "|---:|---|---|"]
    for code, name in sorted(ROCKETMQ_REQUEST_CODES.items()):
        if code in served:
            what = "served"
        elif code in SENT_BY_TXMQ:
            what = "sent by the broker to clients"
        elif code in BROKER_TO_CLIENT:
            what = "a broker-to-client request txmq does not send"
        else:
            what = "refused: `REQUEST_CODE_NOT_SUPPORTED` (3), the remark names it"
        rows.append(f"| {code} | `{name}` | {what} |")
    for code in sorted(c for c in served if c not in ROCKETMQ_REQUEST_CODES):
        rows.append(f"| {code} | `{RequestCode(code).name}` (txmq's own) | served |")
    return "\n".join(rows)


def grpc_table(methods: list[str], not_implemented: set[str]) -> str:
    rows = ["| RPC | txmq |", "|---|---|"]
    for m in methods:
        what = (
            "answered `NOT_IMPLEMENTED`, the message names it" if m in not_implemented else "served"
        )
        rows.append(f"| `{m}` | {what} |")
    return "\n".join(rows)


def _verdict(what: str, note: str) -> str:
    word = "ignored on purpose" if what == IGNORED else what
    return f"{word}: {note}" if note else word


def property_table() -> str:
    rows = ["| property | RocketMQ constant | txmq |", "|---|---|---|"]
    for key, const, what, note in ROCKETMQ_MESSAGE_PROPERTIES:
        rows.append(f"| `{key}` | `{const}` | {_verdict(what, note)} |")
    return "\n".join(rows)


def subscription_table() -> str:
    rows = ["| kind | type | txmq |", "|---|---|---|"]
    for where, name, what, note, _probe in SUBSCRIPTION_TYPES:
        rows.append(f"| {where} | {name} | {_verdict(what, note)} |")
    return "\n".join(rows)


def grpc_methods() -> list[str]:
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb

    return list(spb.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name)


def probe_grpc(port: int) -> set[str]:
    """The RPCs that answer NOT_IMPLEMENTED to an empty request (Telemetry, a bidirectional
    stream the check-back runs on, is served: its own tests cover it)."""
    import grpc

    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb

    service = spb.DESCRIPTOR.services_by_name["MessagingService"]
    out: set[str] = set()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        for name, method in service.methods_by_name.items():
            if method.client_streaming:
                continue
            request_cls: Any = getattr(spb, method.input_type.name)
            response_cls: Any = getattr(spb, method.output_type.name)
            path = f"/apache.rocketmq.v2.MessagingService/{name}"
            ser, de = request_cls.SerializeToString, response_cls.FromString
            status: Any
            if method.server_streaming:
                stream = ch.unary_stream(path, request_serializer=ser, response_deserializer=de)
                status = list(stream(request_cls(), metadata=MD, timeout=10))[0].status
            else:
                unary = ch.unary_unary(path, request_serializer=ser, response_deserializer=de)
                status = unary(request_cls(), metadata=MD, timeout=10).status
            if status.code == pb.NOT_IMPLEMENTED:
                assert name in status.message, f"{name}'s NOT_IMPLEMENTED does not name it"
                out.add(name)
    return out


def replace_section(doc: str, name: str, table: str) -> str:
    begin, end = f"<!-- audit:{name} -->", f"<!-- /audit:{name} -->"
    pattern = re.compile(re.escape(begin) + r"\n(?:.*?\n)?" + re.escape(end), re.S)
    assert pattern.search(doc), f"docs/compatibility.md lacks the markers {begin} ... {end}"
    return pattern.sub(lambda _: f"{begin}\n{table}\n{end}", doc)


def tables(served: frozenset[int], grpc_port: int) -> dict[str, str]:
    return {
        "request-codes": request_code_table(served),
        "grpc-rpcs": grpc_table(grpc_methods(), probe_grpc(grpc_port)),
        "message-properties": property_table(),
        "subscription-types": subscription_table(),
    }


def main() -> int:
    from tests.conftest import BrokerThread
    from txmq.broker.config import BrokerConfig

    with tempfile.TemporaryDirectory() as store:
        config = BrokerConfig(
            store_path_root_dir=store, listen_port=0, grpc_server_enable=True, grpc_server_port=0
        )
        bt = BrokerThread(config)
        controller = bt.start()
        try:
            made = tables(controller.served_request_codes(), controller.grpc_port)
        finally:
            bt.stop()
    doc = DOC.read_text(encoding="utf-8")
    for name, table in made.items():
        doc = replace_section(doc, name, table)
    DOC.write_text(doc, encoding="utf-8")
    print(f"rewrote the audit tables of {DOC.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

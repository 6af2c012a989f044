"""Every RocketMQ 5.3 message property and subscription type is served, ignored on purpose or
refused, as ``txmq.protocol.rocketmq_codes`` declares and docs/compatibility.md says: the
document's tables are the declarations; each served property does on a running broker what its
row says (``tests/support/property_probes.py``), an ignored one goes through unchanged; each
subscription row is what a running broker does."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from tests.conftest import BrokerThread
from tests.support.brokers import started
from tests.support.compat_audit import (
    DOC,
    probe_grpc,
    property_table,
    replace_section,
    subscription_table,
)
from tests.support.property_probes import PROBES
from tests.support.raw import connected
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import ResponseCode
from txmq.protocol.rocketmq_codes import (
    IGNORED,
    REFUSED,
    ROCKETMQ_MESSAGE_PROPERTIES,
    SERVED,
    SUBSCRIPTION_TYPES,
)


def test_the_document_holds_the_declared_tables() -> None:
    doc = DOC.read_text(encoding="utf-8")
    for name, table in (
        ("message-properties", property_table()),
        ("subscription-types", subscription_table()),
    ):
        assert replace_section(doc, name, table) == doc, (
            f"docs/compatibility.md's {name} table is not the declaration: rewrite it with "
            "`.venv/bin/python -m tests.support.compat_audit`"
        )


def test_every_property_is_declared_once_with_a_reason() -> None:
    keys = [k for k, _, _, _ in ROCKETMQ_MESSAGE_PROPERTIES]
    assert len(keys) == len(set(keys)) == 64, (
        "RocketMQ 5.3's MessageConst has 64 properties (65 strings, KEY_SEPARATOR is none)"
    )
    for key, const, what, note in ROCKETMQ_MESSAGE_PROPERTIES:
        assert what in (SERVED, IGNORED, REFUSED), key
        assert const.startswith("PROPERTY_") or const == key, key
        assert what == SERVED or note, f"{key} is {what} without saying why"


SERVED_KEYS = [key for key, _, what, _ in ROCKETMQ_MESSAGE_PROPERTIES if what == SERVED]


def test_every_served_property_has_a_probe() -> None:
    """A property declared served is tried on a broker (below): declaring one without saying
    how to try it fails here."""
    missing = [key for key in SERVED_KEYS if key not in PROBES]
    assert not missing, (
        f"served properties without a probe in tests/support/property_probes.py: {missing}"
    )
    assert not set(PROBES) - set(SERVED_KEYS), "probes of properties not declared served"
    refused = [key for key, _, what, _ in ROCKETMQ_MESSAGE_PROPERTIES if what == REFUSED]
    assert not refused, f"refused properties need a probe of their refusal: {refused}"


@pytest.mark.parametrize("key", SERVED_KEYS)
async def test_a_served_property_does_what_the_table_says(
    make_broker_config: Callable[..., BrokerConfig], key: str
) -> None:
    """Each served property sent to a broker (or set by it) with the effect the table names;
    the refusals it documents."""
    if key == "__SHARDINGKEY":
        pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")
    async with started(make_broker_config(grpc_server_enable=True, grpc_server_port=0)) as b:
        async with connected(b.address) as c:
            await PROBES[key](b, c)


async def test_ignored_properties_are_stored_and_delivered_as_sent(
    broker: BrokerController,
) -> None:
    ignored = {
        key: f"audit-{i}"
        for i, (key, _, what, _) in enumerate(ROCKETMQ_MESSAGE_PROPERTIES)
        if what == IGNORED
    }
    async with connected(broker.address) as c:
        resp = await c.send("audit-props", b"ignored", props=ignored)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        (got,) = await c.pull_all("audit-props", queues=1)
    changed = {
        k: (v, got.properties.get(k)) for k, v in ignored.items() if got.properties.get(k) != v
    }
    assert not changed, f"ignored properties the broker changed or dropped: {changed}"
    assert got.body == b"ignored"


def test_subscription_types_are_what_the_broker_does(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")
    bt = broker_thread_factory(grpc_server_enable=True, grpc_server_port=0)
    controller = bt.controller
    assert controller is not None
    served_codes = controller.served_request_codes()
    not_implemented = probe_grpc(controller.grpc_port)

    async def accepts(kind: str) -> bool:
        async with connected(controller.address) as c:
            expression = "a > 1" if kind == "SQL92" else "*"
            resp = await c.check_client_config("audit", "audit", expression, kind)
        return bool(resp.code == ResponseCode.SUCCESS)

    for where, name, what, _note, probe in SUBSCRIPTION_TYPES:
        kind, _, arg = probe.partition(":")
        if kind == "code":
            served = int(arg) in served_codes
        elif kind == "rpc":
            served = arg not in not_implemented
        else:
            assert kind == "expr" and re.fullmatch(r"[A-Z0-9]+", arg), probe
            served = bt.call(accepts(arg))
        assert served == (what == SERVED), f"{where} {name} is declared {what}; {probe} says not"

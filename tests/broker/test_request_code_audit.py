"""Nothing silently mis-served: every RocketMQ 5.3 request code the broker does not serve is
refused with REQUEST_CODE_NOT_SUPPORTED naming it, every one it serves does its job on a running
broker (``tests/support/request_probes.py``), every gRPC RPC it does not serve answers
NOT_IMPLEMENTED naming it, and docs/compatibility.md's audit tables say exactly what the broker
does (regenerate them with ``python -m tests.support.compat_audit``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import BrokerThread
from tests.support.brokers import started
from tests.support.compat_audit import DOC, grpc_methods, probe_grpc, replace_section, tables
from tests.support.grpc_probes import PROBES as GRPC_PROBES
from tests.support.raw import connected
from tests.support.request_probes import CONFIG, PROBES
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.rocketmq_codes import ROCKETMQ_REQUEST_CODES

pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")


async def test_every_unserved_rocketmq_request_is_refused_by_name(
    broker: BrokerController,
) -> None:
    served = broker.served_request_codes()
    async with connected(broker.address) as c:
        refused = 0
        for code, name in sorted(ROCKETMQ_REQUEST_CODES.items()):
            if code in served:
                continue
            resp = await c.call(code, {})
            assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, (code, resp.remark)
            assert name in (resp.remark or ""), (code, resp.remark)
            refused += 1
        # the broker kept serving through all of it
        assert (await c.send("audit", b"still served")).code == ResponseCode.SUCCESS
        resp = await c.call(9999, {})
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert "9999" in (resp.remark or "")
    assert refused > 100  # RocketMQ has ~160 codes; a handful are served


def test_the_compatibility_tables_are_what_the_broker_does(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    bt = broker_thread_factory(grpc_server_enable=True, grpc_server_port=0)
    assert bt.controller is not None
    made = tables(bt.controller.served_request_codes(), bt.controller.grpc_port)
    doc = DOC.read_text(encoding="utf-8")
    for name, table in made.items():
        assert replace_section(doc, name, table) == doc, (
            f"docs/compatibility.md's {name} table is not what the broker does: rewrite it "
            "with `.venv/bin/python -m tests.support.compat_audit`"
        )


def test_every_served_request_code_has_a_probe(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    """A request code the broker serves is tried (below): serving one without saying how to
    try it fails here."""
    bt = broker_thread_factory()
    assert bt.controller is not None
    served = bt.controller.served_request_codes()
    missing = sorted(RequestCode(c).name for c in served if c not in PROBES)
    assert not missing, (
        f"served request codes without a probe in tests/support/request_probes.py: {missing}"
    )
    assert not set(PROBES) - served, "probes of request codes the broker does not serve"


@pytest.mark.parametrize("code", sorted(PROBES), ids=lambda c: RequestCode(c).name)
async def test_a_served_request_does_its_job(
    make_broker_config: Callable[..., BrokerConfig], code: int
) -> None:
    """Each served request code sent to a broker, with the answer and the effect checked."""
    async with started(make_broker_config(**CONFIG.get(code, {}))) as b:
        async with connected(b.address) as c:
            await PROBES[code](b, c)


def test_every_served_rpc_has_a_probe(broker_thread_factory: Callable[..., BrokerThread]) -> None:
    bt = broker_thread_factory(grpc_server_enable=True, grpc_server_port=0)
    assert bt.controller is not None
    not_implemented = probe_grpc(bt.controller.grpc_port)
    served = {m for m in grpc_methods() if m not in not_implemented}
    missing = sorted(served - set(GRPC_PROBES))
    assert not missing, f"served RPCs without a probe in tests/support/grpc_probes.py: {missing}"
    assert not set(GRPC_PROBES) - served, "probes of RPCs the broker does not serve"


@pytest.mark.parametrize("rpc", sorted(GRPC_PROBES))
async def test_a_served_rpc_does_its_job(
    make_broker_config: Callable[..., BrokerConfig], rpc: str
) -> None:
    """Each served RPC sent to a broker over grpc.aio, with the answer and the effect
    checked."""
    import grpc

    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

    async with started(make_broker_config(grpc_server_enable=True, grpc_server_port=0)) as b:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc_port}") as ch:
            await GRPC_PROBES[rpc](b, sgrpc.MessagingServiceStub(ch))

"""The committed protobuf/gRPC modules (broker/grpc/v2) are what the .proto files generate."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) is not installed")

from txmq.broker.grpc import codegen  # noqa: E402

COMMITTED = Path(codegen.__file__).resolve().parent / "v2"


def test_generated_modules_match_the_proto_files(tmp_path: Path) -> None:
    written = codegen.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(codegen.OUTPUTS)
    for p in written:
        fresh = p.read_text(encoding="utf-8")
        committed = (COMMITTED / p.name).read_text(encoding="utf-8")
        assert fresh == committed, (
            f"broker/grpc/v2/{p.name} differs from what the .proto files generate: "
            "run `make grpc-gen` and commit the result"
        )


def test_public_names_and_field_numbers() -> None:
    """Spot checks against the public apache.rocketmq.v2 definitions."""
    from txmq.broker.grpc.v2 import definition_pb2, service_pb2

    sp = definition_pb2.SystemProperties.DESCRIPTOR
    assert sp.full_name == "apache.rocketmq.v2.SystemProperties"
    assert sp.fields_by_name["message_group"].number == 17
    assert sp.fields_by_name["receipt_handle"].number == 12
    tc = service_pb2.TelemetryCommand.DESCRIPTOR
    assert tc.fields_by_name["recover_orphaned_transaction_command"].number == 5
    svc = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
    assert svc.full_name == "apache.rocketmq.v2.MessagingService"
    assert len(svc.methods) == 17

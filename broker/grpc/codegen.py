"""Generate the Python modules of the RocketMQ 5 protobuf definitions (``vendor/protos/``).

The generated modules are committed in ``vendor/v2/``, with type stubs (``.pyi``) of the message
modules so that the code using them is type-checked; ``tests/compat/test_grpc_codegen.py``
regenerates them into a temporary folder and compares, so they never drift from the ``.proto``
files.  Run ``python -m txmq.broker.grpc.codegen`` (or ``make grpc-gen``) after editing a
``.proto`` file; it needs ``grpcio-tools`` at the version the Makefile pins (``make grpc-gen``
runs it in the venv ``make grpc-tools`` makes: the output depends on the version, and the
oldest that serves keeps the ``grpc`` extra's floors low).

protoc names the modules after the proto paths (``apache/rocketmq/v2/...``); they are moved
into one flat folder and their imports rewritten to ``txmq.broker.grpc.vendor.v2``, so the
package needs no top-level ``apache`` package.  The descriptors keep the public file names and
the ``apache.rocketmq.v2`` package, which is what clients see on the wire.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parent / "vendor"
PROTO_ROOT = VENDOR / "protos"
PROTO_FILES = ("apache/rocketmq/v2/definition.proto", "apache/rocketmq/v2/service.proto")
PACKAGE = "txmq.broker.grpc.vendor.v2"
OUTPUTS = (
    "definition_pb2.py",
    "definition_pb2.pyi",
    "service_pb2.py",
    "service_pb2.pyi",
    "service_pb2_grpc.py",
)


def generate(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the generated modules into ``out_dir``; returns their paths."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *PROTO_FILES,
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit status {rc}")
        written = []
        for name in OUTPUTS:
            src = Path(tmp) / "apache" / "rocketmq" / "v2" / name
            text = src.read_text(encoding="utf-8")
            text = text.replace("from apache.rocketmq.v2 import", f"from {PACKAGE} import")
            dst = out / name
            dst.write_text(text, encoding="utf-8")
            written.append(dst)
    return written


def main() -> int:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else VENDOR / "v2"
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(tmp)
        for f in files:
            shutil.copyfile(f, target / f.name)
            print(f"wrote {target / f.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

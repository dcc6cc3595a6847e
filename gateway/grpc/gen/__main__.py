"""Regenerate the stubs from the proto: `python -m gateway.grpc.gen [OUT_DIR]`."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = ROOT / "proto"
PROTO = "llmgateway/v1/gateway.proto"
PACKAGE_DIR = Path(__file__).resolve().parent
OUTPUTS = ("gateway_pb2.py", "gateway_pb2.pyi", "gateway_pb2_grpc.py")
# protoc writes imports relative to the proto root; the stubs live in this package instead.
_IMPORT = b"from llmgateway.v1 import gateway_pb2 as"
_PACKAGE_IMPORT = b"from gateway.grpc.gen import gateway_pb2 as"
# Generated code is untyped (and protobuf ships no stubs): type-check its users, not it.
_HEADER = b"# mypy: ignore-errors\n"


class GenerateError(Exception):
    """protoc failed or produced something unexpected."""


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on the proto and write the three stub files into `out_dir`."""
    from grpc_tools import protoc  # a dev dependency: only regeneration needs it

    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO_ROOT / PROTO),
        ]
        if protoc.main(args) != 0:
            raise GenerateError(f"protoc failed on {PROTO}")
        written = []
        for name in OUTPUTS:
            src = Path(tmp) / "llmgateway" / "v1" / name
            data = _HEADER + src.read_bytes().replace(_IMPORT, _PACKAGE_IMPORT)
            dst = out_dir / name
            dst.write_bytes(data)
            written.append(dst)
    return written


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else PACKAGE_DIR
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

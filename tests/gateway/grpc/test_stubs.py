"""The checked-in stubs are exactly what the documented command generates from the proto."""

from __future__ import annotations

from pathlib import Path

from gateway.grpc.gen import gateway_pb2
from gateway.grpc.gen.__main__ import OUTPUTS, PACKAGE_DIR, generate


def test_generated_stubs_are_up_to_date(tmp_path: Path) -> None:
    written = generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(OUTPUTS)
    for name in OUTPUTS:
        fresh = (tmp_path / name).read_bytes()
        assert (PACKAGE_DIR / name).read_bytes() == fresh, (
            f"gateway/grpc/gen/{name} is stale: run `python -m gateway.grpc.gen`"
        )


def test_stubs_import_as_a_package() -> None:
    assert gateway_pb2.DESCRIPTOR.package == "llmgateway.v1"
    assert gateway_pb2.DESCRIPTOR.name == "llmgateway/v1/gateway.proto"
    assert "Inference" in gateway_pb2.DESCRIPTOR.services_by_name

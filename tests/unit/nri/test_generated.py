"""The checked-in NRI and ttrpc message code must be what the vendored protos generate."""

from __future__ import annotations

from pathlib import Path

from koord.nri import api_pb2, generate, ttrpc_pb2


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    for name in generate.OUTPUTS:
        fresh = (tmp_path / name).read_text()
        checked_in = (generate.PROTO_DIR / name).read_text()
        assert fresh == checked_in, f"{name} is stale: run python -m koord.nri.generate"


def test_service_names_are_upstreams() -> None:
    services = {s.full_name: {m.name for m in s.methods} for s in api_pb2.DESCRIPTOR.services_by_name.values()}
    assert services["nri.pkg.api.v1alpha1.Runtime"] == {"RegisterPlugin", "UpdateContainers"}
    assert {"Configure", "Synchronize", "Shutdown", "CreateContainer", "UpdateContainer", "StopContainer",
            "StateChange", "UpdatePodSandbox"} <= services["nri.pkg.api.v1alpha1.Plugin"]


def test_ttrpc_envelope_field_numbers() -> None:
    wire = {"Request": {"service": 1, "method": 2, "payload": 3, "timeout_nano": 4, "metadata": 5},
            "Response": {"status": 1, "payload": 2},
            "Status": {"code": 1, "message": 2, "details": 3}}
    for message, numbers in wire.items():
        descriptor = ttrpc_pb2.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in descriptor.fields} == numbers, message

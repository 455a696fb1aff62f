"""Regenerates the NRI and ttrpc message code from the .proto files beside this module.

The generated files are checked in so that installing the package needs no protoc;
tests/unit/nri/test_generated.py regenerates into a temp dir and fails when the checked-in
copy is stale. The protos are compiled as ``nri/api.proto`` and ``nri/ttrpc.proto`` (include
root ``src/koord``) so that their names in protobuf's descriptor pool cannot collide with
the hook protocol's ``api.proto``.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

PROTO_DIR = Path(__file__).resolve().parent
INCLUDE_ROOT = PROTO_DIR.parent
PROTOS = ("api.proto", "ttrpc.proto")
OUTPUTS = ("api_pb2.py", "api_pb2.pyi", "ttrpc_pb2.py", "ttrpc_pb2.pyi")


def generate(out_dir: Path) -> None:
    """Runs protoc; the outputs land in ``out_dir`` (flat, as they are checked in)."""
    import grpc_tools

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main([
            "protoc",
            f"-I{INCLUDE_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            *(str(PROTO_DIR / name) for name in PROTOS),
        ])
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc} on {', '.join(PROTOS)} in {PROTO_DIR}")
        for name in OUTPUTS:
            text = (Path(tmp) / PROTO_DIR.name / name).read_text()
            if name.endswith(".pyi"):
                text = _drop_keyword_names(text)
            (out_dir / name).write_text(text)


def _drop_keyword_names(stub: str) -> str:
    """Drops the stub lines of enum values named ``None`` (NRI's ``Field.None``): an annotation
    of ``None`` is a syntax error, so mypy would reject the whole stub. The value itself stays
    reachable as ``Field.Value("None")``."""
    return re.sub(r"^ *None: .*\n", "", stub, flags=re.M)


def main() -> int:
    generate(PROTO_DIR)
    print(f"regenerated {', '.join(OUTPUTS)} in {PROTO_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

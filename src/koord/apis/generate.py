"""Regenerates the hook protocol's Python code from api.proto.

The generated files are checked in so that installing the package needs no
protoc; tests/unit/test_generated.py regenerates into a temp dir and fails when
the checked-in copy is stale.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

PROTO_DIR = Path(__file__).resolve().parent / "runtime" / "v1alpha1"
PROTO = "api.proto"
OUTPUTS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_dir: Path) -> None:
    """Runs protoc into out_dir and makes the grpc module's import package-relative."""
    import grpc_tools

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    rc = protoc.main([
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO_DIR / PROTO),
    ])
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc} on {PROTO_DIR / PROTO}")
    grpc_file = out_dir / "api_pb2_grpc.py"
    text = re.sub(r"^import api_pb2 as", "from . import api_pb2 as", grpc_file.read_text(), flags=re.M)
    grpc_file.write_text(text)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        for name in OUTPUTS:
            (PROTO_DIR / name).write_text((Path(tmp) / name).read_text())
    print(f"regenerated {', '.join(OUTPUTS)} in {PROTO_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

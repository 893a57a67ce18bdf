"""Regenerate the Python stubs beside the .proto files.

Usage: python proto/generate.py [OUT_DIR]   (default: proto/, i.e. in place)

The stubs are committed; proto/tests/test_stubs.py regenerates them into a temporary directory and fails
on any difference, so an edited .proto without regenerated stubs cannot land.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_FILES = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "octavo").rglob("*.proto"))


def generate(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    # protoc finds the mypy plugin (protoc-gen-mypy) on PATH: use the one installed beside this interpreter.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        *PROTO_FILES,
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT)

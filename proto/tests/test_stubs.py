"""The committed stubs must be exactly what the pinned generators make from the .proto files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[1]


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("octavo_proto_generate", PROTO_ROOT / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    gen = _generator()
    gen.generate(tmp_path)  # type: ignore[attr-defined]
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert generated, "protoc generated nothing"
    stale = [str(rel) for rel in generated if (tmp_path / rel).read_bytes() != (PROTO_ROOT / rel).read_bytes()]
    assert not stale, f"stubs out of date, run `make proto`: {stale}"


def test_every_proto_has_its_stubs() -> None:
    for proto in (PROTO_ROOT / "octavo").rglob("*.proto"):
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            assert proto.with_name(proto.stem + suffix).exists(), f"{proto.stem}{suffix} missing"

"""The tidy ratchet (TigerBeetle's tidy.zig): size caps on product code, with today's exceptions listed.

A function (or method) may have at most FUNCTION_LINES_MAX lines, a class CLASS_LINES_MAX, a module
MODULE_LINES_MAX. EXCEPTIONS lists what is over its cap today, each with the size it may not grow past. The list
may only shrink: an exception that has grown fails, and so does one that is no longer needed (under the cap, or
gone), so the list stays true. Split what you touch rather than raising a number here.

`python tests/test_tidy.py` prints the list as the code stands (to shrink it after a split).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = [ROOT / "shared/octavo", ROOT / "client/octavo", ROOT / "cli/octavo",
           ROOT / "node/octavo", ROOT / "operator/octavo", ROOT / "sim/octavo"]
FUNCTION_LINES_MAX = 70
CLASS_LINES_MAX = 400
MODULE_LINES_MAX = 600

# name -> the most lines it may have. Names: a module's path from the repository root; a function or class as
# path::Qualified.name.
EXCEPTIONS: dict[str, int] = {
    'cli/octavo/cli/dev.py::cmd_up': 85,
    'client/octavo/client/client.py': 649,
    'client/octavo/client/dataset.py': 1074,
    'client/octavo/client/dataset.py::DatasetStore': 660,
    'client/octavo/client/dataset.py::DatasetStore.commit': 136,
    'client/octavo/client/reader.py::ReadHandle': 471,
    'client/octavo/client/writer.py::WriteHandle': 527,
    'client/octavo/spark/arrowio.py::Options.parse': 81,
    'node/octavo/node/compaction.py': 627,
    'node/octavo/node/config.py::NodeConfig.problems': 98,
    'node/octavo/node/dataplane.py::BookieService': 420,
    'node/octavo/node/reads.py::Reader.read_many': 85,
    'node/octavo/node/storage.py': 674,
    'node/octavo/node/storage.py::Storage': 581,
}


def sizes() -> dict[str, tuple[int, int]]:
    """Every module, class and function of product code over its cap: name -> (lines, cap)."""
    over: dict[str, tuple[int, int]] = {}
    for folder in PRODUCT:
        for path in sorted(folder.rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text()
            lines = len(text.splitlines())
            if lines > MODULE_LINES_MAX:
                over[rel] = (lines, MODULE_LINES_MAX)
            _walk(ast.parse(text, rel), rel, "", over)
    return over


def _walk(node: ast.AST, rel: str, prefix: str, over: dict[str, tuple[int, int]]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
            lines = (child.end_lineno or child.lineno) - first + 1
            cap = CLASS_LINES_MAX if isinstance(child, ast.ClassDef) else FUNCTION_LINES_MAX
            if lines > cap:
                over[f"{rel}::{name}"] = (lines, cap)
            _walk(child, rel, f"{name}.", over)
        else:
            _walk(child, rel, prefix, over)


def test_nothing_grows_past_its_cap_or_its_listed_size() -> None:
    found = sizes()
    problems = []
    for name, (lines, cap) in sorted(found.items()):
        allowed = EXCEPTIONS.get(name)
        if allowed is None:
            problems.append(f"{name}: {lines} lines, over the cap of {cap}: split it")
        elif lines > allowed:
            problems.append(f"{name}: {lines} lines, over its listed {allowed} (the list may only shrink)")
    assert not problems, "\n".join(problems)


def test_every_exception_is_still_needed() -> None:
    found = sizes()
    stale = [f"{name}: now {found[name][0] if name in found else 'under its cap or gone'}; listed {allowed}"
             for name, allowed in sorted(EXCEPTIONS.items()) if name not in found or found[name][0] < allowed]
    assert not stale, "shrink or remove these exceptions:\n" + "\n".join(stale)


if __name__ == "__main__":
    for name, (lines, _) in sorted(sizes().items()):
        sys.stdout.write(f"    {name!r}: {lines},\n")

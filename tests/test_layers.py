"""The layers' contract, checked on the source (imports at any depth, TYPE_CHECKING ones included):

    octavo.cli      the command and the local cluster: may use everything below
    octavo.spark    the Spark data source: the client library and metadata
    octavo.client   the client library: metadata and the protocol, never the bookie
    octavo.node     the bookie: metadata and the protocol; the client only in the BP-46 tail repair, which
                    reads lost entries back from its peers
    octavo.meta     metadata shared by bookie, client and operator: the protocol at most
    octavo.v1       the wire protocol: nothing of ours
    octavo.telemetry  metrics, traces and logs every process shares: nothing of ours
    octavo.sim      the deterministic simulation: the bookie and the client on a model of etcd

Pure modules (formats, state machines, policies, decision tables) import no IO and no clock: only the modules
listed in PURE_MAY_IMPORT, and other pure modules. Time comes in as a parameter.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "octavo.v1": ROOT / "proto/octavo/v1",
    "octavo.meta": ROOT / "shared/octavo/meta",
    "octavo.client": ROOT / "client/octavo/client",
    "octavo.spark": ROOT / "client/octavo/spark",
    "octavo.cli": ROOT / "cli/octavo/cli",
    "octavo.node": ROOT / "node/octavo/node",
    "octavo.operator": ROOT / "operator/octavo/operator",
    "octavo.localk8s": ROOT / "bench/emulator/octavo/localk8s",
    "octavo.telemetry": ROOT / "shared/octavo/telemetry",
    "octavo.sim": ROOT / "sim/octavo/sim",
}
# What each package may import of ours (itself always).
ALLOWED = {
    "octavo.v1": set(),
    "octavo.meta": {"octavo.v1"},
    "octavo.client": {"octavo.meta", "octavo.v1", "octavo.telemetry"},
    "octavo.spark": {"octavo.client", "octavo.meta", "octavo.v1", "octavo.telemetry"},
    "octavo.node": {"octavo.meta", "octavo.v1", "octavo.telemetry"},
    "octavo.cli": {"octavo.node", "octavo.client", "octavo.spark", "octavo.operator", "octavo.meta",
                   "octavo.v1", "octavo.telemetry"},
    "octavo.operator": {"octavo.client", "octavo.meta", "octavo.v1", "octavo.telemetry"},
    "octavo.telemetry": set(),
    # The emulated Kubernetes API and pod runner (bench only, not installed): it starts `octavo node` processes.
    "octavo.localk8s": set(),
    # The deterministic simulation runs the bookie and the client, on the model of etcd, in one process.
    "octavo.sim": {"octavo.node", "octavo.client", "octavo.meta", "octavo.v1", "octavo.telemetry"},
}
# The sanctioned exceptions: tail repair reads the entries a bookie lost from its peers, damage repair the good
# copies of its damaged entries, the replicas check the copies a live bookie misses, and autorecovery
# re-replicates a lost bookie's share from the survivors to other bookies: both as a client.
# The operator reads the bookie's settings (names, defaults, ranges) from their one definition.
EXCEPTIONS = {("octavo.node.repair", "octavo.client"), ("octavo.node.damagerepair", "octavo.client"),
              ("octavo.node.autorecovery", "octavo.client"), ("octavo.node.replicascheck", "octavo.client"),
              ("octavo.operator.resources", "octavo.node")}

PURE = {
    "octavo.node.record", "octavo.node.config", "octavo.node.errors", "octavo.node.files",
    "octavo.node.startup_cases", "octavo.node.watermarks", "octavo.node.compaction_plan", "octavo.node.rolling",
    "octavo.node.invariants", "octavo.node.ledgerrow", "octavo.node.ledgers", "octavo.node.recoverypoint",
    "octavo.node.entrylog", "octavo.node.writecache", "octavo.node.appends",
    "octavo.meta.layout", "octavo.meta.ledger_metadata", "octavo.meta.errors", "octavo.meta.etcdhealth",
    "octavo.client.quorums", "octavo.client.colstats", "octavo.client.admission", "octavo.client.refusals",
    "octavo.client.placement",
    "octavo.client.arguments",
    "octavo.operator.windows", "octavo.operator.policy", "octavo.operator.resources", "octavo.operator.builders",
    "octavo.operator.status", "octavo.operator.names",
}
PURE_MAY_IMPORT = {
    "__future__", "collections", "collections.abc", "dataclasses", "enum", "typing", "struct", "hashlib", "json",
    "math", "re", "itertools", "functools", "operator", "bisect", "crc32c", "octavo.v1.bookie_pb2", "octavo.v1",
    "types",  # MappingProxyType: a read-only view
    # Time as values (the clock itself is never read: `now` is a parameter), zones, cron arithmetic.
    "datetime", "zoneinfo", "cronsim",
    # Decimal numbers as values (column statistics); closest-name suggestions.
    "decimal", "difflib",
}


def module_name(package: str, path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([package, *parts])


def imports_of(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = module.rsplit(".", node.level)[0]
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names if node.module == "octavo")
    return found


def all_modules() -> list[tuple[str, str, Path]]:
    out = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            out.append((package, module_name(package, path, folder), path))
    return out


def owner(name: str) -> str | None:
    return next((p for p in PACKAGES if name == p or name.startswith(p + ".")), None)


@pytest.mark.parametrize(("package", "module", "path"), all_modules(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_module_imports_only_the_layers_below_it(package: str, module: str, path: Path) -> None:
    wrong = []
    for name in imports_of(path, module):
        other = owner(name)
        if other is None or other == package or other in ALLOWED[package]:
            continue
        if (module, other) in EXCEPTIONS:
            continue
        wrong.append(name)
    assert not wrong, f"{module} imports {sorted(wrong)}: {package} may import only {sorted(ALLOWED[package])}"


def test_pure_modules_import_no_io_and_no_clock() -> None:
    modules = {module: path for _, module, path in all_modules()}
    missing = PURE - set(modules)
    assert not missing, f"pure modules listed but not found: {sorted(missing)}"
    for module in sorted(PURE):
        bad = sorted(name for name in imports_of(modules[module], module)
                     if name not in PURE_MAY_IMPORT and name not in PURE)
        assert not bad, f"pure module {module} imports {bad}"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The contract can fail: a module importing a forbidden layer or IO is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom octavo.node.storage import Storage\nfrom . import sibling\n")
    found = imports_of(bad, "octavo.client.bad")
    assert {"os", "octavo.node.storage", "octavo.client"} <= found
    assert owner("octavo.node.storage") == "octavo.node" not in ALLOWED["octavo.client"]


# Import cycles that still exist, each listed as its sorted modules. The list may only shrink: a listed cycle
# that no longer exists fails the test, so it is struck off here when it goes.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def import_graph() -> dict[str, set[str]]:
    """Each module of ours and the modules of ours it imports, TYPE_CHECKING imports included.
    `from package import name` counts as an import of package.name when that is a module, else of the package;
    importing package.module is not counted as importing the package's __init__ (a package that re-exports its
    modules would otherwise close a cycle with every one of them)."""
    modules = {module: path for _, module, path in all_modules()}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(filter(None, (known(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module.rsplit(".", node.level)[0]
                    base = f"{package}.{base}" if base else package
                for alias in node.names:
                    target = known(f"{base}.{alias.name}") if f"{base}.{alias.name}" in modules else known(base)
                    if target:
                        targets.add(target)
        graph[module] = targets - {module}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return found


def test_no_module_cycles_type_checking_imports_included() -> None:
    cycles = set(strongly_connected(import_graph()))
    new = sorted(cycles - KNOWN_CYCLES)
    assert not new, f"modules that import each other (TYPE_CHECKING imports count too): {new}"
    gone = sorted(KNOWN_CYCLES - cycles)
    assert not gone, f"cycles listed in KNOWN_CYCLES that no longer exist (strike them off): {gone}"


def test_the_cycle_finder_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert strongly_connected(graph) == [("a", "b", "c")]


# The layers as docs/architecture.md shows them ("The layers"): generated from ALLOWED, EXCEPTIONS and PURE, and
# checked against the page, so the picture is the contract this file enforces. `python tests/test_layers.py`
# rewrites the page's block.
DOC = ROOT / "docs/architecture.md"
DOC_BEGIN = "<!-- layers: generated from tests/test_layers.py (python tests/test_layers.py rewrites it) -->"
DOC_END = "<!-- /layers -->"


def below(package: str) -> set[str]:
    """Every package this one may reach, directly or through the ones it may import."""
    seen: set[str] = set()
    todo = list(ALLOWED[package])
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(ALLOWED[p])
    return seen


def layers_markdown() -> str:
    short = {p: p.removeprefix("octavo.") for p in ALLOWED}
    rows = ["| package | may import (of ours) | pure modules (no IO, no clock) |", "|---|---|---|"]
    for package in sorted(ALLOWED, key=lambda p: (-len(below(p)), p)):
        allowed = ", ".join(f"`{short[p]}`" for p in sorted(ALLOWED[package], key=lambda p: (-len(below(p)), p)))
        pure = ", ".join(f"`{m.removeprefix(package + '.')}`" for m in sorted(PURE) if owner(m) == package)
        rows.append(f"| `{package}` | {allowed or 'nothing of ours'} | {pure or '—'} |")
    exceptions = "; ".join(f"`{module}` may import `{other}`" for module, other in sorted(EXCEPTIONS))
    rows.append("")
    rows.append(f"The sanctioned exceptions: {exceptions}.")
    return "\n".join(rows)


def doc_block(text: str) -> str:
    start, end = text.index(DOC_BEGIN) + len(DOC_BEGIN), text.index(DOC_END)
    return text[start:end].strip("\n")


def test_the_architecture_page_shows_the_layers_this_test_checks() -> None:
    assert doc_block(DOC.read_text()) == layers_markdown(), "docs/architecture.md's layers are stale: run " \
        "`python tests/test_layers.py` to rewrite them"


def test_the_layers_picture_follows_the_table() -> None:
    table = layers_markdown()
    assert table.splitlines()[2].startswith("| `octavo.cli` |")  # the package that may reach the most comes first
    assert "`octavo.node.repair` may import `octavo.client`" in table


if __name__ == "__main__":
    page = DOC.read_text()
    start, end = page.index(DOC_BEGIN) + len(DOC_BEGIN), page.index(DOC_END)
    DOC.write_text(page[:start] + "\n" + layers_markdown() + "\n" + page[end:])
    print(f"wrote the layers into {DOC.relative_to(ROOT)}")

"""Every code block of README.md and docs/*.md that a user would paste (```sh and ```python) runs as written,
against a local cluster, in order, as one reader going through the pages would run them (issue 29, item 11).

How the blocks run:
- in a scratch folder laid out like a clone (every top-level entry of the repository linked in, `.venv`
  included, so `.venv/bin/octavo` works), never in the repository itself (a developer's `.dev` stays alone);
- the pages in the order of PAGES: README.md first (its "Try it by hand" starts the dev cluster in `.dev` and
  stops it), then docs/operations.md (whose first block starts it again and leaves it running, with
  `OCTAVO_DEV_DIR=.dev`), then the pages that use that cluster;
- a shell block in `bash -e -o pipefail` with every variable the blocks before it set (`set -a`: README's
  `E=...` is there for docs/spark.md's `--etcd "$E"`); a failing command fails the test with the page and line;
- a page's Python blocks in one interpreter, in order, as pasted one after the other into one `python` (a
  block may use what an earlier one of its page defined: docs/spark.md's `spark`);
- placeholders are filled from the environment the docs define: `127.0.0.1:PORT` (the etcd endpoint `dev up`
  prints) and $ETCD (docs/operations.md: "one endpoint, host:port") are the dev cluster's etcd, README's $E.

A block the test cannot run (a Kubernetes or Helm install on a real cluster, a long-running server, a make
target that takes minutes) is marked in the markdown, on the line right before its fence, with
`<!-- not-run: REASON -->`; the reason is required, and the list of them is checked to stay short.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
# The order a reader goes through them: README.md starts and stops a cluster of its own; docs/operations.md
# starts the one the later pages use (and defines OCTAVO_DEV_DIR); docs/spark.md writes the datasets that the
# dataset commands look at.
FIRST = ["README.md", "docs/operations.md", "docs/client.md", "docs/spark.md"]
# Every other page after them (a new page is run too, without anyone adding it here).
PAGES = FIRST + sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md") if f"docs/{p.name}" not in FIRST)
SHELL = {"sh", "bash", "shell", "console"}
PYTHON = {"python", "py", "python3"}
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->\s*$")
PORT_PLACEHOLDER = "127.0.0.1:PORT"
NOT_RUN_MAX = 12  # "keep that list short": a new not-run block is a docs example nobody checks
BLOCK_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Block:
    page: str
    line: int        # the fence's line, 1-based
    language: str    # "sh" or "python"
    code: str
    not_run: str     # the reason, or "" when it runs

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced ```sh and ```python blocks of a page, with their not-run reason if marked."""
    lines = (REPO / page).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, language = i, m.group(1).lower()
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        kind = "sh" if language in SHELL else "python" if language in PYTHON else ""
        if not kind:
            continue
        marker = NOT_RUN.match(lines[start - 1]) if start > 0 else None
        if marker is not None and not marker.group(1):
            raise AssertionError(f"{page}:{start + 1}: a not-run marker needs its reason")
        found.append(Block(page, start + 1, kind, "\n".join(body) + "\n", marker.group(1) if marker else ""))
    return found


def test_the_not_run_list_stays_short() -> None:
    skipped = [f"{b.where}: {b.not_run}" for p in PAGES if (REPO / p).exists() for b in blocks(p) if b.not_run]
    assert len(skipped) <= NOT_RUN_MAX, "too many blocks marked not-run:\n" + "\n".join(skipped)


# -- the reader's shell and Python ------------------------------------------------------------------------
class Reader:
    """A scratch clone, the variables its shell blocks have set, and a page's Python session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env_file = root.parent / "reader.env"
        self.env_file.write_text("")
        self.python: subprocess.Popen[bytes] | None = None
        self.python_page = ""

    def environment(self) -> dict[str, str]:
        """The environment the shell blocks have defined so far (exported or not: they run under `set -a`)."""
        out = subprocess.run(["bash", "-c", f"set -a; source {self.env_file}; env -0"], capture_output=True,
                             cwd=self.root, check=True, env=_base_env())
        env = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
        return env

    def fill(self, code: str) -> str:
        endpoint = self.etcd_endpoint()
        return code.replace(PORT_PLACEHOLDER, endpoint) if endpoint else code

    def etcd_endpoint(self) -> str:
        state = self.root / ".dev" / "cluster.json"
        if state.exists():
            return str(json.loads(state.read_text()).get("etcd") or "")
        return ""

    def run_shell(self, block: Block) -> None:
        script = textwrap.dedent(f"""\
            set -a
            source {self.env_file}
            cd {self.root}
            trap 'export -p > {self.env_file}.tmp && mv {self.env_file}.tmp {self.env_file}' EXIT
            set -e -o pipefail
            """) + self.fill(block.code)
        started = time.monotonic()
        env = _base_env()
        if self.etcd_endpoint():  # docs/operations.md: "ETCD is one endpoint, host:port"
            env["ETCD"] = self.etcd_endpoint()
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=self.root,
                             env=env, timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)
        took = time.monotonic() - started
        print(f"{block.where}: sh, {took:.1f}s")
        assert out.returncode == 0, (f"{block.where}: the shell block failed (exit {out.returncode}):\n"
                                     f"{block.code}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}")

    def run_python(self, block: Block) -> None:
        if self.python is None or self.python_page != block.page:
            self.stop_python()
            self.python = subprocess.Popen([str(REPO / ".venv" / "bin" / "python"), "-u", "-c", DRIVER],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           cwd=self.root, env=self.environment())
            self.python_page = block.page
        assert self.python.stdin is not None and self.python.stdout is not None
        message = {"where": block.where, "code": self.fill(block.code), "env": self.environment()}
        self.python.stdin.write((json.dumps(message) + "\n").encode())
        self.python.stdin.flush()
        # Read the raw pipe (not the text wrapper, whose buffer select() cannot see) up to the sentinel line.
        fd = self.python.stdout.fileno()
        output = b""
        started = time.monotonic()
        deadline = started + BLOCK_TIMEOUT_S
        marker = ("\n" + SENTINEL).encode()
        while marker not in b"\n" + output:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self.stop_python()
                raise AssertionError(f"{block.where}: the Python block did not finish in {BLOCK_TIMEOUT_S:g}s:\n"
                                     f"{block.code}\n--- output\n{output.decode(errors='replace')}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise AssertionError(f"{block.where}: Python exited in the block:\n{block.code}\n--- output\n"
                                     f"{output.decode(errors='replace')}")
            output += chunk
        text, _, verdict = (b"\n" + output).partition(marker)
        while b"\n" not in verdict:  # the rest of the sentinel line (what follows it is not this block's)
            verdict += os.read(fd, 1 << 10)
        verdict = verdict.split(b"\n", 1)[0]
        print(f"{block.where}: python, {time.monotonic() - started:.1f}s")
        assert verdict.strip() == b"ok", (f"{block.where}: the Python block failed:\n{block.code}\n--- output\n"
                                          f"{text.decode(errors='replace')}")

    def stop_python(self) -> None:
        if self.python is not None:
            if self.python.stdin is not None:
                self.python.stdin.close()
            try:
                self.python.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.python.kill()
                self.python.wait()
            self.python = None

    def stop_cluster(self) -> None:
        if (self.root / ".dev").exists():
            subprocess.run([str(REPO / ".venv" / "bin" / "octavo"), "dev", "down", "--data-dir",
                            str(self.root / ".dev")], capture_output=True, timeout=120, env=_base_env())


SENTINEL = "\x00octavo-docs-block:"
# Runs each block it is sent, in one namespace, as pasted into one interpreter; reports ok or the traceback.
DRIVER = textwrap.dedent(f"""\
    import json, os, sys, traceback
    namespace = {{"__name__": "__main__"}}
    for line in sys.stdin:
        message = json.loads(line)
        os.environ.clear()
        os.environ.update(message["env"])
        try:
            exec(compile(message["code"], message["where"], "exec"), namespace)
            verdict = "ok"
        except BaseException:
            traceback.print_exc(file=sys.stdout)
            verdict = "failed"
        sys.stdout.flush()
        sys.stderr.flush()
        # One write (atomic on a pipe), on a line of its own: the JVM of a Spark block writes its log lines to the
        # same pipe from its own threads, and print's two writes (text, then newline) let one land in between.
        sys.stdout.write("\\n" + {SENTINEL!r} + verdict + "\\n")
        sys.stdout.flush()
    """)


def _base_env() -> dict[str, str]:
    """This process's environment without what would point the commands elsewhere than the docs say."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OCTAVO_", "PYTEST_"))}
    env["PATH"] = os.pathsep.join([str(Path(_etcd_bin()).parent), env.get("PATH", "")])  # etcdctl, as installed
    return env


def _etcd_bin() -> str:
    from octavo.cli.localcluster import etcd_binary

    return etcd_binary()


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    root = tmp_path_factory.mktemp("docs") / "octavo"
    root.mkdir()
    for entry in REPO.iterdir():  # a clone: everything linked in but the dev clusters and git
        if entry.name not in (".git", ".dev", ".kube-dev", "Makefile") and not entry.name.startswith(".pytest"):
            (root / entry.name).symlink_to(entry)
    # Set up already (.venv is the repository's): `make setup` does nothing here, `make kube` is the
    # repository's (it only checks the binaries once built), and no other target runs (a block that needs one
    # is marked not-run). The real `make setup` would point the venv's Spark .pth file at this scratch folder.
    (root / "Makefile").write_text("setup:\n\t@echo 'set up already (the test links the repository .venv)'\n"
                                   f"kube:\n\t$(MAKE) -C {REPO} kube\n")  # built already: under a second
    r = Reader(root)
    try:
        yield r
    finally:
        r.stop_python()
        r.stop_cluster()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", [p for p in PAGES if (REPO / p).exists()])
def test_the_page_runs_as_written(page: str, reader: Reader) -> None:
    if shutil.which("bash") is None:
        pytest.fail("bash is needed to run the docs' shell blocks")
    ran: list[Any] = []
    try:
        for block in blocks(page):
            if block.not_run:
                continue
            if block.language == "sh":
                reader.run_shell(block)
            else:
                reader.run_python(block)
            ran.append(block.where)
    finally:
        reader.stop_python()
    print(f"{page}: ran {len(ran)} blocks")


if __name__ == "__main__":  # list the blocks: python tests/test_docs_run.py
    for p in PAGES:
        for b in blocks(p):
            print(f"{b.where:28} {b.language:6} {'not-run: ' + b.not_run if b.not_run else ''}")
    sys.exit(0)

"""Planted bugs: how long the simulation takes to find each of three known past bugs put back in the code.

python -m octavo.sim.planted [--seconds 300] [--jobs 2] [--first-seed 100000] [--write docs/reliability.md]

Each patch in sim/planted/ puts one bug back. For each: a temporary git worktree of HEAD (`git worktree add`),
the patch applied there (`git apply`), and new seeds run there (`python -m octavo.sim --until-violation` with
PYTHONPATH at the worktree's package folders) until one violates. A seed that violates the same way without
the patch (a clean worktree of HEAD: a known finding, not the planted bug) does not count: the hunt goes on from
the next seed. The figures (wall seconds, seeds run) go into docs/reliability.md. The worktrees are removed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from octavo.sim.run import git_commit

PLANTED_DIR = Path(__file__).resolve().parents[2] / "planted"
REPO = PLANTED_DIR.parents[1]
PACKAGE_DIRS = ("client", "node", "proto", "shared", "sim")
SECTION_BEGIN = "<!-- octavo.sim planted: begin -->"
SECTION_END = "<!-- octavo.sim planted: end -->"
VIOLATING = re.compile(r"^violating seeds: (.*)$", re.M)
SEEDS_RUN = re.compile(r"^(\d+) seeds from \d+ in", re.M)


@dataclass
class Hunt:
    patch: str
    found_seed: int | None = None
    wall_s: float = 0.0
    seeds: int = 0
    not_counted: tuple[int, ...] = ()  # seeds that violate without the patch too
    violation: str = ""


def patches() -> list[Path]:
    return sorted(PLANTED_DIR.glob("*.patch"))


def check_applies(patch: Path) -> str:
    """'' when the patch applies to HEAD (checked against a throwaway index of HEAD, so uncommitted work in
    the tree does not matter), else git's complaint."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        subprocess.run(["git", "read-tree", "HEAD"], cwd=REPO, env=env, check=True)
        done = subprocess.run(["git", "apply", "--cached", "--check", str(patch)], cwd=REPO, env=env,
                              capture_output=True, text=True)
    return "" if done.returncode == 0 else done.stderr.strip()


class Worktree:
    """A git worktree of HEAD under /tmp, with a patch applied (or none), removed on exit."""

    def __init__(self, name: str, patch: Path | None) -> None:
        self.path = os.path.join(tempfile.gettempdir(), name)
        self.patch = patch

    def __enter__(self) -> Worktree:
        subprocess.run(["git", "worktree", "add", "--detach", "-f", self.path, "HEAD"], cwd=REPO, check=True,
                       capture_output=True)
        if self.patch is not None:
            subprocess.run(["git", "apply", str(self.patch)], cwd=self.path, check=True)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["git", "worktree", "remove", "--force", self.path], cwd=REPO, check=False,
                       capture_output=True)

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONHASHSEED": "0",
                "PYTHONPATH": os.pathsep.join(os.path.join(self.path, d) for d in PACKAGE_DIRS)}

    def sim(self, *args: str, timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "octavo.sim", *args], cwd=self.path, env=self.env(),
                              capture_output=True, text=True, timeout=timeout_s)


def hunt(patch: Path, seconds: float, jobs: int, first_seed: int, clean: Worktree) -> Hunt:
    """New seeds on the patched code until one violates where the clean code does not, or `seconds` pass."""
    result = Hunt(patch.name)
    not_counted: list[int] = []
    next_seed = first_seed
    t0 = time.monotonic()
    with Worktree(f"sim-plant-{patch.stem}", patch) as planted:
        while (left := seconds - (time.monotonic() - t0)) > 1:
            done = planted.sim("--seconds", f"{left:.0f}", "--jobs", str(jobs), "--first-seed", str(next_seed),
                               "--until-violation")
            seeds = SEEDS_RUN.search(done.stdout)
            result.seeds += int(seeds.group(1)) if seeds else 0
            found = VIOLATING.search(done.stdout)
            if found is None or not found.group(1):
                break
            seed = int(found.group(1).split(",")[0])
            if clean.sim("--seed", str(seed), "--no-shrink").returncode == 0:
                result.found_seed = seed
                result.violation = next((line.strip() for line in done.stdout.splitlines()
                                         if line.startswith("  - ")), "")
                break
            not_counted.append(seed)
            next_seed = seed + 1
    result.wall_s = time.monotonic() - t0
    result.not_counted = tuple(not_counted)
    return result


def write_figures(path: str, hunts: list[Hunt], seconds: float, jobs: int) -> None:
    rows = [f"| {h.patch} | " + (f"seed {h.found_seed} | {h.wall_s:.0f} s | {h.seeds} | {h.violation[2:200]}"
                                  if h.found_seed is not None else
                                  f"not found | > {h.wall_s:.0f} s | {h.seeds} | –") +
            (f" (seeds {', '.join(map(str, h.not_counted))} also violate without it: not counted)"
             if h.not_counted else "") + " |" for h in hunts]
    section = "\n".join([
        SECTION_BEGIN,
        "## Planted bugs (`make sim-planted`)",
        "",
        f"Three known past bugs put back (sim/planted/*.patch) on commit {git_commit()}, each hunted with new seeds "
        f"on {jobs} processes for at most {seconds:.0f} s of wall time (1-minute load average "
        f"{os.getloadavg()[0]:.1f} at the end; other jobs shared the machine). A seed counts when it violates with "
        "the patch and not without it.",
        "",
        "| planted bug | found by | wall time | seeds run | violation |",
        "|---|---|---|---|---|",
        *rows,
        SECTION_END,
    ])
    text = Path(path).read_text() if os.path.exists(path) else ""
    if SECTION_BEGIN in text and SECTION_END in text:
        head, rest = text.split(SECTION_BEGIN, 1)
        text = head + section + rest.split(SECTION_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    Path(path).write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m octavo.sim.planted", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300.0, help="wall time allowed for each bug")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--first-seed", type=int, default=100_000)
    parser.add_argument("--only", default="", help="only the patches whose name contains this")
    parser.add_argument("--write", default="", help="write the figures into this markdown file")
    args = parser.parse_args(argv)
    hunts = []
    with Worktree("sim-plant-clean", None) as clean:
        for patch in patches():
            if args.only not in patch.name:
                continue
            why = check_applies(patch)
            if why:
                print(f"{patch.name}: does not apply to HEAD: {why}", flush=True)
                return 2
            found = hunt(patch, args.seconds, args.jobs, args.first_seed, clean)
            hunts.append(found)
            print(f"{patch.name}: " + (f"found by seed {found.found_seed} after {found.wall_s:.0f} s and "
                                       f"{found.seeds} seeds: {found.violation}" if found.found_seed is not None
                                       else f"not found in {found.wall_s:.0f} s ({found.seeds} seeds)")
                  + (f"; not counted (violate without it too): {found.not_counted}" if found.not_counted else ""),
                  flush=True)
    if args.write:
        write_figures(args.write, hunts, args.seconds, args.jobs)
    return 0 if all(h.found_seed is not None for h in hunts) else 1


if __name__ == "__main__":
    sys.exit(main())

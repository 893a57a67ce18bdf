"""python -m octavo.sim: replay one seed, or run new seeds for a while (docs/simulation.md).

  python -m octavo.sim --seed 42             replay seed 42 (its violations and the events around them)
  python -m octavo.sim --seed 42 --history   ... and print its whole history
  python -m octavo.sim --seed 42 --keep 0,3  replay seed 42 with only faults 0 and 3 of its schedule
                                             (a violating replay without --keep is shrunk to the fewest
                                             faults that still violate, and prints that replay's command)
  python -m octavo.sim --seconds 600 --jobs 2 --write docs/reliability.md
                                             run new seeds for 10 minutes on 2 processes, write the figures

String hashing is seeded per process: a replay must iterate sets and dicts of names in the same order as the
run it replays, so the command runs itself again with PYTHONHASHSEED=0 when it is not set.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from octavo.sim.run import parse_keep
from octavo.sim.seeds import SeedRun, base_dir, replay, run_for, write_figures
from octavo.sim.shrink import shrink

HASH_SEED = "0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m octavo.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, help="replay this seed")
    parser.add_argument("--history", action="store_true", help="with --seed: print the whole history")
    parser.add_argument("--keep", default=None, help="with --seed: apply only these faults of its schedule "
                                                     "(comma-separated indexes, or 'none')")
    parser.add_argument("--no-shrink", action="store_true", help="with --seed: do not shrink a violation")
    parser.add_argument("--seconds", type=float, default=60.0, help="run new seeds for this long (wall time)")
    parser.add_argument("--first-seed", type=int, default=None, help="the first of consecutive new seeds "
                                                                    "(default: drawn from the OS)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes running seeds")
    parser.add_argument("--write", default="", help="write the figures into this markdown file")
    parser.add_argument("--until-violation", action="store_true", help="stop starting seeds once one violates "
                                                                       "(sim/octavo/sim/planted.py)")
    parser.add_argument("--verbose", action="store_true", help="the product's own log lines too")
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        os.execve(sys.executable, [sys.executable, "-m", "octavo.sim", *(argv or sys.argv[1:])],
                  {**os.environ, "PYTHONHASHSEED": HASH_SEED})
    if not args.verbose:
        logging.disable(logging.CRITICAL)
    if args.seed is not None:
        keep = parse_keep(args.keep) if args.keep is not None else None
        outcome = replay(args.seed, keep)
        if args.history:
            print("\n".join(outcome.history))
        print(outcome.report() if not outcome.ok else
              f"seed {args.seed}: ok ({outcome.ledgers} ledgers, {outcome.acked} entries acknowledged, "
              f"{outcome.faults} faults, {outcome.virtual_s:.1f} virtual s, history {outcome.digest})")
        if not outcome.ok and keep is None and not args.no_shrink:
            print(shrink(args.seed, base_dir=base_dir(), first=outcome).report())
        return 0 if outcome.ok else 1
    result: SeedRun = run_for(args.seconds, args.jobs, args.first_seed, args.until_violation)
    print(result.summary())
    print(f"violating seeds: {','.join(str(s.seed) for s in result.failed)}")
    if args.write:
        write_figures(args.write, result)
    return 0 if not result.failed else 1


if __name__ == "__main__":
    sys.exit(main())

"""Octavo against Apache Kafka, Apache BookKeeper and NATS JetStream on this machine, every workload in one run
(issue 41): `python bench/peers_bench.py` or `make bench-peers`.

The benchmark lives in bench/peers/ (run.py: the systems, the workloads, the report; its docstring and
bench/peers/README.md say every setting). This is its entry point, with the same options:

    python bench/peers_bench.py                  # the full run; writes the `peers` section of docs/benchmarks.md
                                                 # and bench/results/peers.json
    python bench/peers_bench.py --quick          # a smoke run of a few minutes, no report
    python bench/peers_bench.py --systems octavo-qa2,jetstream --workloads tail --results /tmp/t.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import run

if __name__ == "__main__":
    run.main()

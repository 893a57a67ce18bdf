"""Run every benchmark and rewrite docs/benchmarks.md (make bench). Takes several minutes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    ["storage_bench.py"],
    ["grpc_bench.py"],
    ["index_choice.py"],
    ["compaction_bench.py"],
    ["spark_bench.py"],
    ["restart_bench.py"],
    ["replication_bench.py"],
    ["scrub_bench.py"],  # about 3 minutes: bit rot repaired, the scrub's rate and its cost to adds
    ["churn_bench.py"],  # about 20 minutes for 100,000 cycles twice
    ["scale_bench.py"],  # about 40 minutes for the full ladder
    ["operator_bench.py"],
    ["read_bench.py"],
    ["observability_bench.py"],
    ["tls_bench.py"],
    ["producer_bench.py"],  # needs Debian's nats-server and the bench extra (nats-py)
    ["cluster_bench.py"],  # needs Debian's nats-server and the bench extra (nats-py)
    ["dataset_bench.py"],  # hours: the stream's 2,000 micro-batches (about 8 s each on 2 cores)
]


def main() -> int:
    for bench in BENCHES:
        print(f"== {' '.join(bench)}", flush=True)
        code = subprocess.call([sys.executable, str(HERE / bench[0]), *bench[1:]])
        if code != 0:
            print(f"{bench[0]} failed with exit code {code}", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())

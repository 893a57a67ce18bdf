"""A smoke test of the built image (`make image` first; run where a Docker engine answers):

    python e2e/image/smoke.py [--image octavo:dev]

Starts a real etcd on this host, three bookies in containers of the image (host network, each its own data
volume), and checks: the image runs as uid 1000, `octavo --version` answers, the operator's command is there,
and `octavo cluster check` from a fourth container writes a 3-replica ledger, reads it back identical and
deletes it. Exit 0 when all holds. `make image-smoke` runs it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from octavo.cli.localcluster import EtcdProcess, free_port


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300)
    if check and done.returncode != 0:
        raise SystemExit(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="octavo:dev")
    image = parser.parse_args().image
    etcd = EtcdProcess(tempfile.mkdtemp(prefix="octavo-smoke-"))
    endpoint = etcd.start()
    names = [f"octavo-smoke-{os.getpid()}-{i}" for i in range(3)]
    try:
        uid = docker("run", "--rm", "--entrypoint", "id", image, "-u").stdout.strip()
        assert uid == "1000", f"the image runs as uid {uid}, not 1000"
        print(f"ok: {docker('run', '--rm', image, '--version').stdout.strip()}, uid {uid}")
        assert "usage: octavo operator run" in docker("run", "--rm", image, "operator", "run", "--help").stdout
        for i, name in enumerate(names):
            docker("run", "-d", "--name", name, "--network", "host", image, "node", "--data-dir", "/data",
                   "--host", "127.0.0.1", "--port", str(free_port()), "--etcd", endpoint, "--bookie-id", f"b{i}",
                   "--cluster", "smoke")
        deadline = time.monotonic() + 60
        while True:
            check = docker("run", "--rm", "--network", "host", image, "cluster", "check", "--etcd", endpoint,
                           "--cluster", "smoke", "--entries", "500", check=False)
            if check.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert check.returncode == 0, check.stdout + check.stderr
        print(check.stdout.strip())
        return 0
    finally:
        for name in names:
            docker("rm", "-f", "-v", name, check=False)
        etcd.stop(kill=True)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m octavo.cli.kubeagent --config AGENT.json`: the node agent as a process, until SIGTERM or SIGINT.
The config comes from `agent_config(plane, root).write(path)` (octavo.cli.kubeagent.agent)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from octavo.cli.kubeagent.agent import AgentConfig, AgentError, NodeAgent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m octavo.cli.kubeagent", description=__doc__)
    parser.add_argument("--config", required=True, help="the agent's config file (agent_config(...).write)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        agent = NodeAgent(AgentConfig.read(args.config)).start()
    except AgentError as e:
        print(f"octavo node agent: {e}", file=sys.stderr)
        return 2
    try:
        stop.wait()
    finally:
        agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

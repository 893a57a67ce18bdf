"""Deterministic simulation of a whole Octavo cluster in one process (issue 31; docs/simulation.md).

One asyncio loop whose clock jumps to the next timer (loop.py), an in-memory network behind the transport seam
(network.py), a model of etcd served on it (etcdmodel.py), bookies running their real storage engine and data
plane on SimIO (bookie.py), and seeded fault schedules, workloads and checkers (run.py).
"""

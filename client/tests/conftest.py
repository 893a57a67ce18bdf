from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.client.localcluster import EtcdProcess


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


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path

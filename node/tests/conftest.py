from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.node.config import NodeConfig
from octavo.node.storage import Storage
from octavo.node.testing import small_config


@pytest.fixture
def cfg(tmp_path: Path) -> NodeConfig:
    return small_config(tmp_path / "bookie")


@pytest.fixture
def storage(cfg: NodeConfig) -> Iterator[Storage]:
    s = Storage.open(cfg)
    yield s
    if not s._closed:
        s.close()

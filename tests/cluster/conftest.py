"""The cluster tests' engines, started once per run (`make test-cluster`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import engines  # noqa: E402


@pytest.fixture(scope="session")
def installed() -> None:
    engines.ensure_installed()


@pytest.fixture(scope="session")
def slurm(installed, tmp_path_factory) -> Iterator[engines.Slurm]:
    cluster = engines.Slurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

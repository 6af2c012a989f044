"""Real etcd members and real broker processes on loopback, for the cluster tests."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import BrokerCluster
from tests.support.etcd import EtcdCluster

_names = itertools.count()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """Three etcd members shared by a module's tests (each test has its own cluster name)."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"), 3).start()
    yield cluster
    cluster.stop()
    cluster.remove_data()


@pytest.fixture
def make_cluster(tmp_path: Path, etcd: EtcdCluster) -> Iterator[Callable[..., BrokerCluster]]:
    made: list[BrokerCluster] = []

    def make(groups: dict[str, int] | None = None, **kw: Any) -> BrokerCluster:
        bc = BrokerCluster(
            tmp_path / f"c{len(made)}",
            kw.pop("etcd_endpoints", etcd.endpoints),
            name=f"test{os.getpid()}x{next(_names)}",
            groups=groups or {"g1": 3},
            **kw,
        )
        made.append(bc)
        return bc

    yield make
    for bc in made:
        bc.stop_all()

"""Fixtures of the Spark connector tests: one broker and one Spark session per module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import start_broker


@pytest.fixture(scope="module")
def spark_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    """A real broker on a free port, shared by the tests of a module."""
    bt = start_broker(tmp_path_factory.mktemp("broker"))
    try:
        yield bt
    finally:
        bt.stop()


@pytest.fixture
def json_input(tmp_path: Path) -> Any:
    """``json_input([range(0, 300), range(300, 600)])`` writes one JSON-lines file per range
    (rows ``{"id", "customer", "amount"}``) into a fresh folder and returns its path; with
    ``maxFilesPerTrigger=1`` each file is one micro-batch."""
    counter = iter(range(1000))

    def make(ranges: list[range], folder: Path | None = None) -> str:
        folder = folder or tmp_path / f"input{next(counter)}"
        folder.mkdir(exist_ok=True)
        for r in ranges:
            lines = [json.dumps({"id": i, "customer": f"c{i % 7}", "amount": i * 1.5}) for i in r]
            (folder / f"part-{r.start:06d}.json").write_text("\n".join(lines) + "\n")
        return str(folder)

    return make

"""Log lines a test reads with ``structlog.testing.capture_logs``.

The broker's modules log through module-level proxies (``log = structlog.get_logger(...)``)
under ``cache_logger_on_first_use``: a proxy used earlier in the session keeps the processors it
was first used with, and ``capture_logs`` cannot see into it.  :func:`fresh_loggers` gives every
loaded txmq module a new proxy for the test (put back after it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog


def fresh_loggers(monkeypatch: pytest.MonkeyPatch) -> None:
    """New, uncached loggers for every txmq module loaded now."""
    for name, module in list(sys.modules.items()):
        if name.startswith("txmq.") and module is not None and hasattr(module, "log"):
            monkeypatch.setattr(module, "log", structlog.get_logger(name))


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a child process's output file, one a line; a line that is not one
    (cut short by a kill) is left out."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out

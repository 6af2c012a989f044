"""Log lines a test reads with ``structlog.testing.capture_logs``.

The broker's modules log through module-level proxies (``log = structlog.get_logger(...)``)
under ``cache_logger_on_first_use``: a proxy used earlier in the session keeps the processors it
was first used with, and ``capture_logs`` cannot see into it.  :func:`fresh_loggers` gives every
loaded txmq module a new proxy for the test (put back after it)."""

from __future__ import annotations

import sys

import pytest
import structlog


def fresh_loggers(monkeypatch: pytest.MonkeyPatch) -> None:
    """New, uncached loggers for every txmq module loaded now."""
    for name, module in list(sys.modules.items()):
        if name.startswith("txmq.") and module is not None and hasattr(module, "log"):
            monkeypatch.setattr(module, "log", structlog.get_logger(name))

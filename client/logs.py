"""Logging of the SDK and the Spark connector: the standard library's ``logging``, so the host
application controls it (levels, handlers, format) as it does for every other library.

Library code does ``log = get_logger(__name__)`` and logs snake_case events with keyword values,
``log.info("queue_taken", group=g, topic=t, queue_id=3)``: the record's message is
``queue_taken group=g topic=t queue_id=3`` and the values also travel as the record's extra
attribute ``txmq`` (a dict), for structured handlers.  Nothing is printed unless the
application configures logging; the ``txmq`` loggers get a ``NullHandler`` so that an
unconfigured application does not see Python's last-resort output for warnings either.  The
broker process renders these records with its own structlog configuration
(:mod:`txmq.broker.logging`).
"""

from __future__ import annotations

import logging
from typing import Any

logging.getLogger("txmq").addHandler(logging.NullHandler())


class EventLogger:
    """A ``logging.Logger`` that takes an event name and keyword values."""

    __slots__ = ("logger", "bound")

    def __init__(self, logger: logging.Logger, bound: dict[str, Any] | None = None) -> None:
        self.logger = logger
        #: Values every event of this logger carries (see :meth:`bind`).
        self.bound = bound or {}

    def bind(self, **fields: Any) -> EventLogger:
        """A logger of the same name whose events also carry ``fields``."""
        return EventLogger(self.logger, {**self.bound, **fields})

    def _log(self, level: int, event: str, fields: dict[str, Any], exc_info: bool = False) -> None:
        if not self.logger.isEnabledFor(level):
            return
        if self.bound:
            fields = {**self.bound, **fields}
        text = " ".join([event, *(f"{k}={v}" for k, v in fields.items())])
        self.logger.log(
            level,
            "%s",
            text,
            exc_info=exc_info,
            extra={"txmq": {"event": event, **fields}},
            stacklevel=3,
        )

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """:meth:`error` with the exception being handled."""
        self._log(logging.ERROR, event, fields, exc_info=True)


def get_logger(name: str) -> EventLogger:
    """The logger of module ``name`` (``__name__``: ``txmq.client.consumer``, ...)."""
    return EventLogger(logging.getLogger(name))

"""Logging for the broker process: structlog, configured once, at the edge.

Only the command line calls :func:`configure_logging`; library code just does
``log = structlog.get_logger(__name__)`` and logs snake_case past-tense events with keyword
values (``log.info("topic_created", topic=t, queues=4)``).

What the configuration gives:

* **One line per event**: JSON when stdout is not a terminal (containers, systemd, pipes: what
  log collectors parse), coloured console lines on a terminal.  ``json=True``/``False`` forces
  either.
* ``timestamp`` in ISO 8601, UTC; ``level``; ``logger`` (the module name).
* **Level filtering** in structlog itself: calls below the level are no-ops, so a
  ``log.debug(...)`` on a hot path costs next to nothing at INFO.
* **Context variables** are merged into every line, so a connection handler can
  ``structlog.contextvars.bind_contextvars(peer="10.0.0.7:51234")`` once and every line logged
  while handling that unit of work carries it.
* **Standard-library logging** (asyncio, uvloop, third-party libraries, ``warnings``) goes
  through the same renderer, so the output stays one format.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import EventDict, Processor

#: Name of the handler this module installs on the root logger (replaced on reconfiguration).
HANDLER_NAME = "txmq"


def _level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    name = level.strip().upper()
    if name == "WARN":
        name = "WARNING"
    number = logging.getLevelName(name)
    if not isinstance(number, int):
        raise ValueError(
            f"unknown log level {level!r} (use DEBUG, INFO, WARNING, ERROR or CRITICAL)"
        )
    return number


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real file
        return False


def _sdk_event(_logger: object, _name: str, event_dict: EventDict) -> EventDict:
    """A record of the SDK's stdlib loggers (:mod:`txmq.client.logs`) carries its event and
    values in the ``txmq`` extra: render them as fields, like the broker's own events."""
    fields = getattr(event_dict.get("_record"), "txmq", None)
    if isinstance(fields, dict):
        event_dict.update(fields)
    return event_dict


def configure_logging(
    level: str = "INFO", json: bool | None = None, *, stream: TextIO | None = None
) -> None:
    """Configure structlog and the standard library's logging for this process.

    Args:
        level: the lowest level logged (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``,
            ``CRITICAL``; case does not matter).
        json: JSON lines if true, console lines if false; ``None`` (the default) picks JSON
            exactly when ``stream`` is not a terminal.
        stream: where lines go; standard output by default.

    Calling it again replaces the previous configuration (it never stacks handlers).
    """
    out: TextIO = sys.stdout if stream is None else stream
    if json is None:
        json = not _isatty(out)
    min_level = _level_number(level)

    # Applied to every event, whether it comes from structlog or from the stdlib.
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: Processor
    if json:
        final: list[Processor] = [
            structlog.processors.format_exc_info,
            structlog.processors.UnicodeDecoder(),
        ]
        renderer = structlog.processors.JSONRenderer()
    else:
        final = []  # ConsoleRenderer formats exceptions itself
        renderer = structlog.dev.ConsoleRenderer(colors=_isatty(out))

    structlog.configure(
        processors=[
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        cache_logger_on_first_use=True,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _sdk_event],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *final,
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(min_level)
    logging.captureWarnings(True)

"""The console's offset reset of a consumer group: the form, its confirmation, and the
reset."""

from __future__ import annotations

import time
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from ..admin import AsyncAdminClient
from ..logs import get_logger
from . import pages
from .web import ConsoleError, Request, Response

if TYPE_CHECKING:
    from .server import Console

# The console server's logger: an application's settings for it cover these events too.
log = get_logger("txmq.client.console.server")


def reset_target(form: dict[str, str]) -> tuple[str, str, int]:
    """topic, what it is reset to in words, and the timestamp in ms."""
    topic = form.get("topic", "").strip()
    to = form.get("to", "")
    if not topic:
        raise ConsoleError(HTTPStatus.BAD_REQUEST, "Name the topic.")
    if to == "earliest":
        return topic, "the earliest message", 0
    if to == "latest":
        return topic, "the end of each queue", int(time.time() * 1000) + 86_400_000
    if to == "time":
        raw = form.get("time", "").strip()
        try:
            ms = pages.parse_time(raw)
        except ValueError:
            raise ConsoleError(
                HTTPStatus.BAD_REQUEST,
                f"{raw!r} is not a time (give YYYY-MM-DD HH:MM:SS in UTC, or ms since the epoch).",
            ) from None
        return topic, f"the first message stored at or after {pages.when(ms)}", ms
    raise ConsoleError(HTTPStatus.BAD_REQUEST, "Choose earliest, latest or a time.")


def reset_form(console: Console, req: Request, group: str) -> Response:
    console.operator(req, "reset offsets")

    async def collect(a: AsyncAdminClient) -> list[dict[str, Any]]:
        if group not in await a.consumer_groups():
            raise ConsoleError(
                HTTPStatus.NOT_FOUND, f"The broker knows no consumer group {group!r}."
            )
        return await a.consume_stats(group)

    stats = console.call(collect)
    topics = sorted({s["topic"] for s in stats if not pages.internal_topic(s["topic"])})
    if req.query.get("to"):
        topic, what, _ = reset_target(req.query)
        return console.page(
            req,
            HTTPStatus.OK,
            f"Reset the offsets of {group}?",
            pages.reset_confirm(group, topic, what, req.query, stats, req.session.csrf),
            "groups",
        )
    return console.page(
        req,
        HTTPStatus.OK,
        f"Reset the offsets of {group}",
        pages.reset_form(group, topics, req.query.get("topic", "")),
        "groups",
    )


def reset(console: Console, req: Request, group: str) -> Response:
    credentials, who = console.operator(req, "reset offsets")
    topic, what, ms = reset_target(req.form)
    moved = console.call(lambda a: a.reset_offset(group, topic, timestamp=ms), credentials)
    log.info("console_reset_offset", group=group, topic=topic, timestamp=ms, by=who)
    return console.page(
        req,
        HTTPStatus.OK,
        "Offsets reset",
        pages.reset_done(group, topic, what, moved),
        "groups",
    )

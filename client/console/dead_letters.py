"""The console's dead-letter pages: a group's dead-lettered messages, and their resend after
a confirmation."""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from txmq.protocol.topics import DLQ_GROUP_TOPIC_PREFIX

from ..logs import get_logger
from . import pages
from .web import ConsoleError, Request, Response

if TYPE_CHECKING:
    from .server import Console

# The console server's logger: an application's settings for it cover these events too.
log = get_logger("txmq.client.console.server")


def client_config(console: Console, credentials: tuple[str | None, str | None]) -> Any:
    from ..config import ClientConfig

    return ClientConfig(access_key=credentials[0], secret_key=credentials[1], tls=console.tls)


def dlq_groups(console: Console) -> list[str]:
    names = console.call(lambda a: a.list_topics())
    return sorted(
        n[len(DLQ_GROUP_TOPIC_PREFIX) :] for n in names if n.startswith(DLQ_GROUP_TOPIC_PREFIX)
    )


def dlq_messages(console: Console, group: str) -> list[Any]:
    from ..dlq import read_dlq

    msgs: list[Any] = console.loop.run(
        read_dlq(group, console.broker, client_config(console, console.credentials), limit=500),
        timeout=console.timeout * 6,
    )
    return msgs


def dlq(console: Console, req: Request) -> Response:
    group = req.query.get("group", "").strip()
    msgs = dlq_messages(console, group) if group else None
    return console.page(
        req,
        HTTPStatus.OK,
        f"Dead letters of {group}" if group else "Dead letters",
        pages.dlq(dlq_groups(console), group, msgs, console.can_act(req)),
        "dlq",
    )


def dlq_pick(console: Console, group: str, msg_id: str) -> list[Any]:
    if not group:
        raise ConsoleError(HTTPStatus.BAD_REQUEST, "Name the consumer group.")
    msgs = dlq_messages(console, group)
    if msg_id:
        msgs = [m for m in msgs if msg_id in (m.msg_id, m.offset_msg_id)]
        if not msgs:
            raise ConsoleError(HTTPStatus.NOT_FOUND, f"No message {msg_id!r} in %DLQ%{group}.")
    if not msgs:
        raise ConsoleError(HTTPStatus.NOT_FOUND, f"No dead-lettered message of {group}.")
    return msgs


def dlq_confirm(console: Console, req: Request) -> Response:
    console.operator(req, "resend dead letters")
    group, msg_id = req.query.get("group", ""), req.query.get("id", "")
    msgs = dlq_pick(console, group, msg_id)
    return console.page(
        req,
        HTTPStatus.OK,
        "Resend dead letters?",
        pages.dlq_confirm(group, msg_id, msgs, req.session.csrf),
        "dlq",
    )


def dlq_resend(console: Console, req: Request) -> Response:
    from ..dlq import resend

    credentials, who = console.operator(req, "resend dead letters")
    group, msg_id = req.form.get("group", ""), req.form.get("id", "")
    msgs = dlq_pick(console, group, msg_id)
    try:
        done = console.loop.run(
            resend(msgs, console.broker, client_config(console, credentials)),
            timeout=console.timeout * 6,
        )
    except ValueError as exc:
        raise ConsoleError(HTTPStatus.CONFLICT, str(exc)) from None
    log.info("console_dlq_resend", group=group, count=len(done), by=who)
    return console.page(req, HTTPStatus.OK, "Resent", pages.dlq_resent(group, done), "dlq")

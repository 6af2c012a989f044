"""What every ``txmq`` command shares: the ``--broker`` and ``--output`` options, one admin call
to a broker with errors made clean CLI errors, the credentials and TLS given to the top-level
command, and the printing of results (a table for people, JSON for scripts)."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import click

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _env_option(*decls: str, help: str, **attrs: Any) -> Callable[[F], F]:
    """A click option that may also come from the environment variable ``TXMQ_<FLAG>`` (its
    long flag in capitals, ``--tls-ca``: ``TXMQ_TLS_CA``), which ``help`` ends by naming."""
    envvar = "TXMQ_" + decls[0].removeprefix("--").upper().replace("-", "_")
    return click.option(*decls, envvar=envvar, help=f"{help} (env {envvar}).", **attrs)


BROKER_OPTION = _env_option(
    "--broker",
    "-b",
    default="127.0.0.1:10911",
    show_default=True,
    help="Broker address host:port",
)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    from txmq.client.bridge import run_coroutine
    from txmq.protocol.errors import TxmqError

    try:
        return run_coroutine(coro)
    except TxmqError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


def _credentials() -> tuple[str | None, str | None]:
    """``(access_key, secret_key)`` given to the top-level command (None when not)."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    if not isinstance(obj, dict):
        return None, None
    return obj.get("access_key"), obj.get("secret_key")


def _tls() -> Any:
    """The TLS context given to the top-level command (False for plain TCP)."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return obj.get("tls", False) if isinstance(obj, dict) else False


def _client_config() -> Any:
    """The SDK's ClientConfig carrying the command's credentials and TLS settings."""
    from txmq.client.config import ClientConfig

    access_key, secret_key = _credentials()
    return ClientConfig(access_key=access_key, secret_key=secret_key, tls=_tls())


def _admin(broker: str, call: Callable[[Any], Awaitable[T]]) -> T:
    """Open an admin connection to ``broker``, make one call, close; errors become clean CLI
    errors."""
    from txmq.client.admin import AsyncAdminClient

    access_key, secret_key = _credentials()
    tls = _tls()

    async def go() -> T:
        async with AsyncAdminClient(
            broker, access_key=access_key, secret_key=secret_key, tls=tls
        ) as admin:
            return await call(admin)

    return _run(go())


def _leaders(broker: str, topic: str | None = None) -> list[tuple[str, str]]:
    """Cluster mode: ``(group, leader address)`` of every broker group (holding ``topic``, when
    given) as ``broker`` sees the cluster; a single broker: ``[("", broker)]``.  A command that
    changes a topic or a consumer group everywhere runs once per entry."""
    from txmq.protocol.errors import ServiceNotAvailableError

    async def ask(admin: Any) -> list[tuple[str, str]]:
        try:
            doc = await admin.cluster_status()
        except ServiceNotAvailableError:
            return [("", broker)]
        names: set[str] | None = None
        if topic is not None:
            route = await admin.route(topic)
            names = {q["brokerName"] for q in (route or {}).get("queueDatas", [])}
        out = []
        for name, g in sorted(doc["groups"].items()):
            if names is not None and name not in names:
                continue
            if not g.get("leader"):
                raise click.ClickException(f"broker group {name} has no leader now; try again")
            out.append((name, g["leader"]["addr"]))
        return out

    return _admin(broker, ask)


def _echo_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))


def output_option(default: str, text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--output table|json`` (``-o``), defaulting to ``default``."""
    return click.option(
        "--output",
        "-o",
        type=click.Choice(["table", "json"]),
        default=default,
        show_default=True,
        help=text,
    )


OUTPUT_OPTION = output_option("table", "A table for people, or JSON for scripts.")


def _output_options(fn: Callable[..., None]) -> Callable[..., None]:
    """``--output table|json`` (``-o``) and the older ``--json`` (hidden, kept so scripts keep
    working) for a command whose function takes ``as_json``."""

    @functools.wraps(fn)
    def run(*args: Any, output: str, as_json: bool, **kwargs: Any) -> None:
        fn(*args, as_json=as_json or output == "json", **kwargs)

    run = click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as -o json.")(run)
    return OUTPUT_OPTION(run)


def _emit(rows: list[dict[str, Any]], output: str, columns: list[tuple[str, str, int]]) -> None:
    """``rows`` as JSON, or as a table of ``columns`` (key, title, width; a negative width
    aligns right)."""
    if output == "json":
        _echo_json(rows)
        return

    def cell(value: Any, width: int) -> str:
        return f"{value!s:>{-width}}" if width < 0 else f"{value!s:<{width}}"

    click.echo(" ".join(cell(title, w) for _, title, w in columns).rstrip())
    for r in rows:
        click.echo(" ".join(cell(r.get(key, ""), w) for key, _, w in columns).rstrip())


def _parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        out[key.strip()] = value.strip()
    return out


def _parse_time(value: str | None) -> Any:
    """``--begin`` / ``--end``: ms since the epoch, or an ISO 8601 date or time (local time
    unless it names a zone)."""
    if value is None:
        return None
    if value.strip().lstrip("-").isdigit():
        return int(value)
    from datetime import datetime

    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither ms since the epoch nor an ISO time"
        ) from None


def _body_preview(body: bytes, size: int = 200) -> str:
    try:
        text = body[:size].decode("utf-8")
    except UnicodeDecodeError:
        return body[: size // 2].hex() + ("..." if len(body) > size // 2 else "") + " (hex)"
    return text + ("..." if len(body) > size else "")


def _page_options(limit_help: str, default_limit: int | None = None) -> Callable[[F], F]:
    """``--limit`` and ``--cursor`` of a listing: at most ``--limit`` entries (asked for a page
    at a time), starting after ``--cursor`` (what a listing cut by ``--limit`` printed)."""

    def wrap(fn: F) -> F:
        fn = click.option(
            "--cursor",
            help="Start after this cursor (printed on stderr by a listing cut by --limit).",
        )(fn)
        return click.option(
            "--limit",
            type=click.IntRange(min=1),
            default=default_limit,
            show_default=default_limit is not None,
            help=limit_help,
        )(fn)

    return wrap


async def _collect_pages(
    fetch: Callable[[int, str | None], Awaitable[tuple[list[T], str | None]]],
    limit: int | None,
    cursor: str | None,
    page: int,
) -> tuple[list[T], str | None]:
    """Up to ``limit`` entries (None: all) of a paged listing from ``cursor`` on, and the
    cursor after the last one given (None: the listing's end).  ``fetch(n, cursor)`` answers a
    page of at most ``n`` and the next page's cursor."""
    out: list[T] = []
    while True:
        n = page if limit is None else min(page, limit - len(out))
        rows, cursor = await fetch(n, cursor)
        out += rows
        if cursor is None or (limit is not None and len(out) >= limit):
            return out, cursor


def _more(cursor: str | None) -> None:
    """Say on stderr where a listing cut by ``--limit`` goes on (stdout stays the listing)."""
    if cursor is not None:
        click.echo(f"more: --cursor {cursor}", err=True)

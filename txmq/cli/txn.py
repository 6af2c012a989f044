"""``txmq txn list|show|resume|commit|rollback|abort-batch``: inspect and resolve
transactions."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import click

from .common import (
    BROKER_OPTION,
    OUTPUT_OPTION,
    _admin,
    _collect_pages,
    _echo_json,
    _more,
    _output_options,
    _page_options,
)


@click.group()
def txn() -> None:
    """Inspect and resolve transactions (pending halves, parked ones, decisions)."""


@txn.command("list")
@BROKER_OPTION
@click.option("--group", "-g", help="Only this producer group.")
@click.option("--topic", "-t", help="Only transactions with messages for this topic.")
@click.option(
    "--state",
    "-s",
    default="PENDING,DISCARDED",
    show_default=True,
    help="Comma-separated states: PENDING, DISCARDED, COMMITTED, ROLLED_BACK.",
)
@_page_options("At most this many transactions, oldest first.", default_limit=100)
@click.option(
    "--two-phase",
    is_flag=True,
    help="Only two-phase transactions (prepared for an outside coordinator).",
)
@_output_options
def txn_list(
    broker: str,
    group: str | None,
    topic: str | None,
    state: str,
    limit: int,
    cursor: str | None,
    two_phase: bool,
    as_json: bool,
) -> None:
    """List transactions, oldest first (default: pending and parked ones)."""
    from txmq.client.admin import TRANSACTION_PAGE

    async def fetch(admin: Any) -> tuple[list[dict[str, Any]], str | None]:
        async def page(n: int, after: str | None) -> Any:
            return await admin.list_transactions_page(
                group=group, topic=topic, state=state, limit=n, after=after, two_phase=two_phase
            )

        return await _collect_pages(page, limit, cursor, TRANSACTION_PAGE)

    rows, more = _admin(broker, fetch)
    if as_json:
        _echo_json(rows)
        _more(more)
        return
    click.echo(
        f"{'transaction id':34} {'state':11} {'group':20} {'msgs':>4} {'checks':>6} {'age s':>8}"
    )
    for r in rows:
        click.echo(
            f"{r['transactionId']:34} {r['state']:11} {r['producerGroup']:20} "
            f"{len(r['halves']):>4} {r['checkTimes']:>6} {r.get('ageMs', 0) / 1000:>8.1f}"
        )
    _more(more)


@txn.command("show")
@BROKER_OPTION
@_output_options
@click.argument("transaction_id")
def txn_show(broker: str, transaction_id: str, as_json: bool) -> None:
    """Show one transaction (by transaction id, message id or offset message id)."""
    doc = _admin(broker, lambda admin: admin.get_transaction(transaction_id))
    if as_json:
        _echo_json(doc)
        return
    for key, value in sorted(doc.items()):
        shown = json.dumps(value, default=str) if isinstance(value, dict | list) else value
        click.echo(f"{key:20} {shown}")


@txn.command("resume")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("msg_id")
def txn_resume(broker: str, output: str, msg_id: str) -> None:
    """Put a parked transaction back under checking (RESUME_CHECK_HALF_MESSAGE)."""
    _echo_answer(broker, output, msg_id, lambda admin: admin.resume_transaction(msg_id))


def _echo_answer(
    broker: str, output: str, transaction_id: str, call: Callable[[Any], Awaitable[str]]
) -> None:
    """Make ``call`` and print the broker's answer; with -o json, the answer and the
    transaction as it now stands (``answer``, ``transaction``)."""

    async def go(admin: Any) -> dict[str, Any]:
        answer = await call(admin)
        if output != "json":
            return {"answer": answer}
        return {"answer": answer, "transaction": await admin.get_transaction(transaction_id)}

    doc = _admin(broker, go)
    if output == "json":
        _echo_json(doc)
        return
    click.echo(doc["answer"])


def _force(broker: str, output: str, transaction_id: str, commit: bool, reason: str) -> None:
    _echo_answer(
        broker,
        output,
        transaction_id,
        lambda admin: admin.force_decide(transaction_id, commit, reason),
    )


def _force_command(name: str) -> Callable[[Callable[..., None]], click.Command]:
    """``txmq txn <name> TRANSACTION_ID [--reason R]``: an operator's forced decision."""

    def make(fn: Callable[..., None]) -> click.Command:
        fn = click.option("--reason", default="", help="Recorded with the decision.")(fn)
        fn = click.argument("transaction_id")(fn)
        return txn.command(name)(BROKER_OPTION(OUTPUT_OPTION(fn)))

    return make


@_force_command("commit")
def txn_commit(broker: str, output: str, transaction_id: str, reason: str) -> None:
    """Force-commit a pending or parked transaction, as an operator."""
    _force(broker, output, transaction_id, True, reason)


@_force_command("rollback")
def txn_rollback(broker: str, output: str, transaction_id: str, reason: str) -> None:
    """Force-roll back a pending or parked transaction, as an operator."""
    _force(broker, output, transaction_id, False, reason)


@txn.command("abort-batch")
@BROKER_OPTION
@click.option("--group", "-g", required=True, help="The batch's producer group.")
@click.option("--batch-key", "-k", required=True, help="The batch key (txmq txn list shows it).")
@_output_options
def txn_abort_batch(broker: str, group: str, batch_key: str, as_json: bool) -> None:
    """Decide a batch with nothing committed: roll back its pending transactions (the
    orphans of a Spark query that will never run again) and refuse any later half of it.  A
    batch decided before keeps its decision."""
    answer = _admin(broker, lambda admin: admin.abort_batch(group, batch_key))
    if as_json:
        _echo_json(answer)
        return
    if not answer.get("first", True):
        click.echo(
            f"batch {batch_key} was decided before: {len(answer['committed'])} committed, "
            f"{len(answer['rolledBack'])} rolled back"
        )
    else:
        click.echo(f"batch {batch_key} aborted: {len(answer['rolledBack'])} rolled back")

"""``txmq acl``: ACL 2.0's users and policies on a broker with ``authenticationEnabled``
(``user create|update|list|delete``, ``policy create|list|delete``), and ``acl migrate`` to
turn a ``plain_acl.yml``'s accounts into users and policies.  Run as a super user (the
top-level ``--access-key``/``--secret-key``), or a user with Update on the cluster.  In a
cluster, changes go to every broker group's leader."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from .common import (
    BROKER_OPTION,
    OUTPUT_OPTION,
    _admin,
    _echo_json,
    _emit,
    _leaders,
    _output_options,
)

T = TypeVar("T")


# Not click's prompt=True: that asks on stdout, which then holds more than the result.
PASSWORD_OPTION = click.option(
    "--password",
    envvar="TXMQ_ACL_PASSWORD",
    help="The user's password, its secret key (env TXMQ_ACL_PASSWORD; asked when not given).",
)


def _everywhere(broker: str, call: Callable[[Any], Awaitable[T]]) -> list[T]:
    """Make a change on every broker group's leader (a single broker: on it): each group
    keeps the users and policies in its store and replicates them to its followers."""
    return [_admin(addr, call) for _, addr in _leaders(broker)]


def _change(
    broker: str,
    output: str,
    change: Callable[[Any], Awaitable[object]],
    read: Callable[[Any], Awaitable[object]],
    done: str,
) -> None:
    """Make ``change`` everywhere (:func:`_everywhere`), then print what ``read`` gives on the
    first leader (-o json: the broker's state after the change), or ``done``."""

    async def go(a: Any) -> object:
        await change(a)
        return await read(a) if output == "json" else None

    changed = _everywhere(broker, go)
    if output == "json":
        _echo_json(next(iter(changed), None))
        return
    click.echo(done)


def _subject(user: str) -> str:
    return user if user.startswith("User:") else f"User:{user}"


@click.group()
def acl() -> None:
    """ACL 2.0 (authenticationEnabled): users, their policies, and migration from ACL 1.0."""


# -- users ----------------------------------------------------------------------------------------


@acl.group()
def user() -> None:
    """Create, change, list and delete users (a user name is the client's access key)."""


@user.command("create")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("username")
@PASSWORD_OPTION
@click.option("--super", "super_user", is_flag=True, help="A super user: may do anything.")
@click.option("--disabled", is_flag=True, help="Create it disabled (refused until enabled).")
def user_create(
    broker: str,
    output: str,
    username: str,
    password: str | None,
    super_user: bool,
    disabled: bool,
) -> None:
    """Create USERNAME.

    With -o json, prints the user as the broker now holds it (never its password)."""
    if password is None:  # asked on stderr: stdout holds only the result (-o json in a pipe)
        password = str(click.prompt("Password", hide_input=True, err=True))

    _change(
        broker,
        output,
        lambda a: a.create_user(username, password, super_user=super_user, enabled=not disabled),
        lambda a: a.get_user(username),
        f"created user {username}",
    )


@user.command("update")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("username")
@click.option(
    "--password",
    envvar="TXMQ_ACL_PASSWORD",
    default=None,
    help="A new password (env TXMQ_ACL_PASSWORD).",
)
@click.option("--super/--normal", "super_user", default=None, help="Change the user's type.")
@click.option("--enable/--disable", "enabled", default=None, help="Enable or disable the user.")
def user_update(
    broker: str,
    output: str,
    username: str,
    password: str | None,
    super_user: bool | None,
    enabled: bool | None,
) -> None:
    """Change USERNAME's password, type or status.

    With -o json, prints the user as the broker now holds it (never its password)."""

    _change(
        broker,
        output,
        lambda a: a.update_user(
            username, password=password, super_user=super_user, enabled=enabled
        ),
        lambda a: a.get_user(username),
        f"updated user {username}",
    )


@user.command("list")
@BROKER_OPTION
@click.option("--filter", "name_filter", default="", help="Only names containing this.")
@_output_options
def user_list(broker: str, name_filter: str, as_json: bool) -> None:
    """Every user (never their passwords)."""
    rows = _admin(broker, lambda a: a.list_users(name_filter))
    _emit(
        rows,
        "json" if as_json else "table",
        [("username", "username", 24), ("userType", "type", 8), ("userStatus", "status", 0)],
    )


@user.command("delete")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("username")
def user_delete(broker: str, output: str, username: str) -> None:
    """Delete USERNAME and its policies."""
    _everywhere(broker, lambda a: a.delete_user(username))
    if output == "json":
        _echo_json({"username": username, "deleted": True})
        return
    click.echo(f"deleted user {username}")


# -- policies -------------------------------------------------------------------------------------


@acl.group()
def policy() -> None:
    """Create, list and delete a user's policy entries."""


@policy.command("create")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("username")
@click.option(
    "--resource",
    "-r",
    "resources",
    multiple=True,
    required=True,
    help="Topic:orders, Topic:order* (a prefix), Topic:*, Group:g1, Cluster:*, * (repeatable).",
)
@click.option(
    "--action",
    "-a",
    "actions",
    multiple=True,
    required=True,
    help="Pub, Sub, Create, Update, Delete, Get, List or All (repeatable).",
)
@click.option("--source-ip", "source_ips", multiple=True, help="Only from these (repeatable).")
@click.option(
    "--decision", type=click.Choice(["Allow", "Deny"]), default="Allow", show_default=True
)
@click.option(
    "--policy-type", type=click.Choice(["Custom", "Default"]), default="Custom", show_default=True
)
def policy_create(
    broker: str,
    output: str,
    username: str,
    resources: tuple[str, ...],
    actions: tuple[str, ...],
    source_ips: tuple[str, ...],
    decision: str,
    policy_type: str,
) -> None:
    """Give USERNAME an entry per resource (replacing its entry of the same resource).

    With -o json, prints the user's policies as the broker now holds them."""
    entries = [
        {
            "resource": r,
            "actions": list(actions),
            "sourceIps": list(source_ips),
            "decision": decision,
        }
        for r in resources
    ]
    policies = [{"policyType": policy_type, "entries": entries}]
    subject = _subject(username)

    _change(
        broker,
        output,
        lambda a: a.create_acl(subject, policies),
        lambda a: a.get_acl(subject),
        f"{decision} {','.join(actions)} on {', '.join(resources)} for {username}",
    )


@policy.command("list")
@BROKER_OPTION
@click.option("--user", "user_filter", default="", help="Only subjects containing this.")
@click.option("--resource", "resource_filter", default="", help="Only resources containing this.")
@_output_options
def policy_list(broker: str, user_filter: str, resource_filter: str, as_json: bool) -> None:
    """Every user's policy entries, one row each."""
    acls = _admin(broker, lambda a: a.list_acls(user_filter, resource_filter))
    if as_json:
        click.echo(json.dumps(acls, indent=2, sort_keys=True))
        return
    rows = [
        {
            "subject": doc["subject"],
            "policyType": p["policyType"],
            "resource": e["resource"],
            "actions": ",".join(e["actions"]),
            "sourceIps": ",".join(e.get("sourceIps") or []) or "*",
            "decision": e["decision"],
        }
        for doc in acls
        for p in doc["policies"]
        for e in p["entries"]
    ]
    _emit(
        rows,
        "table",
        [("subject", "subject", 20), ("policyType", "policy", 8), ("resource", "resource", 24)]
        + [("actions", "actions", 16), ("sourceIps", "from", 16), ("decision", "decision", 0)],
    )


@policy.command("delete")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("username")
@click.option("--resource", "-r", default=None, help="Only this resource's entry.")
@click.option("--policy-type", type=click.Choice(["Custom", "Default"]), default=None)
def policy_delete(
    broker: str, output: str, username: str, resource: str | None, policy_type: str | None
) -> None:
    """Delete USERNAME's entries (of one resource, or all)."""
    _everywhere(broker, lambda a: a.delete_acl(_subject(username), resource, policy_type))
    if output == "json":
        doc = {"subject": _subject(username), "resource": resource, "policyType": policy_type}
        _echo_json({**doc, "deleted": True})
        return
    click.echo(f"deleted {resource or 'every'} entry of {username}")


# -- migration ------------------------------------------------------------------------------------


@acl.command("migrate")
@BROKER_OPTION
@click.option(
    "--from",
    "source",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The ACL 1.0 file (plain_acl.yml).",
)
@click.option("--dry-run", is_flag=True, help="Print the users and policies; change nothing.")
@_output_options
def migrate(broker: str, source: str, dry_run: bool, as_json: bool) -> None:
    """Create a user and its policies for each account of a plain_acl.yml, as RocketMQ's own
    migration does: topicPerms and groupPerms become the Custom policy, defaultTopicPerm and
    defaultGroupPerm the Default policy (Topic:*, Group:*), a whiteRemoteAddress the sourceIps
    of the allowing entries; an admin account becomes a super user (or, with a
    whiteRemoteAddress or perms of its own, a user allowed everything from its addresses).  A
    user that exists already is left as it is.  Warns where ACL 2.0 would allow more."""
    from txmq.broker.acl import AclConfigError
    from txmq.broker.auth2 import migrate_plain_acl

    try:
        plan = migrate_plain_acl(source)
    except AclConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for m in plan:
        for note in m.notes:
            click.echo(f"warning: {m.user['username']}: {note}", err=True)
    if dry_run:
        doc = [
            {"user": {k: v for k, v in m.user.items() if k != "password"}, "acl": m.acl}
            for m in plan
        ]
        click.echo(json.dumps(doc, indent=2))
        return

    async def go(admin: Any) -> list[dict[str, Any]]:
        rows = []
        for m in plan:
            u, name = m.user, m.user["username"]
            if await admin.get_user(name) is not None:
                rows.append({"username": name, "userType": u["userType"], "result": "exists"})
                continue
            await admin.create_user(
                name, u["password"], super_user=u["userType"] == "Super", enabled=True
            )
            if m.acl is not None:
                await admin.create_acl(m.acl["subject"], m.acl["policies"])
            rows.append({"username": name, "userType": u["userType"], "result": "created"})
        return rows

    rows = [r for done in _everywhere(broker, go) for r in done]
    _emit(
        rows,
        "json" if as_json else "table",
        [("username", "username", 24), ("userType", "type", 8), ("result", "result", 0)],
    )

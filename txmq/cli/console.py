"""``txmq console``: serve the web console for a broker, and manage its own users."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .common import BROKER_OPTION, OUTPUT_OPTION, _credentials, _echo_json, _tls

if TYPE_CHECKING:
    import ssl

    from txmq.client.console.users import Users


@click.group(invoke_without_command=True)
@BROKER_OPTION
@click.option(
    "--listen",
    default="127.0.0.1:8088",
    show_default=True,
    envvar="TXMQ_CONSOLE_LISTEN",
    help="host:port the console serves on (port 0: any free port) (env TXMQ_CONSOLE_LISTEN).",
)
@click.option(
    "--users",
    "users_file",
    type=click.Path(dir_okay=False),
    envvar="TXMQ_CONSOLE_USERS",
    help="The console's own users (YAML; see 'txmq console add-user'): every page then needs "
    "a sign-in, and only operators act (env TXMQ_CONSOLE_USERS).",
)
@click.option(
    "--tls-cert", type=click.Path(dir_okay=False), help="Serve HTTPS: the certificate (PEM)."
)
@click.option(
    "--tls-key", type=click.Path(dir_okay=False), help="Serve HTTPS: its private key (PEM)."
)
@click.option(
    "--sample-seconds",
    type=click.FloatRange(min=0.2),
    default=10.0,
    show_default=True,
    help="Seconds between the samples of the charts.",
)
@click.pass_context
def console(
    ctx: click.Context,
    broker: str,
    listen: str,
    users_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    sample_seconds: float,
) -> None:
    """Serve a web console for BROKER: its state and charts, topics, consumer groups and lag,
    transactions (commit, roll back, resume), messages, key search, traces, dead letters
    (resend) and offset resets.  With --users, people sign in with the console's own accounts
    (viewer or operator); without it, with the broker's ACL on, they sign in with their broker
    accounts.  Runs until interrupted."""
    if ctx.invoked_subcommand is not None:
        return
    import signal

    from txmq.client.admin import split_address
    from txmq.client.console import Console

    # The checks in the order the options are given: address, TLS pair, users file.
    try:
        host, port = split_address(listen)
    except ValueError:
        raise click.BadParameter(
            f"must be host:port, got {listen!r}", param_hint="--listen"
        ) from None
    https = _https_context(tls_cert, tls_key)
    users = _console_users(users_file)
    access_key, secret_key = _credentials()
    try:
        server = Console(
            broker,
            access_key=access_key,
            secret_key=secret_key,
            tls=_tls(),
            host=host,
            port=port,
            users=users,
            https=https,
            sample_interval=sample_seconds,
        )
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from None
    click.echo(f"txmq console for broker {broker} on {server.url}")
    sys.stdout.flush()
    if users is None:
        click.echo(
            "WARN: no --users file: the console has no sign-in of its own. Unless the broker's "
            "ACL is on, anyone who reaches this port can commit and roll back transactions, "
            "resend dead letters and reset offsets.",
            err=True,
        )
    # SIGTERM (a service manager, docker stop) ends it like Ctrl-C: the port is closed cleanly
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def _https_context(tls_cert: str | None, tls_key: str | None) -> ssl.SSLContext | None:
    """The console's HTTPS context from --tls-cert and --tls-key, or None to serve HTTP."""
    import ssl

    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("give both --tls-cert and --tls-key, or neither")
    https = None
    if tls_cert and tls_key:
        https = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        https.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            https.load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise click.ClickException(f"cannot load the TLS certificate: {exc}") from None
    return https


def _console_users(users_file: str | None) -> Users | None:
    """The console's own users from --users, or None when it has none."""
    if not users_file:
        return None
    import importlib.util

    from txmq.client.console.users import Users, UsersFileError

    if importlib.util.find_spec("yaml") is None:
        raise click.ClickException(
            "--users needs the 'console' extra (PyYAML): pip install 'txmq[console]'"
        )
    try:
        users = Users.load(users_file)
    except UsersFileError as exc:
        raise click.ClickException(str(exc)) from None
    if not users.users:
        raise click.ClickException(f"{users_file} holds no user")
    return users


@console.command("add-user")
@click.argument("users_file", metavar="FILE", type=click.Path(dir_okay=False))
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(["viewer", "operator"]),
    default="viewer",
    show_default=True,
    help="viewer: reads every page; operator: also acts.",
)
@click.option(
    "--password",
    envvar="TXMQ_CONSOLE_PASSWORD",
    prompt=True,
    hide_input=True,
    confirmation_prompt=True,
    help="Asked for when not given (env TXMQ_CONSOLE_PASSWORD).",
)
@OUTPUT_OPTION
def console_add_user(users_file: str, name: str, role: str, password: str, output: str) -> None:
    """Add user NAME to the console's users FILE (created, mode 0600, when missing), or change
    its password and role.  The password is stored as a salted scrypt hash."""
    from txmq.client.console.users import UsersFileError, add_user

    if len(password) < 8:
        raise click.BadParameter("at least 8 characters", param_hint="--password")
    try:
        new = add_user(users_file, name, password, role)
    except UsersFileError as exc:
        raise click.ClickException(str(exc)) from None
    if output == "json":
        _echo_json({"user": name, "role": role, "file": users_file, "added": new})
        return
    click.echo(f"{'added' if new else 'updated'} {role} {name} in {users_file}")

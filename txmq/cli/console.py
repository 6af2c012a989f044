"""``txmq console``: serve the web console for a broker."""

from __future__ import annotations

import sys

import click

from .common import BROKER_OPTION, _credentials, _tls


@click.command()
@BROKER_OPTION
@click.option(
    "--listen",
    default="127.0.0.1:8088",
    show_default=True,
    envvar="TXMQ_CONSOLE_LISTEN",
    help="host:port the console serves HTTP on (port 0: any free port) (env TXMQ_CONSOLE_LISTEN).",
)
def console(broker: str, listen: str) -> None:
    """Serve a web console for BROKER: its state, topics, consumer groups and lag,
    transactions (commit, roll back, resume) and messages.  Pages are read with the account
    given to txmq (--access-key); with the broker's ACL on, operators sign in and their actions
    are signed with their own account.  Runs until interrupted."""
    import signal

    from txmq.client.admin import split_address
    from txmq.client.console import Console

    try:
        host, port = split_address(listen)
    except ValueError:
        raise click.BadParameter(
            f"must be host:port, got {listen!r}", param_hint="--listen"
        ) from None
    access_key, secret_key = _credentials()
    try:
        server = Console(
            broker, access_key=access_key, secret_key=secret_key, tls=_tls(), host=host, port=port
        )
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from None
    click.echo(f"txmq console for broker {broker} on {server.url}")
    sys.stdout.flush()
    # SIGTERM (a service manager, docker stop) ends it like Ctrl-C: the port is closed cleanly
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()

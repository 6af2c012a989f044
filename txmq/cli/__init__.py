"""The ``txmq`` command line: serve a broker, send and consume, administer topics and
transactions.

Every client command takes ``--broker host:port`` (environment: ``TXMQ_BROKER``; default
127.0.0.1:10911).  With the broker's ACL on, give the account before the command:
``txmq --access-key AK --secret-key SK ...`` (environment: ``TXMQ_ACCESS_KEY``,
``TXMQ_SECRET_KEY``); every request is then signed.  With the broker's TLS on, add ``--tls``
(the system's CA store) or ``--tls-ca ca.pem``, and ``--tls-cert`` / ``--tls-key`` for mutual TLS
(environment: ``TXMQ_TLS``, ``TXMQ_TLS_CA``, ``TXMQ_TLS_CERT``, ``TXMQ_TLS_KEY``).  The broker
command resolves its configuration as defaults < ``--config`` file < ``TXMQ_*`` environment
variables < flags.
"""

from __future__ import annotations

import sys

import click

from txmq import _compiled

# One module per command or group of commands (each imports what its command needs beyond click
# when it runs, so that `txmq --help` stays quick); main, below, gathers them.
from . import (
    acl,
    broker,
    cluster,
    config,
    console,
    consume,
    dlq,
    group,
    message,
    probe,
    send,
    status,
    topic,
    trace,
    txn,
)
from .common import _env_option


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    package_name="txmq", message=f"%(prog)s, version %(version)s ({_compiled.STATUS.describe()})"
)
@_env_option("--access-key", help="ACL account to sign requests with")
@click.option(
    "--secret-key",
    envvar="TXMQ_SECRET_KEY",
    help="Its secret key (env TXMQ_SECRET_KEY; prefer the environment to the command line).",
)
@_env_option(
    "--tls",
    "use_tls",
    is_flag=True,
    help="Connect with TLS, checking the broker against the system's CAs",
)
@_env_option(
    "--tls-ca",
    type=click.Path(dir_okay=False),
    help="CA file (PEM) the broker's certificate is checked against; implies --tls",
)
@_env_option(
    "--tls-cert",
    type=click.Path(dir_okay=False),
    help="Client certificate (PEM) for mutual TLS; implies --tls",
)
@_env_option("--tls-key", type=click.Path(dir_okay=False), help="Its private key (PEM)")
@click.pass_context
def main(
    ctx: click.Context,
    access_key: str | None,
    secret_key: str | None,
    use_tls: bool,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """txmq: a transactional message broker in the Apache RocketMQ tradition."""
    if bool(access_key) != bool(secret_key):
        raise click.UsageError("--access-key and --secret-key go together")
    ctx.obj = {"access_key": access_key, "secret_key": secret_key} if access_key else {}
    if use_tls or tls_ca or tls_cert or tls_key:
        from txmq.client.config import tls_context

        try:
            ctx.obj["tls"] = tls_context(tls_ca, tls_cert, tls_key)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None

    # Client commands print results, not the SDK's events: its warnings go to stderr, so that
    # stdout holds only the result (-o json); `txmq broker` sets its own level and stream.
    try:
        from txmq.broker.logging import configure_logging
    except ModuleNotFoundError:  # the SDK alone (no 'broker' extra): the SDK logs to stdlib
        import logging

        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
    else:
        configure_logging("WARNING", stream=sys.stderr)


for _command in (  # txmq --help lists them by name
    broker.broker,
    status.status,
    status.connections,
    probe.probe,
    cluster.cluster,
    topic.topic,
    send.send,
    consume.consume,
    group.group,
    config.config,
    txn.txn,
    console.console,
    message.message,
    dlq.dlq,
    trace.trace,
    acl.acl,
):
    main.add_command(_command)

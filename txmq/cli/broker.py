"""``txmq broker``: serve a broker, its configuration resolved as defaults < ``--config`` file <
``TXMQ_*`` environment variables < flags."""

from __future__ import annotations

import sys
from typing import Any

import click

from txmq import _compiled

from .common import _echo_json, _env_option, _parse_sets


def _require_broker_extra() -> None:
    """The broker's dependencies are an extra of the package: say which when one is missing
    (an SDK-only install), instead of a traceback."""
    import importlib.util

    missing = [
        m
        for m in ("structlog", "prometheus_client", "yaml", "lark")
        if not importlib.util.find_spec(m)
    ]
    if missing:
        raise click.ClickException(
            f"the broker needs the 'broker' extra ({', '.join(missing)} missing): "
            "pip install 'txmq[broker]'"
        )


def _log_code_path() -> None:
    """One line at start: which code path runs (compiled modules, or pure Python and why)."""
    import structlog

    status = _compiled.STATUS
    structlog.get_logger("txmq.broker").info(
        "code_path",
        path=status.describe(),
        compiled=len(status.modules),
        stale=list(status.stale),
    )


@click.command()
@_env_option(
    "--config",
    "-c",
    "config_path",
    type=click.Path(dir_okay=False),
    help="TOML file with RocketMQ key names",
)
@click.option("--port", "-p", type=int, help="listenPort (default 10911).")
@click.option("--bind", "bind_address", help="bindAddress (default 127.0.0.1).")
@click.option("--store-dir", help="storePathRootDir (default ./data).")
@click.option(
    "--flush",
    type=click.Choice(["ASYNC_FLUSH", "SYNC_FLUSH", "async", "sync"], case_sensitive=False),
    help="flushDiskType: ASYNC_FLUSH (default) or SYNC_FLUSH.",
)
@click.option("--transaction-timeout", type=int, help="transactionTimeOut in ms (default 6000).")
@click.option(
    "--transaction-check-interval", type=int, help="transactionCheckInterval in ms (default 30000)."
)
@click.option("--transaction-check-max", type=int, help="transactionCheckMax (default 15).")
@click.option("--file-reserved-time", type=float, help="fileReservedTime in hours (default 72).")
@click.option(
    "--reject-transaction-message/--accept-transaction-message",
    default=None,
    help="rejectTransactionMessage (default: accept).",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any configuration key by its RocketMQ name, e.g. --set maxMessageSize=1048576.",
)
@click.option("--log-level", default="INFO", show_default=True, envvar="TXMQ_LOG_LEVEL")
@click.option("--print-config", is_flag=True, help="Print the resolved configuration and exit.")
def broker(
    config_path: str | None,
    port: int | None,
    bind_address: str | None,
    store_dir: str | None,
    flush: str | None,
    transaction_timeout: int | None,
    transaction_check_interval: int | None,
    transaction_check_max: int | None,
    file_reserved_time: float | None,
    reject_transaction_message: bool | None,
    sets: tuple[str, ...],
    log_level: str,
    print_config: bool,
) -> None:
    """Serve a broker until SIGTERM/SIGINT (then stop gracefully)."""
    _require_broker_extra()
    from txmq.broker.config import ConfigError, load_config
    from txmq.broker.logging import configure_logging

    overrides: dict[str, Any] = _parse_sets(sets)
    if flush:
        flush = flush.upper()
        overrides["flushDiskType"] = flush if flush.endswith("_FLUSH") else f"{flush}_FLUSH"
    overrides.update(
        {
            k: v
            for k, v in {
                "listenPort": port,
                "bindAddress": bind_address,
                "storePathRootDir": store_dir,
                "transactionTimeOut": transaction_timeout,
                "transactionCheckInterval": transaction_check_interval,
                "transactionCheckMax": transaction_check_max,
                "fileReservedTime": file_reserved_time,
                "rejectTransactionMessage": reject_transaction_message,
            }.items()
            if v is not None
        }
    )
    try:
        config = load_config(config_path, overrides=overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if print_config:
        _echo_json(config.as_rocketmq_dict())
        return
    configure_logging(log_level)
    _log_code_path()
    _serve(config)


def _serve(config: Any) -> None:
    """Serve ``config``'s broker (a replica of a cluster when it names etcd endpoints) until it
    is stopped, then exit with its status; what keeps it from starting is a clean CLI error."""
    from txmq.broker.config import ConfigError
    from txmq.broker.server import PortInUseError, serve
    from txmq.broker.store import StoreLockedError

    try:
        if config.etcd_endpoints:
            try:
                from txmq.broker.cluster.etcd import EtcdError
                from txmq.broker.cluster.node import serve_cluster
            except ImportError as exc:
                raise click.ClickException(
                    f"cluster mode (etcdEndpoints) needs the cluster extra: "
                    "pip install -e '.[cluster]' in the checkout, or the wheel with [cluster] "
                    f"({exc})"
                ) from None

            try:
                sys.exit(serve_cluster(config))
            except EtcdError as exc:
                raise click.ClickException(str(exc)) from None
        sys.exit(serve(config))
    except (StoreLockedError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    except PortInUseError as exc:
        raise click.ClickException(
            f"port {exc.port} on {exc.host} is already in use (another broker?): "
            "choose a free one with --port or listenPort in the config file"
        ) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start the broker: {exc}") from None

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

import asyncio
import functools
import json
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from txmq import _compiled

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


OUTPUT_OPTION = click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="A table for people, or JSON for scripts.",
)


def _output_options(fn: Callable[..., None]) -> Callable[..., None]:
    """``--output table|json`` (``-o``) and the older ``--json`` (hidden, kept so scripts keep
    working) for a command whose function takes ``as_json``."""

    @functools.wraps(fn)
    def run(*args: Any, output: str, as_json: bool, **kwargs: Any) -> None:
        fn(*args, as_json=as_json or output == "json", **kwargs)

    run = click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as -o json.")(run)
    return OUTPUT_OPTION(run)


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
    from txmq.broker.logging import configure_logging

    if bool(access_key) != bool(secret_key):
        raise click.UsageError("--access-key and --secret-key go together")
    ctx.obj = {"access_key": access_key, "secret_key": secret_key} if access_key else {}
    if use_tls or tls_ca or tls_cert or tls_key:
        from txmq.client.config import tls_context

        try:
            ctx.obj["tls"] = tls_context(tls_ca, tls_cert, tls_key)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None

    # Client commands print results, not the SDK's events; `txmq broker` sets its own level.
    configure_logging("WARNING")


# --- broker -----------------------------------------------------------------------------------


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


def _parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        out[key.strip()] = value.strip()
    return out


@main.command()
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


# --- status -----------------------------------------------------------------------------------


@main.command()
@BROKER_OPTION
@_output_options
def status(broker: str, as_json: bool) -> None:
    """Ping the broker and print key figures (exit status 1 if it does not answer)."""
    t0 = time.perf_counter()
    info = _admin(broker, lambda admin: admin.runtime_info())
    ms = (time.perf_counter() - t0) * 1000  # connect + one request: the ping a user sees
    if as_json:
        _echo_json({"pingMs": round(ms, 2), **info})
        return
    click.echo(
        f"broker {info['brokerName']} at {info['address']} is up "
        f"(ping {ms:.1f} ms, version {info['brokerVersion']}, "
        f"uptime {info['uptimeMs'] / 1000:.0f} s)"
    )
    keys = [
        "flushDiskType",
        "topics",
        "connections",
        "store.commit_log_max_offset",
        "store.commit_log_unflushed_bytes",
        "store.commit_log_segments",
        "txn.pending",
        "txn.discarded",
        "txn.committed",
        "txn.rolledBack",
    ]
    for k in keys:
        if k in info:
            click.echo(f"  {k:28} {info[k]}")


# --- probe ------------------------------------------------------------------------------------


@main.command()
@click.argument("what", type=click.Choice(["ready", "health"]), default="ready")
@_env_option(
    "--config",
    "-c",
    "config_path",
    type=click.Path(dir_okay=False),
    help="The broker's configuration file, read with the TXMQ_* environment as the broker "
    "reads them: the port (metricsPort), whether it speaks HTTPS (tls.server.mode enforcing) "
    "and, under need.client.auth, the certificate to present (the broker's own)",
)
@click.option(
    "--port",
    type=int,
    help="The broker's operations port [default: metricsPort of the configuration, else 9876].",
)
@click.option(
    "--host", help="[default: bindAddress of the configuration; 127.0.0.1 for every interface]"
)
@click.option(
    "--https",
    is_flag=True,
    envvar="TXMQ_PROBE_HTTPS",
    help="Speak HTTPS even if the configuration does not say TLS is enforcing.",
)
@click.option("--timeout", type=float, default=3.0, show_default=True)
def probe(
    what: str,
    config_path: str | None,
    port: int | None,
    host: str | None,
    https: bool,
    timeout: float,
) -> None:
    """Ask the operations port whether the broker is ready (/readyz: it takes traffic) or
    healthy (/healthz: the process serves and its event loop turns); exit status 0 if so, 1
    with the reason if not.  What container health checks run: it needs no flag where the
    broker's configuration file (TXMQ_CONFIG) and environment are those of the broker."""
    import ssl
    import urllib.error
    import urllib.request

    from txmq.broker.config import ConfigError, load_config

    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        click.echo(f"cannot read the broker's configuration: {exc}", err=True)
        sys.exit(1)
    if host is None:
        host = cfg.bind_address if cfg.bind_address not in ("", "0.0.0.0", "::") else "127.0.0.1"
    port = port or cfg.metrics_port or 9876
    https = https or cfg.tls_server_mode == "enforcing"
    path = "/readyz" if what == "ready" else "/healthz"
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address
    url = f"{'https' if https else 'http'}://{netloc}{path}"
    ctx = None
    if https:
        # The broker's own port on this host: its certificate is not checked (it names the
        # address clients use).  Under mutual TLS the probe presents the broker's certificate,
        # as followers do to their leader (it then needs the clientAuth extended key usage).
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if cfg.tls_server_need_client_auth != "none" and cfg.tls_server_cert_path:
            try:
                ctx.load_cert_chain(cfg.tls_server_cert_path, cfg.tls_server_key_path)
            except OSError as exc:  # ssl.SSLError included
                click.echo(f"cannot load the broker's certificate: {exc}", err=True)
                sys.exit(1)
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            click.echo(r.read().decode(errors="replace").strip())
    except urllib.error.HTTPError as exc:
        click.echo(exc.read().decode(errors="replace").strip() or str(exc), err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"no answer from {url}: {exc}", err=True)
        sys.exit(1)


# --- cluster ----------------------------------------------------------------------------------


@main.group()
def cluster() -> None:
    """Inspect a cluster (brokers started with etcdEndpoints) and place topics on its groups."""


@cluster.command("status")
@BROKER_OPTION
@_output_options
def cluster_status(broker: str, as_json: bool) -> None:
    """Groups, their leaders, in-sync replicas, lag and epochs (asked of any one broker)."""
    doc = _admin(broker, lambda admin: admin.cluster_status())
    if as_json:
        _echo_json(doc)
        return
    me = doc.get("self", {})
    click.echo(
        f"cluster {doc['cluster']} (asked {me.get('addr')}: replica {me.get('replicaId')} of "
        f"{me.get('group')}, {me.get('role')})"
    )
    for name, g in sorted(doc["groups"].items()):
        leader = g["leader"]
        who = f"replica {leader['replicaId']} at {leader['addr']}" if leader else "NONE"
        click.echo(f"group {name}: leader {who}, epoch {g['epoch']}")
        click.echo(f"  members   {', '.join(f'{k}={v}' for k, v in sorted(g['members'].items()))}")
        click.echo(f"  in sync   {g['inSync']}")
        lag = ", ".join(f"{k}: {v} B" for k, v in sorted(g["lag"].items())) or "-"
        click.echo(f"  lag       {lag} (leader end {g['leaderEnd']})")
        click.echo(f"  topics    {', '.join(g['topics']) or '-'}")


@cluster.command("list")
@BROKER_OPTION
@OUTPUT_OPTION
def cluster_list(broker: str, output: str) -> None:
    """Every broker of the cluster, one line each: its group, replica id, address, role,
    whether it is in sync and how far behind its leader (mqadmin clusterList)."""
    doc = _admin(broker, lambda admin: admin.cluster_status())
    rows = []
    for name, g in sorted(doc["groups"].items()):
        leader = (g.get("leader") or {}).get("replicaId")
        for rid, addr in sorted(g["members"].items(), key=lambda kv: int(kv[0])):
            is_leader = leader is not None and int(rid) == int(leader)
            rows.append(
                {
                    "cluster": doc["cluster"],
                    "group": name,
                    "replica": int(rid),
                    "addr": addr,
                    "role": "leader" if is_leader else "follower",
                    "inSync": int(rid) in g["inSync"],
                    "lagBytes": 0 if is_leader else g["lag"].get(str(rid), ""),
                    "epoch": g["epoch"],
                }
            )
    _emit(
        rows,
        output,
        [("cluster", "cluster", 16), ("group", "group", 12), ("replica", "replica", -7)]
        + [("addr", "address", 22), ("role", "role", 9), ("inSync", "in sync", 8)]
        + [("lagBytes", "lag (B)", -10), ("epoch", "epoch", -6)],
    )


@cluster.command("place")
@BROKER_OPTION
@click.argument("topic_name")
@click.option("--group", "group_name", required=True, help="The broker group (brokerName).")
@click.option("--queues", "-q", default=4, show_default=True, help="Queues in that group.")
@click.option(
    "--read-only",
    is_flag=True,
    help="Stop new writes to the group's queues of the topic (consumers drain them): the "
    "step that moves a topic's traffic off a group.",
)
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds to wait until every broker of the cluster routes the topic as placed "
    "(0: return once the group's leader has it).",
)
def cluster_place(
    broker: str, topic_name: str, group_name: str, queues: int, read_only: bool, wait_s: float
) -> None:
    """Give TOPIC_NAME queues in broker group GROUP (create or update them on its leader), and
    return once every broker's route answer shows it."""
    doc = _admin(broker, lambda admin: admin.cluster_status())
    g = doc["groups"].get(group_name)
    if g is None or not g.get("leader"):
        raise click.ClickException(
            f"broker group {group_name!r} has no leader now (groups: {sorted(doc['groups'])})"
        )
    perm = 4 if read_only else 6
    _admin(g["leader"]["addr"], lambda admin: admin.create_topic(topic_name, queues, perm=perm))
    if wait_s > 0:
        brokers = sorted(
            {broker} | {addr for grp in doc["groups"].values() for addr in grp["members"].values()}
        )
        _wait_placed(brokers, topic_name, group_name, queues, perm, wait_s)
    click.echo(
        f"topic {topic_name}: {queues} queues in group {group_name}"
        + (" (read-only)" if read_only else "")
    )


def _wait_placed(
    brokers: list[str], topic: str, group: str, queues: int, perm: int, wait_s: float
) -> None:
    """Poll each broker's route of ``topic`` until it lists ``group`` with ``queues`` queues
    and ``perm``: the placement travels from the leader through etcd to every broker."""

    def placed(route: dict[str, Any] | None) -> bool:
        for q in (route or {}).get("queueDatas", []):
            if q["brokerName"] == group:
                return bool(q["readQueueNums"] == queues and q["perm"] == perm)
        return False

    deadline = time.monotonic() + wait_s
    pending = list(brokers)
    click.echo(f"waiting for {len(pending)} brokers to route {topic} as placed", err=True)
    while pending:
        addr = pending[0]
        try:
            ok = placed(_admin(addr, lambda admin: admin.route(topic)))
        except click.ClickException:  # a broker down right now: not routing it, say so below
            ok = False
        if ok:
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"placed on group {group}'s leader, but after {wait_s:.0f}s these brokers do "
                f"not route {topic} as placed yet: {', '.join(pending)}"
            )
        time.sleep(0.2)


# --- topics -----------------------------------------------------------------------------------


@main.group()
def topic() -> None:
    """Create, list and inspect topics."""


@topic.command("create")
@BROKER_OPTION
@click.argument("name")
@click.option("--queues", "-q", default=4, show_default=True, help="Read and write queues.")
@click.option("--order", is_flag=True, help="Mark the topic as ordered.")
def topic_create(broker: str, name: str, queues: int, order: bool) -> None:
    """Create (or update) topic NAME."""
    _admin(broker, lambda admin: admin.create_topic(name, queues, order=order))

    click.echo(f"topic {name} created with {queues} queues")


@topic.command("list")
@BROKER_OPTION
@_output_options
@click.option("--all", "show_all", is_flag=True, help="Include system, retry and DLQ topics.")
def topic_list(broker: str, show_all: bool, as_json: bool) -> None:
    """List topics."""
    result = _admin(broker, lambda admin: admin.list_topics())

    shown = {}
    for name, tc in sorted(result.items()):
        system = name.startswith(("%", "RMQ_SYS_", "TRANS_CHECK_", "SCHEDULE_TOPIC"))
        if system and not show_all:
            continue
        shown[name] = tc
    if as_json:
        _echo_json(shown)
        return
    for name, tc in shown.items():
        click.echo(
            f"{name}\tqueues={tc['writeQueueNums']}/{tc['readQueueNums']}\tperm={tc['perm']}"
        )


@topic.command("route")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("name")
def topic_route(broker: str, output: str, name: str) -> None:
    """Where topic NAME lives: each broker group's queues, permission and leader address
    (the route clients get; mqadmin topicRoute)."""
    route = _admin(broker, lambda admin: admin.route(name))
    if route is None:
        raise click.ClickException(f"no topic {name!r} on this broker")
    addrs = {b["brokerName"]: b.get("brokerAddrs", {}) for b in route.get("brokerDatas", [])}
    rows = [
        {
            "group": q["brokerName"],
            "readQueues": q["readQueueNums"],
            "writeQueues": q["writeQueueNums"],
            "perm": q["perm"],
            "leader": addrs.get(q["brokerName"], {}).get("0", ""),
        }
        for q in sorted(route.get("queueDatas", []), key=lambda q: q["brokerName"])
    ]
    _emit(
        rows,
        output,
        [("group", "group", 16), ("readQueues", "read", -5), ("writeQueues", "write", -6)]
        + [("perm", "perm", -5), ("leader", "leader", 0)],
    )


@topic.command("stats")
@BROKER_OPTION
@_output_options
@click.argument("name")
def topic_stats(broker: str, name: str, as_json: bool) -> None:
    """Per-queue offsets and consumer-group progress of topic NAME."""
    result = _admin(broker, lambda admin: admin.topic_stats(name))

    doc = result
    if as_json:
        _echo_json(doc)
        return
    total = 0
    click.echo(f"{'queue':>5} {'min':>12} {'max':>12}")
    for q in doc["offsetTable"]:
        total += q["maxOffset"] - q["minOffset"]
        click.echo(f"{q['queueId']:>5} {q['minOffset']:>12} {q['maxOffset']:>12}")
    click.echo(f"messages stored: {total}")
    for group, offs in sorted(doc.get("consumerOffsets", {}).items()):
        lag = sum(q["maxOffset"] - offs.get(str(q["queueId"]), 0) for q in doc["offsetTable"])
        click.echo(f"group {group}: lag {lag}")


_PERMS = {"r": 4, "w": 2, "rw": 6}


@topic.command("update")
@BROKER_OPTION
@_output_options
@click.argument("name")
@click.option("--perm", type=click.Choice(sorted(_PERMS)), help="Readable, writable, or both.")
@click.option("--read-queues", type=click.IntRange(1, 1024), help="Read queue count.")
@click.option("--write-queues", type=click.IntRange(1, 1024), help="Write queue count.")
def topic_update(
    broker: str,
    name: str,
    perm: str | None,
    read_queues: int | None,
    write_queues: int | None,
    as_json: bool,
) -> None:
    """Change topic NAME's permission or queue counts (what is not given stays)."""
    if perm is None and read_queues is None and write_queues is None:
        raise click.UsageError("give --perm, --read-queues or --write-queues")
    tc = _admin(
        broker,
        lambda admin: admin.update_topic(
            name,
            perm=_PERMS[perm] if perm else None,
            read_queues=read_queues,
            write_queues=write_queues,
        ),
    )
    if as_json:
        _echo_json(tc)
        return
    click.echo(
        f"topic {name} updated: queues={tc['writeQueueNums']}/{tc['readQueueNums']} "
        f"perm={tc['perm']}"
    )


@topic.command("delete")
@BROKER_OPTION
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def topic_delete(broker: str, name: str, yes: bool) -> None:
    """Delete topic NAME: its config, consume queues and every group's committed offsets on it
    (refused for system topics and while live consumers subscribe to it).  Its messages stay in
    the commit log until retention deletes them.  In a cluster: in every broker group holding
    it."""
    if not yes:
        click.confirm(f"delete topic {name}, its queues and its consumer offsets?", abort=True)
    for group_name, addr in _leaders(broker, name) or [("", broker)]:
        _admin(addr, lambda admin: admin.delete_topic(name))
        click.echo(f"topic {name} deleted" + (f" in group {group_name}" if group_name else ""))


# --- send / consume ---------------------------------------------------------------------------


def _props(values: tuple[str, ...]) -> dict[str, str]:
    try:
        return _parse_sets(values)
    except click.BadParameter as exc:
        raise click.BadParameter(str(exc), param_hint="--property") from None


@main.command()
@BROKER_OPTION
@click.argument("topic_name", metavar="TOPIC")
@click.argument("body", required=False)
@click.option("--tags", "-t", help="Message tag.")
@click.option("--keys", "-k", help="Message keys.")
@click.option("--property", "-P", "properties", multiple=True, metavar="KEY=VALUE")
@click.option("--group", "-g", default="txmq-cli-producer", show_default=True)
@click.option("--count", "-n", default=1, show_default=True, help="Send BODY this many times.")
@click.option("--stdin", "from_stdin", is_flag=True, help="Send one message per line of stdin.")
@OUTPUT_OPTION
def send(
    broker: str,
    topic_name: str,
    body: str | None,
    tags: str | None,
    keys: str | None,
    properties: tuple[str, ...],
    group: str,
    count: int,
    from_stdin: bool,
    output: str,
) -> None:
    """Send BODY (or stdin lines) to TOPIC; prints one result line per message (with -o json,
    one JSON object per line)."""
    from txmq.client import AsyncProducer, Message

    if body is None and not from_stdin:
        raise click.UsageError("give a BODY or --stdin")
    props = _props(properties)
    config = _client_config()  # here: the click context is not visible inside the loop

    async def go() -> None:
        async with AsyncProducer(group, broker=broker, config=config) as producer:
            bodies = (
                (line.rstrip("\n") for line in sys.stdin)
                if from_stdin
                else (body for _ in range(count))
            )
            for b in bodies:
                r = await producer.send(
                    Message(topic_name, (b or "").encode(), tags=tags, keys=keys, properties=props)
                )
                status = r.status.name if hasattr(r.status, "name") else str(r.status)
                if output == "json":
                    doc: dict[str, Any] = {"status": status, "msgId": r.msg_id}
                    doc |= {"offsetMsgId": r.offset_msg_id, "queueId": r.queue_id}
                    doc["queueOffset"] = r.queue_offset
                    click.echo(json.dumps(doc))
                    continue
                click.echo(
                    f"{status} msgId={r.msg_id} offsetMsgId={r.offset_msg_id} "
                    f"queue={r.queue_id} offset={r.queue_offset}"
                )

    _run(go())


@main.command()
@BROKER_OPTION
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "--group",
    "-g",
    help="Consume as this consumer group: join it, take a share of its queues and commit its "
    "offsets. Without it, peek: read the topic's queues, join no group, commit nothing (the "
    "pulls name group txmq-cli-peek: with the ACL on, an account needs SUB on it and on TOPIC).",
)
@click.option(
    "--expression", "-e", default="*", show_default=True, help="Tag filter: * or 'a || b'."
)
@click.option(
    "--from",
    "consume_from",
    type=click.Choice(["first", "last"]),
    default="first",
    show_default=True,
    help="Where a new group (or a peek) starts: the oldest stored message or only new ones.",
)
@click.option("--count", "-n", type=int, help="Stop after this many messages.")
@click.option("--timeout", type=float, help="Stop after this many seconds without a message.")
@click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json"]),
    default="json",
    show_default=True,
    help="One JSON line per message (for scripts), or one short line each for people.",
)
def consume(
    broker: str,
    topic_name: str,
    group: str | None,
    expression: str,
    consume_from: str,
    count: int | None,
    timeout: float | None,
    output: str,
) -> None:
    """Print TOPIC's messages, one JSON line each (or, with -o table, one short line each): as
    consumer group GROUP (--group), or a peek that moves no group's offsets."""
    # The config is made here: the click context is not visible inside the loop.
    source = _Source(broker, _client_config(), topic_name, expression, consume_from)
    printer = _MessagePrinter(count, timeout, table=output == "table")
    if group is None:
        work = _peek(source, printer)
    else:
        work = _consume_as_group(source, group, printer)
    try:
        _run(work)
    except KeyboardInterrupt:
        pass


@dataclass(frozen=True)
class _Source:
    """What ``txmq consume`` reads: ``topic``'s messages matching ``expression`` on
    ``broker``, from the first or the last (``consume_from``)."""

    broker: str
    config: Any
    topic: str
    expression: str
    consume_from: str


class _MessagePrinter:
    """Prints messages as JSON lines and tells when ``count`` were printed, or when none came
    for ``timeout`` seconds (:meth:`idle`)."""

    def __init__(self, count: int | None, timeout: float | None, table: bool = False) -> None:
        self.table = table
        self.count = count
        self.timeout = timeout
        self.seen = 0
        self.last = time.monotonic()
        self.done = asyncio.Event()

    def __call__(self, msg: Any) -> None:
        doc = {
            "topic": msg.topic,
            "queueId": msg.queue_id,
            "queueOffset": msg.queue_offset,
            "msgId": msg.msg_id,
            "tags": msg.tags,
            "keys": msg.keys,
            "properties": msg.user_properties,
            "body": msg.body.decode("utf-8", "replace"),
        }
        if self.table:
            click.echo(
                f"{msg.topic} q{msg.queue_id}@{msg.queue_offset} {msg.msg_id} "
                f"tags={msg.tags or ''} {_body_preview(msg.body, 80)}"
            )
        else:
            click.echo(json.dumps(doc))
        self.seen += 1
        self.last = time.monotonic()
        if self.count is not None and self.seen >= self.count:
            self.done.set()

    def idle(self) -> bool:
        return self.timeout is not None and time.monotonic() - self.last > self.timeout


async def _consume_as_group(source: _Source, group: str, printer: _MessagePrinter) -> None:
    from txmq.client import AsyncPushConsumer

    consumer = AsyncPushConsumer(
        group, broker=source.broker, consume_from=source.consume_from, config=source.config
    )
    consumer.subscribe(source.topic, source.expression, printer)
    await consumer.start()
    try:
        while not printer.done.is_set() and not printer.idle():
            try:
                await asyncio.wait_for(printer.done.wait(), 0.5)
            except TimeoutError:
                pass
    finally:
        await consumer.shutdown()


#: The group name a peek's pulls carry: pulls without the commit flag store nothing for it, and
#: a pull consumer announces no group in its heartbeats.
PEEK_GROUP = "txmq-cli-peek"
#: How long a peek waits between rounds over the queues when none had a message.
PEEK_IDLE_PAUSE = 0.2


async def _peek(source: _Source, printer: _MessagePrinter) -> None:
    from txmq.client import AsyncPullConsumer, PullStatus

    topic = source.topic
    consumer = AsyncPullConsumer(PEEK_GROUP, broker=source.broker, config=source.config)
    await consumer.start()
    try:
        queues = await consumer.fetch_message_queues(topic)
        start = consumer.min_offset if source.consume_from == "first" else consumer.max_offset
        offsets = {q: await start(topic, q.queue_id, broker=q.broker) for q in queues}
        while not printer.done.is_set():
            found = False
            for q in queues:
                left = 32 if printer.count is None else printer.count - printer.seen
                res = await consumer.pull(
                    topic, q.queue_id, offsets[q], min(32, left), source.expression, broker=q.broker
                )
                if res.status is PullStatus.OFFSET_ILLEGAL:  # retention moved past it
                    offsets[q] = res.min_offset
                    continue
                offsets[q] = res.next_begin_offset
                for msg in res.messages:
                    found = True
                    printer(msg)
                    if printer.done.is_set():
                        return
            if not found:
                if printer.idle():
                    return
                await asyncio.sleep(PEEK_IDLE_PAUSE)
    finally:
        await consumer.shutdown()


# --- consumer groups, clients, broker settings ------------------------------------------------


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


@main.group()
def group() -> None:
    """Consumer groups: list them, show their progress, lag and settings, change their
    settings, delete one."""


@group.command("list")
@BROKER_OPTION
@OUTPUT_OPTION
def group_list(broker: str, output: str) -> None:
    """Every consumer group the broker knows, with its live consumers and total lag."""

    async def collect(admin: Any) -> list[dict[str, Any]]:
        from txmq.protocol.errors import BrokerResponseError

        rows = []
        for g in await admin.consumer_groups():
            stats = await admin.consume_stats(g)
            try:
                members = len((await admin.consumer_connections(g))["connectionSet"])
            except BrokerResponseError:  # 206: no consumer online
                members = 0
            topics = sorted({s["topic"] for s in stats})
            lag = sum(s["lag"] for s in stats)
            rows.append({"group": g, "consumers": members, "topics": topics, "lag": lag})
        return rows

    rows = _admin(broker, collect)
    if output == "table":
        rows = [{**r, "topics": ",".join(r["topics"])} for r in rows]
    _emit(
        rows,
        output,
        [("group", "group", 32), ("consumers", "consumers", -9), ("lag", "lag", -10)]
        + [("topics", "topics", 0)],
    )


@group.command("show")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("group_name", metavar="GROUP")
@click.option("--topic", "-t", help="Only this topic (default: every topic the group consumed).")
def group_show(broker: str, output: str, group_name: str, topic: str | None) -> None:
    """GROUP's progress per queue: the queue's end, the committed offset, the lag, and when
    the last consumed message was stored; then its live consumers and its settings."""

    async def collect(admin: Any) -> dict[str, Any]:
        from txmq.protocol.errors import BrokerResponseError, SubscriptionGroupNotExistError

        stats = await admin.consume_stats(group_name, topic)
        try:
            conns = await admin.consumer_connections(group_name)
        except BrokerResponseError:
            conns = {"connectionSet": []}
        try:
            config = await admin.group_config(group_name)
        except SubscriptionGroupNotExistError:
            config = None
        return {
            "group": group_name,
            "queues": stats,
            "consumers": conns["connectionSet"],
            "config": config,
        }

    doc = _admin(broker, collect)
    if output == "json":
        _echo_json(doc)
        return
    for q in doc["queues"]:
        ts = q["lastTimestamp"]
        q["last"] = (
            datetime.fromtimestamp(ts / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "-"
        )
    _emit(
        doc["queues"],
        "table",
        [("topic", "topic", 24), ("queueId", "queue", -5), ("brokerOffset", "end", -10)]
        + [("consumerOffset", "committed", -10), ("lag", "lag", -8), ("last", "last consumed", 0)],
    )
    click.echo(f"total lag: {sum(q['lag'] for q in doc['queues'])}")
    click.echo(f"consumers online: {len(doc['consumers'])}")
    for c in doc["consumers"]:
        click.echo(f"  {c['clientId']}  {c['clientAddr']}  {c['language']}")
    _echo_group_config(doc["config"])


def _echo_group_config(config: dict[str, Any] | None) -> None:
    """A group's settings as ``key: value`` lines, the ones the broker acts on first."""
    if config is None:
        click.echo("settings: none (the broker does not know the group)")
        return
    click.echo("settings:")
    acted_on = ("consumeMessageOrderly", "consumeEnable", "retryMaxTimes")
    for key in [*acted_on, *sorted(k for k in config if k not in acted_on)]:
        if key in config and key != "groupName":
            value = config[key]
            text = json.dumps(value) if isinstance(value, bool | dict | list) else value
            click.echo(f"  {key}: {text}")


@group.command("update")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("group_name", metavar="GROUP")
@click.option(
    "--orderly/--no-orderly",
    default=None,
    help="FIFO consumption for the group's RocketMQ 5 gRPC consumers (consumeMessageOrderly).",
)
@click.option(
    "--consume-enable/--consume-disable",
    default=None,
    help="Whether the group may consume: a disabled group's pulls and receives are refused.",
)
@click.option(
    "--retry-max-times",
    type=click.IntRange(min=-1),
    help="Redeliveries before a message goes to the group's dead-letter queue (retryMaxTimes).",
)
def group_update(
    broker: str,
    output: str,
    group_name: str,
    orderly: bool | None,
    consume_enable: bool | None,
    retry_max_times: int | None,
) -> None:
    """Change GROUP's settings (mqadmin updateSubGroup), keeping those not given; the broker
    keeps them across restarts.  Prints the settings now in force."""
    if orderly is None and consume_enable is None and retry_max_times is None:
        raise click.UsageError(
            "give at least one of --orderly/--no-orderly, --consume-enable/--consume-disable, "
            "--retry-max-times"
        )

    async def change(admin: Any) -> dict[str, Any]:
        await admin.update_group_config(
            group_name,
            orderly=orderly,
            consume_enable=consume_enable,
            retry_max_times=retry_max_times,
        )
        return dict(await admin.group_config(group_name))

    config = _admin(broker, change)
    if output == "json":
        _echo_json(config)
        return
    click.echo(f"consumer group {group_name} updated")
    _echo_group_config(config)


@group.command("delete")
@BROKER_OPTION
@click.argument("group_name", metavar="GROUP")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def group_delete(broker: str, group_name: str, yes: bool) -> None:
    """Forget GROUP's committed offsets and settings (refused while it has live consumers): a
    group of the same name starts afresh, from where its consume-from setting says.  In a
    cluster: in every broker group."""
    if not yes:
        click.confirm(f"delete the committed offsets of consumer group {group_name}?", abort=True)
    for broker_group, addr in _leaders(broker):
        _admin(addr, lambda admin: admin.delete_consumer_group(group_name))
        where = f" in broker group {broker_group}" if broker_group else ""
        click.echo(f"consumer group {group_name} deleted{where}")


@group.command("reset-offset")
@BROKER_OPTION
@_output_options
@click.argument("group_name", metavar="GROUP")
@click.option("--topic", "-t", required=True, help="The topic whose offsets move.")
@click.option("--to-time", help="The first message stored at or after: ms or an ISO time.")
@click.option("--to-offset", type=click.IntRange(min=0), help="This offset in every queue.")
@click.option("--to-earliest", is_flag=True, help="The oldest message still stored.")
@click.option("--to-latest", is_flag=True, help="The end of each queue (skip everything).")
@click.option(
    "--force/--no-force",
    default=True,
    show_default=True,
    help="With --no-force a queue only moves back (RocketMQ's isForce=false).",
)
def group_reset_offset(
    broker: str,
    group_name: str,
    topic: str,
    to_time: str | None,
    to_offset: int | None,
    to_earliest: bool,
    to_latest: bool,
    force: bool,
    as_json: bool,
) -> None:
    """Move GROUP's offsets on a topic; its live consumers continue from there at once.  In a
    cluster: in every broker group holding the topic."""
    chosen = [to_time is not None, to_offset is not None, to_earliest, to_latest]
    if sum(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --to-time, --to-offset, --to-earliest, --to-latest"
        )
    timestamp: Any = None
    if to_time is not None:
        timestamp = _parse_time(to_time)
    elif to_earliest:
        timestamp = 0
    elif to_latest:
        timestamp = 2**62  # after every message: each queue's end
    rows = []
    for broker_group, addr in _leaders(broker, topic) or [("", broker)]:
        offsets = _admin(
            addr,
            lambda admin: admin.reset_offset(
                group_name, topic, timestamp=timestamp, offset=to_offset, force=force
            ),
        )
        rows += [
            {"group": broker_group, "topic": topic, "queueId": q, "offset": o}
            for q, o in sorted(offsets.items())
        ]
    columns = [("topic", "topic", 24), ("queueId", "queue", -5), ("offset", "offset", -12)]
    if any(r["group"] for r in rows):
        columns = [("group", "broker group", 14), *columns]
    else:
        for r in rows:
            del r["group"]
    _emit(rows, "json" if as_json else "table", columns)


@main.command()
@BROKER_OPTION
@OUTPUT_OPTION
@click.option("--producer-group", "-p", multiple=True, help="A producer group (repeatable).")
@click.option("--consumer-group", "-c", multiple=True, help="A consumer group (repeatable).")
def connections(
    broker: str, output: str, producer_group: tuple[str, ...], consumer_group: tuple[str, ...]
) -> None:
    """The live client connections of producer and consumer groups (default: every group
    the broker knows of)."""

    async def collect(admin: Any) -> list[dict[str, Any]]:
        from txmq.protocol.errors import BrokerResponseError

        consumers = list(consumer_group)
        producers = list(producer_group)
        if not consumers and not producers:
            consumers = await admin.consumer_groups()
            info = await admin.runtime_info()
            producers = sorted(info.get("producerGroups", {}))
        rows = []
        for g in producers:
            for c in await admin.producer_connections(g):
                rows.append({"role": "producer", "group": g, **c})
        for g in consumers:
            try:
                conns = (await admin.consumer_connections(g))["connectionSet"]
            except BrokerResponseError:
                conns = []
            rows.extend({"role": "consumer", "group": g, **c} for c in conns)
        return rows

    _emit(
        _admin(broker, collect),
        output,
        [("role", "role", 8), ("group", "group", 28), ("clientId", "client id", 36)]
        + [("clientAddr", "address", 22), ("language", "language", 0)],
    )


@main.group()
def config() -> None:
    """The broker's settings as it runs (RocketMQ's key names)."""


@config.command("get")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("keys", nargs=-1)
def config_get(broker: str, output: str, keys: tuple[str, ...]) -> None:
    """Print the broker's settings (or only KEYS)."""
    settings = _admin(broker, lambda admin: admin.broker_config())
    unknown = [k for k in keys if k not in settings]
    if unknown:
        raise click.ClickException(f"no such setting: {', '.join(unknown)}")
    rows = [{"key": k, "value": v} for k, v in sorted(settings.items()) if not keys or k in keys]
    _emit(rows, output, [("key", "key", 36), ("value", "value", 0)])


@config.command("set")
@BROKER_OPTION
@OUTPUT_OPTION
@click.argument("settings", nargs=-1, required=True, metavar="KEY=VALUE...")
def config_set(broker: str, output: str, settings: tuple[str, ...]) -> None:
    """Change settings of the running broker (RocketMQ's updateBrokerConfig), kept across its
    restarts; prints the new values.

    \b
    Only these can change while the broker runs (any other key is refused):
      autoCreateTopicEnable     sends to unknown topics create them, or are refused
      maxReconsumeTimes         redeliveries before a message is dead-lettered
      rejectTransactionMessage  refuse new half messages
      transactionTimeOut        age (ms) of a half before its first check
      transactionCheckInterval  time (ms) between checks of a transaction
      transactionCheckMax       delivered checks before a transaction is parked
      fileReservedTime          hours a commit-log segment is kept
      diskMaxUsedSpaceRatio     disk use (%) past which retention acts on the fill
      diskFullPolicy            refuse_writes or delete_oldest
      diskRefuseWritesRatio     disk use (%) past which writes are refused

    In a cluster, set it on each replica of the group (each keeps its own settings).
    """
    changes: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="KEY=VALUE")
        changes[key.strip()] = value.strip()

    async def go(admin: Any) -> dict[str, str]:
        await admin.update_broker_config(changes)
        return dict(await admin.broker_config())

    now = _admin(broker, go)
    rows = [{"key": k, "value": now.get(k, "")} for k in sorted(changes)]
    _emit(rows, output, [("key", "key", 36), ("value", "value", 0)])


# --- transactions -----------------------------------------------------------------------------


@main.group()
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
@click.option("--limit", default=100, show_default=True)
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
    two_phase: bool,
    as_json: bool,
) -> None:
    """List transactions (default: pending and parked ones)."""
    result = _admin(
        broker,
        lambda admin: admin.list_transactions(
            group=group, topic=topic, state=state, limit=limit, two_phase=two_phase
        ),
    )

    rows = result
    if as_json:
        _echo_json(rows)
        return
    click.echo(
        f"{'transaction id':34} {'state':11} {'group':20} {'msgs':>4} {'checks':>6} {'age s':>8}"
    )
    for r in rows:
        click.echo(
            f"{r['transactionId']:34} {r['state']:11} {r['producerGroup']:20} "
            f"{len(r['halves']):>4} {r['checkTimes']:>6} {r.get('ageMs', 0) / 1000:>8.1f}"
        )


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
@click.argument("msg_id")
def txn_resume(broker: str, msg_id: str) -> None:
    """Put a parked transaction back under checking (RESUME_CHECK_HALF_MESSAGE)."""
    click.echo(_admin(broker, lambda admin: admin.resume_transaction(msg_id)))


def _force(broker: str, transaction_id: str, commit: bool, reason: str) -> None:
    click.echo(_admin(broker, lambda admin: admin.force_decide(transaction_id, commit, reason)))


def _force_command(name: str) -> Callable[[Callable[..., None]], click.Command]:
    """``txmq txn <name> TRANSACTION_ID [--reason R]``: an operator's forced decision."""

    def make(fn: Callable[..., None]) -> click.Command:
        fn = click.option("--reason", default="", help="Recorded with the decision.")(fn)
        return txn.command(name)(BROKER_OPTION(click.argument("transaction_id")(fn)))

    return make


@_force_command("commit")
def txn_commit(broker: str, transaction_id: str, reason: str) -> None:
    """Force-commit a pending or parked transaction, as an operator."""
    _force(broker, transaction_id, True, reason)


@_force_command("rollback")
def txn_rollback(broker: str, transaction_id: str, reason: str) -> None:
    """Force-roll back a pending or parked transaction, as an operator."""
    _force(broker, transaction_id, False, reason)


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


# --- web console ------------------------------------------------------------------------------


@main.group(invoke_without_command=True)
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
    import ssl

    from txmq.client.admin import split_address
    from txmq.client.console import Console
    from txmq.client.console.users import Users, UsersFileError

    try:
        host, port = split_address(listen)
    except ValueError:
        raise click.BadParameter(
            f"must be host:port, got {listen!r}", param_hint="--listen"
        ) from None
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
    users = None
    if users_file:
        try:
            users = Users.load(users_file)
        except UsersFileError as exc:
            raise click.ClickException(str(exc)) from None
        if not users.users:
            raise click.ClickException(f"{users_file} holds no user")
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
def console_add_user(users_file: str, name: str, role: str, password: str) -> None:
    """Add user NAME to the console's users FILE (created, mode 0600, when missing), or change
    its password and role.  The password is stored as a salted scrypt hash."""
    from txmq.client.console.users import UsersFileError, add_user

    if len(password) < 8:
        raise click.BadParameter("at least 8 characters", param_hint="--password")
    try:
        new = add_user(users_file, name, password, role)
    except UsersFileError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{'added' if new else 'updated'} {role} {name} in {users_file}")


# --- messages ---------------------------------------------------------------------------------


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


def _message_doc(m: Any) -> dict[str, Any]:
    from datetime import UTC, datetime

    stored = datetime.fromtimestamp(m.store_timestamp / 1000, tz=UTC)
    return {
        "msgId": m.msg_id,
        "offsetMsgId": m.offset_msg_id,
        "topic": m.topic,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "storeTimestamp": m.store_timestamp,
        "storeTime": stored.isoformat(timespec="milliseconds"),
        "keys": m.keys,
        "tags": m.tags,
        "properties": dict(m.properties),
        "bodySize": len(m.body),
        "body": _body_preview(m.body),
    }


def _echo_messages(docs: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        _echo_json(docs)
        return
    for i, d in enumerate(docs):
        if i:
            click.echo("")
        click.echo(f"msgId:        {d['msgId']}")
        click.echo(f"offsetMsgId:  {d['offsetMsgId']}")
        click.echo(f"topic:        {d['topic']}  queue {d['queueId']}  offset {d['queueOffset']}")
        click.echo(f"stored:       {d['storeTime']} ({d['storeTimestamp']})")
        click.echo(f"keys:         {d['keys'] or ''}")
        click.echo(f"tags:         {d['tags'] or ''}")
        props = " ".join(f"{k}={v}" for k, v in sorted(d["properties"].items()))
        click.echo(f"properties:   {props}")
        click.echo(f"body:         {d['body']} ({d['bodySize']} bytes)")


@main.group()
def message() -> None:
    """Find stored messages by id or by key (the broker's message index)."""


@message.command("show")
@BROKER_OPTION
@click.argument("msg_id")
@click.option(
    "--topic",
    "-t",
    help="The message's topic: looks a message id (UNIQ_KEY) up in the index; without it every "
    "topic is searched when the id is not an offsetMsgId.",
)
@_output_options
def message_show(broker: str, msg_id: str, topic: str | None, as_json: bool) -> None:
    """Show one message by offsetMsgId or message id."""
    from txmq.protocol.errors import QueryNotFoundError

    async def find(admin: Any) -> Any:
        try:
            return await admin.view_message(msg_id, topic=topic)
        except QueryNotFoundError:
            if topic is not None:
                raise
        for name in sorted(await admin.list_topics()):
            found = await admin.query_messages(name, msg_id, unique=True, max_num=1)
            if found.messages:
                return found.messages[0]
        raise QueryNotFoundError(f"no message with id {msg_id}")

    _echo_messages([_message_doc(_admin(broker, find))], as_json)


@message.command("find")
@BROKER_OPTION
@click.option("--topic", "-t", required=True)
@click.option("--key", "-k", required=True, help="A key (KEYS) or, with --unique-key, a msgId.")
@click.option("--unique-key", is_flag=True, help="Match the message id (UNIQ_KEY) only.")
@click.option("--begin", help="Stored at or after: ms since the epoch or an ISO time.")
@click.option("--end", help="Stored at or before: ms since the epoch or an ISO time.")
@click.option("--max", "max_num", default=32, show_default=True, help="At most (the broker: 64).")
@_output_options
def message_find(
    broker: str,
    topic: str,
    key: str,
    unique_key: bool,
    begin: str | None,
    end: str | None,
    max_num: int,
    as_json: bool,
) -> None:
    """Find messages of a topic by key, newest first."""
    b, e = _parse_time(begin), _parse_time(end)
    result = _admin(
        broker,
        lambda admin: admin.query_messages(
            topic, key, unique=unique_key, begin=b, end=e, max_num=max_num
        ),
    )
    docs = [_message_doc(m) for m in result.messages]
    if not docs and not as_json:
        raise click.ClickException(f"no message of topic {topic} with key {key}")
    _echo_messages(docs, as_json)


# --- dead letters -----------------------------------------------------------------------------


@main.group()
def dlq() -> None:
    """Dead-lettered messages of a consumer group (``%DLQ%<group>``): list, send back."""


def _dlq_doc(m: Any) -> dict[str, Any]:
    from txmq.client.dlq import original_topic

    stored = datetime.fromtimestamp(m.store_timestamp / 1000, tz=UTC)
    return {
        "msgId": m.msg_id,
        "offsetMsgId": m.offset_msg_id,
        "originalTopic": original_topic(m),
        "reconsumeTimes": m.reconsume_times,
        "storeTimestamp": m.store_timestamp,
        "storeTime": stored.isoformat(timespec="seconds"),
        "tags": m.tags,
        "keys": m.keys,
        "body": _body_preview(m.body, 60),
    }


@dlq.command("list")
@BROKER_OPTION
@_output_options
@click.argument("group_name", metavar="GROUP")
def dlq_list(broker: str, group_name: str, as_json: bool) -> None:
    """The messages GROUP dead-lettered, oldest first."""
    from txmq.client.dlq import read_dlq

    msgs = _run(read_dlq(group_name, broker, _client_config()))
    _emit(
        [_dlq_doc(m) for m in msgs],
        "json" if as_json else "table",
        [("msgId", "msg id", 32), ("originalTopic", "topic", 20), ("reconsumeTimes", "tries", -5)]
        + [("storeTime", "stored", 25), ("body", "body", 0)],
    )


@dlq.command("resend")
@BROKER_OPTION
@_output_options
@click.argument("group_name", metavar="GROUP")
@click.option("--id", "ids", multiple=True, help="A message id or offsetMsgId (repeatable).")
@click.option("--all", "resend_all", is_flag=True, help="Every dead-lettered message.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_resend(
    broker: str, group_name: str, ids: tuple[str, ...], resend_all: bool, yes: bool, as_json: bool
) -> None:
    """Send GROUP's dead-lettered messages back to their original topics, as new messages with
    the same body, tags, keys and user properties.  Each resend's message id is derived from
    the dead-lettered message's id: repeating a resend within the broker's duplicate window
    stores nothing twice.  The messages stay in the dead-letter queue."""
    from txmq.client.dlq import read_dlq, resend

    if bool(ids) == resend_all:
        raise click.UsageError("give --id (one or more) or --all")
    msgs = _run(read_dlq(group_name, broker, _client_config()))
    if ids:
        wanted = set(ids)
        msgs = [m for m in msgs if m.msg_id in wanted or m.offset_msg_id in wanted]
        found = {m.msg_id for m in msgs} | {m.offset_msg_id for m in msgs}
        missing = sorted(wanted - found)
        if missing:
            raise click.ClickException(f"not in %DLQ%{group_name}: {', '.join(missing)}")
    if not msgs:
        raise click.ClickException(f"no dead-lettered message of group {group_name}")
    if not yes:
        click.confirm(f"send {len(msgs)} message(s) back to their topics?", abort=True)
    try:
        done = _run(resend(msgs, broker, _client_config()))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    rows = [
        {"dlqMsgId": r.dlq_msg_id, "topic": r.topic, "msgId": r.msg_id, "status": r.status}
        for r in done
    ]
    _emit(
        rows,
        "json" if as_json else "table",
        [("dlqMsgId", "dead-lettered id", 32), ("topic", "sent to", 20)]
        + [("msgId", "new msg id", 32), ("status", "status", 0)],
    )


from .cli_acl import acl  # noqa: E402  (the commands use the helpers above)
from .cli_trace import trace  # noqa: E402  (the command uses the helpers above)

main.add_command(trace)
main.add_command(acl)

"""``txmq probe ready|health``: ask a broker's operations port, as container health checks do."""

from __future__ import annotations

import sys

import click

from .common import _env_option


@click.command()
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

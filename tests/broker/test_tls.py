"""TLS on the remoting port: enforcing, permissive, mutual TLS, certificate reload, bad
handshakes, and the tls.server.* configuration keys.  Real brokers on port 0, real sockets;
certificates made with the openssl command line in the test's temporary folder."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.brokers import started
from tests.support.certs import Certs, issue, make_certs
from tests.support.ports import free_port
from tests.support.raw import RawClient
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig, ConfigError, load_config
from txmq.broker.server import BrokerController
from txmq.protocol.aio import open_connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import ConnectionClosedError


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "certs")


@pytest.fixture
async def start_broker(
    make_broker_config: Callable[..., BrokerConfig],
) -> AsyncIterator[Callable[..., Any]]:
    started: list[BrokerController] = []

    async def start(**overrides: Any) -> BrokerController:
        controller = BrokerController(make_broker_config(**overrides))
        await controller.start()
        started.append(controller)
        return controller

    yield start
    for c in started:
        await c.shutdown()


async def connect(broker: BrokerController, ctx: ssl.SSLContext | None = None) -> RawClient:
    host, _, port = broker.address.rpartition(":")
    return RawClient(await open_connection(host, int(port), ssl=ctx, timeout=10.0))


async def ping(client: RawClient) -> None:
    resp = await client.call(RequestCode.GET_BROKER_RUNTIME_INFO, timeout=10.0)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def assert_refused(broker: BrokerController, ctx: ssl.SSLContext | None) -> None:
    """The connection (or its first request) fails: the broker closed it."""
    with pytest.raises(ConnectionClosedError):
        client = await connect(broker, ctx)
        try:
            await client.call(RequestCode.GET_BROKER_RUNTIME_INFO, timeout=10.0)
        finally:
            await client.close()


async def assert_closed_by_broker(reader: asyncio.StreamReader) -> None:
    """The broker ends the connection (EOF or reset) within a bounded time."""
    try:
        rest = await asyncio.wait_for(reader.read(), 15.0)
    except ConnectionResetError:
        return
    assert rest == b""


# -- enforcing --------------------------------------------------------------------------------


async def test_enforcing_refuses_plain_clients_and_keeps_serving_tls(
    certs: Certs, start_broker: Callable[..., Any]
) -> None:
    broker = await start_broker(**certs.broker_settings("enforcing"))
    before = await connect(broker, certs.client_context())
    await ping(before)
    await assert_refused(broker, None)
    await ping(before)  # an open TLS connection is untouched
    after = await connect(broker, certs.client_context())
    await ping(after)
    await before.close()
    await after.close()
    assert broker.metrics.protocol_errors._value.get() >= 1


async def test_a_client_that_trusts_another_ca_is_refused(
    certs: Certs, start_broker: Callable[..., Any]
) -> None:
    broker = await start_broker(**certs.broker_settings("enforcing"))
    with pytest.raises(ConnectionClosedError, match="TLS handshake .* failed"):
        await connect(broker, certs.client_context(ca=certs.wrong_ca))
    ok = await connect(broker, certs.client_context())
    await ping(ok)
    await ok.close()


async def test_mutual_tls_refuses_a_client_without_a_certificate(
    certs: Certs, start_broker: Callable[..., Any]
) -> None:
    broker = await start_broker(**certs.broker_settings("enforcing", client_auth="require"))
    await assert_refused(broker, certs.client_context())
    mutual = await connect(broker, certs.client_context(mutual=True))
    await ping(mutual)
    await mutual.close()


async def test_mutual_tls_refuses_a_client_certificate_of_another_ca(
    certs: Certs, start_broker: Callable[..., Any], tmp_path: Path
) -> None:
    broker = await start_broker(**certs.broker_settings("enforcing", client_auth="optional"))
    # optional: no certificate is fine ...
    anonymous = await connect(broker, certs.client_context())
    await ping(anonymous)
    await anonymous.close()
    # ... a certificate the broker's CA did not sign is not
    rogue_ca = (tmp_path / "rogue-ca.pem", tmp_path / "rogue-ca.key")
    shutil.copy(certs.wrong_ca, rogue_ca[0])
    shutil.copy(certs.folder / "wrong-ca.key", rogue_ca[1])
    cert, key = issue(tmp_path, "rogue-client", rogue_ca, server=False)
    ctx = certs.client_context()
    ctx.load_cert_chain(str(cert), str(key))
    await assert_refused(broker, ctx)


# -- permissive -------------------------------------------------------------------------------


async def test_permissive_serves_plain_and_tls_clients_on_one_port(
    certs: Certs, start_broker: Callable[..., Any]
) -> None:
    broker = await start_broker(**certs.broker_settings("permissive"))
    plain = await connect(broker, None)
    secure = await connect(broker, certs.client_context())
    await ping(plain)
    await ping(secure)
    assert secure.conn._transport is not None
    assert secure.conn._transport.get_extra_info("ssl_object") is not None
    assert plain.conn._transport is not None
    assert plain.conn._transport.get_extra_info("ssl_object") is None
    await plain.close()
    await secure.close()


def test_permissive_works_on_the_standard_event_loop_too(
    certs: Certs, make_broker_config: Callable[..., BrokerConfig]
) -> None:
    async def scenario() -> None:
        async with started(make_broker_config(**certs.broker_settings("permissive"))) as broker:
            for ctx in (None, certs.client_context()):
                client = await connect(broker, ctx)
                await ping(client)
                await client.close()

    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        runner.run(scenario())


# -- bad input --------------------------------------------------------------------------------


def client_hello() -> bytes:
    """The first flight of a real TLS client (its ClientHello)."""
    ctx = ssl.create_default_context()
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


@pytest.mark.parametrize("mode", ["enforcing", "permissive"])
async def test_garbage_and_truncated_handshakes_close_only_that_connection(
    certs: Certs, start_broker: Callable[..., Any], mode: str
) -> None:
    broker = await start_broker(**certs.broker_settings(mode), tls_handshake_timeout=1.0)
    host, _, port = broker.address.rpartition(":")
    survivor = await connect(broker, certs.client_context())
    hello = client_hello()
    assert hello[0] == 0x16
    payloads = [
        b"\x16\x03\x01\x00\x20" + os.urandom(32),  # a handshake record of random bytes
        b"\x16" + os.urandom(200),
        hello[: len(hello) // 2],  # truncated, then EOF
    ]
    if mode == "enforcing":
        payloads.append(b"GET / HTTP/1.0\r\n\r\n")  # plain bytes on a TLS-only port
    for payload in payloads:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(payload)
        await writer.drain()
        if payload is payloads[2]:
            writer.write_eof()
        await assert_closed_by_broker(reader)
        writer.close()
    # truncated and then silent: the handshake timeout closes it
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(hello[:10])
    await assert_closed_by_broker(reader)
    writer.close()
    await ping(survivor)
    fresh = await connect(broker, certs.client_context())
    await ping(fresh)
    await fresh.close()
    await survivor.close()


async def test_a_client_that_never_speaks_does_not_block_others(
    certs: Certs, start_broker: Callable[..., Any]
) -> None:
    broker = await start_broker(**certs.broker_settings("permissive"))
    host, _, port = broker.address.rpartition(":")
    _, silent = await asyncio.open_connection(host, int(port))
    client = await connect(broker, certs.client_context())
    await ping(client)
    plain = await connect(broker, None)
    await ping(plain)
    silent.close()
    await client.close()
    await plain.close()


# -- certificate rotation ---------------------------------------------------------------------


def live_certificate(certs: Certs, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the broker's certificate and key in a folder of their own (the files an
    operator replaces), and enforcing settings that point at them."""
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(certs.server_cert, live / "broker.pem")
    shutil.copy(certs.server_key, live / "broker.key")
    settings = certs.broker_settings("enforcing")
    settings.update(
        tls_server_cert_path=str(live / "broker.pem"), tls_server_key_path=str(live / "broker.key")
    )
    return live, settings


async def test_a_rotated_certificate_is_used_for_new_connections(
    certs: Certs, start_broker: Callable[..., Any], tmp_path: Path
) -> None:
    live, settings = live_certificate(certs, tmp_path)
    broker = await start_broker(**settings)
    old = await connect(broker, certs.client_context())
    await ping(old)

    # the operator rotates to a certificate of another CA (written aside, then moved in place)
    new_ca = (tmp_path / "new-ca.pem", tmp_path / "new-ca.key")
    shutil.copy(certs.wrong_ca, new_ca[0])
    shutil.copy(certs.folder / "wrong-ca.key", new_ca[1])
    cert, key = issue(tmp_path, "broker-next", new_ca, server=True)
    os.replace(key, live / "broker.key")
    os.replace(cert, live / "broker.pem")
    assert broker.tls is not None
    await wait_until(lambda: broker.tls is not None and broker.tls.reloads >= 1, 30.0, "reload")

    rotated = await connect(broker, certs.client_context(ca=certs.wrong_ca))
    await ping(rotated)
    await assert_refused(broker, certs.client_context())  # the old CA no longer fits
    await ping(old)  # open connections keep their session
    await rotated.close()
    await old.close()


async def test_a_broken_certificate_file_keeps_the_one_in_force(
    certs: Certs, start_broker: Callable[..., Any], tmp_path: Path
) -> None:
    live, settings = live_certificate(certs, tmp_path)
    broker = await start_broker(**settings)
    assert broker.tls is not None
    tls = broker.tls
    before, stamps = tls.context, tls._stamps
    (live / "broker.pem").write_text("not a certificate, and of another size\n")
    # the poll saw the change and refused the file: the context in force stays
    await wait_until(lambda: tls._stamps != stamps, 30.0, "the poll to see the new file")
    assert tls.context is before
    assert tls.reloads == 0
    client = await connect(broker, certs.client_context())
    await ping(client)
    await client.close()


# -- configuration ----------------------------------------------------------------------------


def test_tls_keys_have_rocketmqs_names_in_toml_set_and_env(certs: Certs, tmp_path: Path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text(
        "[security]\n"
        'tls.server.mode = "permissive"\n'
        f'"tls.server.certPath" = "{certs.server_cert}"\n'
        "[tls.server]\n"
        f'keyPath = "{certs.server_key}"\n'
        f'trustCertPath = "{certs.ca}"\n'
        'need.client.auth = "optional"\n'
    )
    cfg = load_config(toml, env={})
    assert cfg.tls_server_mode == "permissive"
    assert cfg.tls_server_cert_path == str(certs.server_cert)
    assert cfg.tls_server_key_path == str(certs.server_key)
    assert cfg.tls_server_need_client_auth == "optional"
    assert cfg.as_rocketmq_dict()["tls.server.need.client.auth"] == "optional"

    cfg = load_config(toml, env={"TXMQ_TLS_SERVER_MODE": "enforcing"})
    assert cfg.tls_server_mode == "enforcing"
    cfg = load_config(
        toml,
        env={"TXMQ_TLS_SERVER_MODE": "enforcing"},
        overrides={"tls.server.mode": "disabled", "tls.server.need.client.auth": "require"},
    )
    assert cfg.tls_server_mode == "disabled"
    assert cfg.tls_server_need_client_auth == "require"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tls.server.mode": "on"}, "tls.server.mode must be one of"),
        ({"tls.server.mode": "enforcing"}, "needs tls.server.certPath"),
        (
            {
                "tls.server.mode": "enforcing",
                "tls.server.certPath": "a.pem",
                "tls.server.keyPath": "a.key",
                "tls.server.need.client.auth": "require",
            },
            "needs tls.server.trustCertPath",
        ),
        ({"tls.server.need.client.auth": "maybe"}, "need.client.auth must be one of"),
        ({"tls.server.nope": "1"}, "unknown configuration key 'tls.server.nope'"),
    ],
)
def test_bad_tls_settings_are_refused_precisely(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, env={}, overrides=overrides)


async def test_a_missing_certificate_file_stops_the_start_with_its_name(
    make_broker_config: Callable[..., BrokerConfig], tmp_path: Path, certs: Certs
) -> None:
    missing = tmp_path / "nope.pem"
    cfg = make_broker_config(**certs.broker_settings("enforcing"))
    cfg = cfg.replace(tls_server_cert_path=str(missing))
    broker = BrokerController(cfg)
    with pytest.raises(ConfigError, match="nope.pem"):
        await broker.start()
    broker._meta_executor.shutdown()


# -- the metrics endpoint ---------------------------------------------------------------------


@pytest.mark.parametrize("client_auth", ["none", "require"])
async def test_with_tls_enforced_the_metrics_endpoint_is_https(
    certs: Certs, start_broker: Callable[..., Any], client_auth: str
) -> None:
    import urllib.error
    import urllib.request

    port = free_port()
    await start_broker(metrics_port=port, **certs.broker_settings("enforcing", client_auth))
    url = f"https://127.0.0.1:{port}/metrics"
    mutual = client_auth == "require"

    def fetch(url: str, ctx: ssl.SSLContext | None) -> str:
        with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
            return str(r.read().decode())

    loop = asyncio.get_running_loop()
    text = await loop.run_in_executor(None, fetch, url, certs.client_context(mutual=mutual))
    assert "txmq_connections" in text
    # Plain HTTP is not served, nor HTTPS to a client that does not trust the broker's CA (or,
    # under mutual TLS, one without a certificate).
    for bad_url, ctx in [
        (f"http://127.0.0.1:{port}/metrics", None),
        (url, certs.client_context(ca=certs.wrong_ca, mutual=mutual)),
        *([(url, certs.client_context())] if mutual else []),
    ]:
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError, OSError)):
            await loop.run_in_executor(None, fetch, bad_url, ctx)

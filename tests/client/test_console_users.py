"""The console's own accounts, roles, HTTPS and charts, without a browser: a real console on a
real port in front of a real broker, asked with http.client (tests/integration/test_console.py
does the same in chromium)."""

from __future__ import annotations

import http.client
import os
import ssl
import stat
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from tests.client.test_console_http import Http
from tests.conftest import BrokerThread
from tests.support.certs import make_certs
from txmq.cli import main
from txmq.client.console import Console, charts
from txmq.client.console.users import (
    Users,
    UsersFileError,
    add_user,
    check_password,
    hash_password,
)

OPERATOR = ("olga", "operator-pw-1")
VIEWER = ("victor", "viewer-pw-1")


def test_a_password_hash_is_salted_and_checks_only_its_password() -> None:
    a, b = hash_password("correct horse"), hash_password("correct horse")
    assert a != b and a.startswith("scrypt$16384$8$1$")  # a salt each
    assert check_password("correct horse", a) and check_password("correct horse", b)
    assert not check_password("correct hors", a)
    assert not check_password("x", "scrypt$bad") and not check_password("x", "md5$1$2$3$4$5")


def test_add_user_writes_a_private_file_and_replaces_an_entry(tmp_path: Path) -> None:
    f = tmp_path / "users.yml"
    assert add_user(f, "olga", "pw-one-111", "viewer")
    assert not add_user(f, "olga", "pw-two-222", "operator")
    assert add_user(f, "victor", "pw-three-333", "viewer")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    users = Users.load(f)
    assert sorted(users.users) == ["olga", "victor"]
    assert users.authenticate("olga", "pw-two-222") is not None
    assert users.authenticate("olga", "pw-one-111") is None
    assert users.users["olga"].role == "operator"
    assert "pw-two-222" not in f.read_text()
    assert users.authenticate("nobody", "pw-two-222") is None


def test_a_users_file_with_a_clear_text_password_or_an_unknown_role_is_refused(
    tmp_path: Path,
) -> None:
    f = tmp_path / "users.yml"
    f.write_text("users:\n  - {name: a, role: viewer, password: hunter2}\n")
    with pytest.raises(UsersFileError, match="hash made by"):
        Users.load(f)
    f.write_text(f"users:\n  - {{name: a, role: root, password: '{hash_password('x')}'}}\n")
    with pytest.raises(UsersFileError, match="role must be one of"):
        Users.load(f)


def test_the_add_user_command_takes_the_password_from_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "users.yml"
    result = CliRunner().invoke(
        main,
        ["console", "add-user", str(f), "olga", "--role", "operator"],
        env={"TXMQ_CONSOLE_PASSWORD": "operator-pw-1"},
    )
    assert result.exit_code == 0, result.output
    assert "added operator olga" in result.output
    assert Users.load(f).authenticate(*OPERATOR) is not None
    short = CliRunner().invoke(
        main, ["console", "add-user", str(f), "x"], env={"TXMQ_CONSOLE_PASSWORD": "short"}
    )
    assert short.exit_code != 0 and "at least 8" in short.output


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    f = tmp_path / "users.yml"
    add_user(f, *OPERATOR, "operator")
    add_user(f, *VIEWER, "viewer")
    return f


@pytest.fixture
def users_console(broker_thread: object, users_file: Path) -> Iterator[Console]:
    bt: BrokerThread = broker_thread.test_thread  # type: ignore[attr-defined]
    c = Console(bt.address, port=0, users=Users.load(users_file), sample_interval=None)
    c.start()
    try:
        yield c
    finally:
        c.close()


def sign_in(client: Http, name: str, password: str) -> int:
    _, _, page = client.request("GET", "/login")
    status, _, _ = client.request(
        "POST",
        "/login",
        {"csrf": client.csrf(page), "next": "/", "username": name, "password": password},
    )
    return status


def test_with_a_users_file_every_page_needs_a_sign_in_and_a_wrong_password_is_refused(
    users_console: Console,
) -> None:
    client = Http(users_console.url)
    for path in ("/", "/topics", "/groups", "/transactions", "/messages", "/search", "/trace"):
        status, headers, _ = client.request("GET", path)
        assert status == 303 and headers["location"].startswith("/login?next="), path
    assert sign_in(client, VIEWER[0], "wrong") == 401
    assert sign_in(client, "nobody", VIEWER[1]) == 401
    assert client.request("GET", "/")[0] == 303
    assert sign_in(client, *VIEWER) == 303
    status, _, body = client.request("GET", "/")
    assert status == 200 and 'id="user">victor<' in body and 'id="role">viewer<' in body


def test_a_viewer_is_refused_every_action_and_an_operator_is_not(users_console: Console) -> None:
    viewer = Http(users_console.url)
    sign_in(viewer, *VIEWER)
    _, _, page = viewer.request("GET", "/")
    csrf = viewer.csrf(page)
    for method, path, form in (
        ("GET", "/transactions/" + "0" * 32 + "/confirm?action=commit", None),
        ("POST", "/transactions/" + "0" * 32 + "/commit", {"csrf": csrf}),
        ("POST", "/transactions/" + "0" * 32 + "/resume", {"csrf": csrf}),
        ("GET", "/dlq/confirm?group=g", None),
        ("POST", "/dlq/resend", {"csrf": csrf, "group": "g"}),
        ("GET", "/groups/g/reset", None),
        ("POST", "/groups/g/reset", {"csrf": csrf, "topic": "t", "to": "earliest"}),
    ):
        status, _, body = viewer.request(method, path, form)
        assert status == 403 and "only an operator may" in body, (path, status, body[-300:])
    operator = Http(users_console.url)
    sign_in(operator, *OPERATOR)
    # past the role check: the broker is asked (and knows no such thing)
    status, _, body = operator.request("GET", "/groups/g/reset")
    assert status == 404 and "no consumer group" in body
    status, _, body = operator.request(
        "GET", "/transactions/" + "0" * 32 + "/confirm?action=commit"
    )
    assert status == 404 and "No transaction" in body


class Https(Http):
    def __init__(self, url: str, context: ssl.SSLContext) -> None:
        super().__init__(url)
        self.context = context
        self.port = urlsplit(url).port or 443

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPSConnection(self.host, self.port, timeout=30, context=self.context)


def test_the_console_serves_https_with_secure_cookies(
    broker_thread: object, users_file: Path, tmp_path: Path
) -> None:
    bt: BrokerThread = broker_thread.test_thread  # type: ignore[attr-defined]
    certs = make_certs(tmp_path / "certs")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    c = Console(
        bt.address, port=0, users=Users.load(users_file), https=server_ctx, sample_interval=None
    )
    c.start()
    try:
        assert c.url.startswith("https://127.0.0.1:")
        client = Https(c.url, certs.client_context())
        status, headers, _ = client.request("GET", "/login")
        assert status == 200 and "; Secure" in headers["set-cookie"]
        assert headers["strict-transport-security"] == "max-age=31536000"
        assert sign_in(client, *OPERATOR) == 303
        status, _, body = client.request("GET", "/topics")
        assert status == 200 and "olga" in body
        # plain HTTP to it gets nothing, and the console keeps serving
        plain = http.client.HTTPConnection("127.0.0.1", client.port, timeout=10)
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.request("GET", "/")
            plain.getresponse().read()
        plain.close()
        assert client.request("GET", "/groups")[0] == 200
    finally:
        c.close()


def test_a_chart_draws_a_point_per_sample_and_rates_come_from_the_growth() -> None:
    s = charts.Sampler(lambda: charts.Figures(0, 0, 0, {}, 0))
    s.add(charts.Figures(100.0, 10, 0, {"billing": 5}, 1))
    s.add(charts.Figures(110.0, 60, 20, {"billing": 3}, 0))
    s.add(charts.Figures(120.0, 60, 40, {"billing": 0}, 0))
    assert s.points(charts.SEND_RATE) == [(110.0, 5.0), (120.0, 0.0)]
    assert s.points(charts.CONSUME_RATE) == [(110.0, 2.0), (120.0, 2.0)]
    assert [v for _, v in s.points(charts.lag_series("billing"))] == [5, 3, 0]
    out = charts.svg(s.points(charts.lag_series("billing")), title="lag <b>", css_id="c")
    assert out.startswith('<svg id="c"') and out.count('class="point"') == 3
    assert "<polyline" in out and "lag &lt;b&gt;" in out and "<b>" not in out
    assert "no samples yet" in charts.svg([], title="empty")

"""The web console's HTTP side without a browser: a real console on a real port in front of a
real broker, asked with http.client.  Headers and cookies, sign-in redirects, missing things,
a broker that does not answer, and the session table (with a fake clock)."""

from __future__ import annotations

import http.client
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest

from tests.conftest import BrokerThread
from tests.support.acl_files import account, acl_file, write_acl
from tests.support.waiting import wait_until_sync
from txmq.client import Message, Producer
from txmq.client.console import Console, Sessions

ACL_FILE = acl_file(
    account("operator", "secret-op-123", admin=True),
    account("viewer", "secret-view-123", defaultTopicPerm="SUB"),
)


class Http:
    """One HTTP client keeping the console's cookie, as a browser would."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "", parts.port or 80
        self.cookie = ""

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        conn = self.connection()
        try:
            headers = {"Cookie": self.cookie} if self.cookie else {}
            body = None
            if form is not None:
                body = urlencode(form)
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8")
            got = {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()
        if "set-cookie" in got:
            self.cookie = got["set-cookie"].split(";", 1)[0]
        return resp.status, got, text

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=30)

    def csrf(self, page: str) -> str:
        m = re.search(r'name="csrf" value="([^"]+)"', page)
        assert m, "no CSRF token in the page"
        return m.group(1)


@pytest.fixture
def console(broker_thread: object) -> Iterator[Console]:
    bt: BrokerThread = broker_thread.test_thread  # type: ignore[attr-defined]
    c = Console(bt.address, port=0)
    c.start()
    try:
        yield c
    finally:
        c.close()


def test_every_answer_has_the_security_headers_and_an_http_only_cookie(console: Console) -> None:
    client = Http(console.url)
    for path in ("/", "/topics", "/groups", "/transactions", "/messages"):
        status, headers, body = client.request("GET", path)
        assert status == 200, (path, body[:300])
        assert "script-src" not in headers["content-security-policy"]  # default-src 'none'
        assert headers["content-security-policy"].startswith("default-src 'none'")
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["cache-control"] == "no-store"
        assert "<script" not in body and "http://" not in body and "https://" not in body
    status, headers, _ = Http(console.url).request("GET", "/")
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie


def test_a_console_on_loopback_answers_only_requests_for_a_loopback_name(
    console: Console,
) -> None:
    port = urlsplit(console.url).port
    for host, served in (
        (f"127.0.0.1:{port}", True),
        (f"localhost:{port}", True),
        (f"[::1]:{port}", True),
        (f"attacker.example:{port}", False),  # DNS rebinding
        ("attacker.example", False),
    ):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.putrequest("GET", "/", skip_host=True)
            conn.putheader("Host", host)
            conn.endheaders()
            status = conn.getresponse().status
        finally:
            conn.close()
        assert (status == 200) is served and (status == 421) is not served, (host, status)


def test_missing_things_are_404_and_bad_input_is_said_plainly(console: Console) -> None:
    client = Http(console.url)
    assert client.request("GET", "/nowhere")[0] == 404
    status, _, body = client.request("GET", "/topics/no-such-topic")
    assert status == 404 and "no topic" in body
    status, _, body = client.request("GET", "/groups/no-such-group")
    assert status == 404 and "no consumer group" in body
    status, _, body = client.request("GET", "/transactions/" + "0" * 32)
    assert status == 404 and "No transaction" in body
    status, _, body = client.request("GET", "/messages?id=%3Cscript%3E")
    assert status == 400 and "&lt;script&gt;" in body and "<script>" not in body


def test_a_message_is_found_by_the_id_its_producer_got_with_or_without_the_topic(
    console: Console,
) -> None:
    with Producer("console-lookup", broker=console.broker) as p:
        sent = p.send(Message("lookups", b"find me", keys="k-1"))
        p.send(Message("other-topic", b"not me"))
    client = Http(console.url)
    # found by id once the broker's index has it (it follows the commit log, off the send path)
    wait_until_sync(
        lambda: client.request("GET", f"/messages?id={sent.msg_id}")[0] == 200,
        30,
        "the message found by its id",
    )
    for query in (
        f"id={sent.msg_id}",
        f"id={sent.msg_id}&topic=lookups",
        f"id={sent.offset_msg_id}",
    ):
        status, _, body = client.request("GET", "/messages?" + query)
        assert status == 200 and "find me" in body, (query, status, body[-400:])
    missing = "0123456789ABCDEF0123456789ABCDEF"
    status, _, body = client.request("GET", f"/messages?id={missing}")
    assert status == 404 and "no message" in body and "topics" in body, body[-400:]


def test_a_post_without_the_sessions_csrf_token_is_refused(console: Console) -> None:
    client = Http(console.url)
    client.request("GET", "/")  # a session
    status, _, body = client.request("POST", "/transactions/ABC/commit", {"csrf": "forged"})
    assert status == 403 and "CSRF" in body


def test_a_broker_that_does_not_answer_is_said_so() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    c = Console(address, port=0, timeout=2.0)
    c.start()
    try:
        status, _, body = Http(c.url).request("GET", "/")
    finally:
        c.close()
    assert status == 502 and "does not answer" in body and address in body


@pytest.fixture
def acl_console(
    broker_thread_factory: Callable[..., BrokerThread], tmp_path: Path
) -> Iterator[Console]:
    acl = write_acl(tmp_path, ACL_FILE)
    bt = broker_thread_factory(acl_enable=True, plain_acl_file=str(acl))
    c = Console(bt.address, access_key="operator", secret_key="secret-op-123", port=0)
    c.start()
    try:
        yield c
    finally:
        c.close()


def test_sign_in_renews_the_session_and_goes_back_only_within_the_console(
    acl_console: Console,
) -> None:
    client = Http(acl_console.url)
    status, headers, _ = client.request("GET", "/groups")
    assert status == 303 and headers["location"] == "/login?next=%2Fgroups"
    _, _, page = client.request("GET", headers["location"])
    before = client.cookie
    status, headers, _ = client.request(
        "POST",
        "/login",
        {
            "csrf": client.csrf(page),
            "next": "//elsewhere.example/",
            "access_key": "viewer",
            "secret_key": "secret-view-123",
        },
    )
    assert status == 303 and headers["location"] == "/"
    assert client.cookie != before, "the session token was not renewed at sign-in"
    status, _, body = client.request("GET", "/groups")
    assert status == 200 and "viewer" in body and "secret-view-123" not in body
    # the token from before the sign-in is worth nothing now
    old = Http(acl_console.url)
    old.cookie = before
    assert old.request("GET", "/groups")[0] == 303


def test_sessions_expire_when_idle_and_the_table_is_bounded() -> None:
    now = [1000.0]
    sessions = Sessions(idle=60.0, limit=3, clock=lambda: now[0])
    a = sessions.new("ak", "sk")
    now[0] += 59
    assert sessions.get(a.token) is a  # a request keeps it alive
    now[0] += 59
    assert sessions.get(a.token) is a
    now[0] += 61
    assert sessions.get(a.token) is None
    made = [sessions.new() for _ in range(5)]
    assert sessions.get(made[0].token) is None and sessions.get(made[1].token) is None
    assert all(sessions.get(s.token) is s for s in made[2:])
    assert sessions.get("") is None and sessions.get(None) is None

"""The console's HTTP side: the threaded server and its request handler, the browser
sessions (a cookie, a CSRF token, the signed-in account), and what a page handler gets and
gives back (:class:`Request`, :class:`Response`, :class:`ConsoleError`)."""

from __future__ import annotations

import secrets
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from ..logs import get_logger

if TYPE_CHECKING:
    from .server import Console

# The console server's logger: an application's settings for it cover these events too.
log = get_logger("txmq.client.console.server")

COOKIE = "txmq_console"
#: Seconds a session lives without a request.
SESSION_IDLE = 1800.0
#: Sessions kept at most (the oldest go first): a flood of cookie-less requests cannot grow
#: the table without bound.
MAX_SESSIONS = 10_000
#: Largest form body read.
MAX_FORM = 64 * 1024
#: Security headers of every answer: no script at all, nothing from elsewhere.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Session:
    token: str
    csrf: str
    last_seen: float
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    admin: bool = False
    #: who signed in (a console user, or the broker account) and the console role they have
    user: str | None = None
    role: str | None = None


class Sessions:
    """Browser sessions in memory: a random token in an HttpOnly cookie, a CSRF token, and
    after sign-in the account (its secret stays here, never in a page or a cookie)."""

    def __init__(
        self,
        idle: float = SESSION_IDLE,
        limit: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle = idle
        self.limit = limit
        self.clock = clock
        self._by_token: dict[str, Session] = {}
        self._lock = threading.Lock()

    def get(self, token: str | None) -> Session | None:
        if not token:
            return None
        now = self.clock()
        with self._lock:
            s = self._by_token.get(token)
            if s is None:
                return None
            if now - s.last_seen > self.idle:
                del self._by_token[token]
                return None
            s.last_seen = now
            return s

    def new(self, access_key: str | None = None, secret_key: str | None = None) -> Session:
        s = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), self.clock())
        s.access_key, s.secret_key = access_key, secret_key
        with self._lock:
            now = self.clock()
            for token in [t for t, x in self._by_token.items() if now - x.last_seen > self.idle]:
                del self._by_token[token]
            while len(self._by_token) >= self.limit:
                del self._by_token[next(iter(self._by_token))]
            self._by_token[s.token] = s
        return s

    def drop(self, token: str) -> None:
        with self._lock:
            self._by_token.pop(token, None)


@dataclass
class Request:
    method: str
    parts: list[str]
    query: dict[str, str]
    form: dict[str, str]
    session: Session
    target: str


@dataclass
class Response:
    status: int
    body: str = ""
    location: str | None = None
    session: Session | None = None  # a new session to set the cookie of


class ConsoleError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


class Server(ThreadingHTTPServer):
    daemon_threads = True
    console: Console

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            # the TLS handshake, in this request's thread (a slow or silent client holds up
            # no other); a failed one (plain HTTP to an HTTPS console, say) ends here
            request.settimeout(self.console.timeout * 2)
            try:
                request.do_handshake()
            except (OSError, ValueError) as exc:
                log.debug("console_tls_handshake_failed", client=client_address, error=str(exc))
                return
        super().finish_request(request, client_address)


class Handler(BaseHTTPRequestHandler):
    server: Server
    server_version = "txmq-console"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        log.debug("console_http", client=self.client_address[0], line=format % args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        console = self.server.console
        if not console.host_allowed(self.headers.get("Host")):
            # a page of another site reaching a console on loopback through a name of its own
            # (DNS rebinding) is not served
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST, "unknown Host for this console")
            return
        url = urlsplit(self.path)
        parts = [unquote(s) for s in url.path.split("/") if s]
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        form: dict[str, str] = {}
        if method == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_FORM:
                self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
                return
            raw = self.rfile.read(length).decode("utf-8", errors="replace")
            form = {k: v[0] for k, v in parse_qs(raw).items()}
        token = None
        try:
            cookie = SimpleCookie(self.headers.get("Cookie") or "")
            if COOKIE in cookie:
                token = cookie[COOKIE].value
        except CookieError:
            pass
        session = console.sessions.get(token)
        fresh = session is None
        if session is None:
            session = console.sessions.new()
        req = Request(
            method, parts, query, form, session, url.path + (f"?{url.query}" if url.query else "")
        )
        resp = console.handle(req)
        if resp.session is not None:
            session, fresh = resp.session, True
        body = resp.body.encode("utf-8")
        self.send_response(resp.status)
        for k, v in HEADERS.items():
            self.send_header(k, v)
        if console.https is not None:
            # browsers that reached it over HTTPS once never try plain HTTP for it again
            self.send_header("Strict-Transport-Security", "max-age=31536000")
        if resp.location is not None:
            self.send_header("Location", resp.location)
        if fresh:
            self.send_header(
                "Set-Cookie",
                f"{COOKIE}={session.token}; Path=/; HttpOnly; SameSite=Strict"
                + ("; Secure" if console.https is not None else ""),
            )
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)

"""The console: routing, sign-in, CSRF checks and the broker calls (its HTTP server and
sessions: :mod:`.web`; the dead-letter and offset-reset pages: :mod:`.dead_letters`,
:mod:`.offsets`).

The standard library's :class:`~http.server.ThreadingHTTPServer` serves it (a page is a
handful of admin requests; no framework is needed).  Each page opens one admin connection on
the console's event-loop thread, makes its requests and closes it; a request that needs the
signed-in operator's account (an action, the sign-in check) opens one with that account.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import ssl
import threading
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, TypeVar

from txmq.protocol.errors import (
    BrokerResponseError,
    NoPermissionError,
    ProtocolError,
    ServiceNotAvailableError,
    TxmqError,
)
from txmq.protocol.trace import TRACE_TOPIC

from ..admin import AsyncAdminClient
from ..bridge import LoopThread
from ..logs import get_logger
from ..trace_timeline import collect, timeline
from . import charts, dead_letters, offsets, pages
from .users import Users
from .web import ConsoleError, Handler, Request, Response, Server, Sessions

log = get_logger(__name__)

T = TypeVar("T")

#: A message id (UNIQ_KEY) or an offset message id: 32 hex digits.
_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}")
#: What the broker answers for a key it knows whose account lacks a right: the sign-in check
#: accepts these (the key and secret are right); anything else refused is a failed sign-in.
_AUTHENTICATED_REFUSALS = ("needs an admin account", "missing permission")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Console:
    """The web console of one broker.

    Args:
        broker: the broker's ``host:port``.
        access_key, secret_key: the account pages are read with (an admin account when the
            broker's ACL is on).
        tls: as for :class:`~txmq.client.admin.AsyncAdminClient`.
        host, port: where to listen (port 0: any free port; see :attr:`url`).
        timeout: seconds for each broker request.
        users: the console's own accounts (a users file): every page then needs a sign-in
            with one, and only operators act.  Without it and with the broker's ACL off,
            anyone who reaches the console acts.
        https: serve HTTPS with this server-side context (cookies are then ``Secure``).
        sample_interval: seconds between the chart samples (None: no sampling).
    """

    def __init__(
        self,
        broker: str,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: bool | ssl.SSLContext = False,
        host: str = "127.0.0.1",
        port: int = 8088,
        timeout: float = 5.0,
        sessions: Sessions | None = None,
        users: Users | None = None,
        https: ssl.SSLContext | None = None,
        sample_interval: float | None = 10.0,
    ) -> None:
        self.broker = broker
        self.users = users
        self.https = https
        self.credentials = (access_key, secret_key)
        self.tls = tls
        self.timeout = timeout
        self.sessions = sessions or Sessions()
        self._acl: bool | None = None
        self.loop = LoopThread("txmq-console-loop")
        try:
            self.httpd = Server((host, port), Handler)
        except BaseException:
            self.loop.stop()
            raise
        if https is not None:
            # the handshake is made in each request's own thread (see Server.finish_request)
            self.httpd.socket = https.wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.httpd.console = self
        self._thread: threading.Thread | None = None
        self.sampler: charts.Sampler | None = None
        if sample_interval is not None:
            self.sampler = charts.Sampler(
                lambda: self.call(lambda a: charts.read_figures(a, pages.internal_topic)),
                sample_interval,
            )

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"{'https' if self.https else 'http'}://{host}:{port}/"

    def serve_forever(self) -> None:
        if self.sampler is not None and self.sampler._thread is None:
            self.sampler.start()
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> None:
        """Serve from a background thread (:meth:`close` stops it)."""
        self._thread = threading.Thread(
            target=self.serve_forever, name="txmq-console-http", daemon=True
        )
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout)
        if self.sampler is not None:
            self.sampler.stop(timeout)
        self.httpd.server_close()
        self.loop.stop(timeout)

    def host_allowed(self, host_header: str | None) -> bool:
        """A console listening on loopback answers only requests addressed to a loopback
        name; one listening elsewhere (behind a proxy, say) answers any."""
        bound = str(self.httpd.server_address[0])
        if not _loopback(bound):
            return True
        if not host_header:
            return False
        host = host_header.strip()
        if host.startswith("["):  # [::1]:8088
            host = host[1 : host.find("]")] if "]" in host else host
        else:
            host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return host.lower() == "localhost" or _loopback(host)

    # -- broker calls -----------------------------------------------------------------------------

    def call(
        self,
        fn: Callable[[AsyncAdminClient], Awaitable[T]],
        credentials: tuple[str | None, str | None] | None = None,
    ) -> T:
        access_key, secret_key = credentials or self.credentials

        async def go() -> T:
            async with AsyncAdminClient(
                self.broker,
                self.timeout,
                access_key=access_key,
                secret_key=secret_key,
                tls=self.tls,
            ) as admin:
                return await fn(admin)

        return self.loop.run(go(), timeout=self.timeout * 6)

    def acl_enabled(self) -> bool:
        """Whether the broker checks an ACL (asked once, then remembered)."""
        if self._acl is None:
            try:
                settings = self.call(lambda a: a.broker_config())
                self._acl = settings.get("aclEnable", "false").lower() == "true"
            except NoPermissionError:  # only a broker with its ACL on refuses anything
                self._acl = True
        return self._acl

    # -- routing ---------------------------------------------------------------------------------

    def handle(self, req: Request) -> Response:
        try:
            return self._route(req)
        except ConsoleError as exc:
            return self.page(req, exc.status, "Error", pages.error(str(exc)))
        except NoPermissionError as exc:
            return self.page(
                req,
                HTTPStatus.FORBIDDEN,
                "Refused",
                pages.error(f"The broker refused the console's request: {exc}"),
            )
        except (ProtocolError, BrokerResponseError) as exc:
            return self.page(req, HTTPStatus.BAD_REQUEST, "Error", pages.error(str(exc)))
        except (TxmqError, OSError) as exc:
            return self.page(
                req,
                HTTPStatus.BAD_GATEWAY,
                "Broker unreachable",
                pages.error(f"The broker at {self.broker} does not answer: {exc}"),
            )

    def page(
        self, req: Request, status: int, title: str, content: str, active: str = ""
    ) -> Response:
        body = pages.layout(
            title,
            content,
            active=active,
            broker=self.broker,
            user=req.session.user,
            role=req.session.role if self.users is not None else None,
            csrf=req.session.csrf,
        )
        return Response(status, body)

    def signed_in_needed(self) -> bool:
        return self.users is not None or self.acl_enabled()

    def role(self, req: Request) -> str:
        """The role of the request's session: a console user's own; with no users file,
        operator (the broker's ACL, when on, decides what an account may do)."""
        if self.users is None:
            return "operator"
        return req.session.role or "viewer"

    def can_act(self, req: Request) -> bool:
        return self.role(req) == "operator"

    def operator(self, req: Request, what: str) -> tuple[tuple[str | None, str | None], str | None]:
        """The account an action is made with and who made it; 403 for a viewer."""
        if not self.can_act(req):
            log.info("console_action_forbidden", what=what, by=req.session.user)
            raise ConsoleError(
                HTTPStatus.FORBIDDEN,
                f"{req.session.user} is a viewer: only an operator may {what}. Nothing was "
                "changed.",
            )
        if self.users is None and self.acl_enabled():
            return (req.session.access_key, req.session.secret_key), req.session.access_key
        return self.credentials, req.session.user

    def _route(self, req: Request) -> Response:
        p, m = req.parts, req.method
        if m == "POST" and not hmac.compare_digest(
            req.form.get("csrf", "").encode(), req.session.csrf.encode()
        ):
            raise ConsoleError(
                HTTPStatus.FORBIDDEN,
                "This form is out of date or did not come from this console (CSRF token "
                "missing or wrong). Open the page again and retry.",
            )
        if p == ["login"]:
            return self._login(req)
        if p == ["logout"] and m == "POST":
            self.sessions.drop(req.session.token)
            return Response(HTTPStatus.SEE_OTHER, location="/", session=self.sessions.new())
        if self.signed_in_needed() and req.session.user is None:
            return Response(HTTPStatus.SEE_OTHER, location=pages.path("login", next=req.target))
        if m == "GET":
            if p == []:
                return self._overview(req)
            if p == ["topics"]:
                return self._topics(req)
            if len(p) == 2 and p[0] == "topics":
                return self._topic(req, p[1])
            if p == ["groups"]:
                return self._groups(req)
            if len(p) == 2 and p[0] == "groups":
                return self._group(req, p[1])
            if len(p) == 3 and p[0] == "groups" and p[2] == "reset":
                return offsets.reset_form(self, req, p[1])
            if p == ["transactions"]:
                return self._transactions(req)
            if len(p) == 2 and p[0] == "transactions":
                t = self._transaction_or_404(p[1])
                return self.page(
                    req,
                    HTTPStatus.OK,
                    f"Transaction {p[1]}",
                    pages.transaction(t, self.can_act(req)),
                    "transactions",
                )
            if len(p) == 3 and p[0] == "transactions" and p[2] == "confirm":
                return self._confirm(req, p[1], req.query.get("action", ""))
            if p == ["messages"]:
                return self._message(req)
            if p == ["search"]:
                return self._search(req)
            if p == ["trace"]:
                return self._trace(req)
            if p == ["dlq"]:
                return dead_letters.dlq(self, req)
            if p == ["dlq", "confirm"]:
                return dead_letters.dlq_confirm(self, req)
        if m == "POST" and len(p) == 3 and p[0] == "transactions":
            return self._act(req, p[1], p[2])
        if m == "POST" and p == ["dlq", "resend"]:
            return dead_letters.dlq_resend(self, req)
        if m == "POST" and len(p) == 3 and p[0] == "groups" and p[2] == "reset":
            return offsets.reset(self, req, p[1])
        raise ConsoleError(HTTPStatus.NOT_FOUND, f"No such page: {req.target}")

    # -- sign-in -----------------------------------------------------------------------------

    def _login(self, req: Request) -> Response:
        next_url = req.form.get("next") or req.query.get("next") or "/"
        if not next_url.startswith("/") or next_url.startswith("//"):
            next_url = "/"
        if self.users is not None:
            return self._user_login(req, next_url)
        if not self.acl_enabled():
            return Response(HTTPStatus.SEE_OTHER, location=next_url)
        if req.method == "GET":
            return self.page(
                req, HTTPStatus.OK, "Sign in", pages.login(next_url, req.session.csrf, None)
            )
        ak = req.form.get("access_key", "").strip()
        sk = req.form.get("secret_key", "")
        problem = None
        admin = False
        if not ak or not sk:
            problem = "Give both the AccessKey and the SecretKey."
        else:

            async def probe(a: AsyncAdminClient) -> None:
                await a.runtime_info()

            try:
                self.call(probe, (ak, sk))
                admin = True
            except NoPermissionError as exc:
                if not any(s in str(exc) for s in _AUTHENTICATED_REFUSALS):
                    problem = f"The broker refused these credentials: {exc}"
        if problem is not None:
            log.info("console_sign_in_refused", access_key=ak)
            return self.page(
                req,
                HTTPStatus.UNAUTHORIZED,
                "Sign in",
                pages.login(next_url, req.session.csrf, problem),
            )
        log.info("console_signed_in", access_key=ak, admin=admin)
        # a new token at sign-in: a token seen before it (a fixed session) is worth nothing
        self.sessions.drop(req.session.token)
        s = self.sessions.new(ak, sk)
        s.admin = admin
        s.user = ak
        return Response(HTTPStatus.SEE_OTHER, location=next_url, session=s)

    def _user_login(self, req: Request, next_url: str) -> Response:
        assert self.users is not None
        if req.method == "GET":
            return self.page(
                req, HTTPStatus.OK, "Sign in", pages.user_login(next_url, req.session.csrf, None)
            )
        name = req.form.get("username", "").strip()
        user = self.users.authenticate(name, req.form.get("password", ""))
        if user is None:
            log.info("console_sign_in_refused", user=name)
            return self.page(
                req,
                HTTPStatus.UNAUTHORIZED,
                "Sign in",
                pages.user_login(next_url, req.session.csrf, "Wrong user name or password."),
            )
        log.info("console_signed_in", user=user.name, role=user.role)
        self.sessions.drop(req.session.token)
        s = self.sessions.new()
        s.user, s.role = user.name, user.role
        return Response(HTTPStatus.SEE_OTHER, location=next_url, session=s)

    # -- pages -------------------------------------------------------------------------------

    def _overview(self, req: Request) -> Response:
        async def collect(a: AsyncAdminClient) -> tuple[dict[str, Any], dict[str, Any] | None]:
            info = await a.runtime_info()
            try:
                cluster: dict[str, Any] | None = await a.cluster_status()
            except ServiceNotAvailableError:  # a single node
                cluster = None
            return info, cluster

        info, cluster = self.call(collect)
        return self.page(
            req,
            HTTPStatus.OK,
            f"Broker {info.get('brokerName')}",
            pages.overview(info, cluster, self._charts_overview()),
            "overview",
        )

    def _topics(self, req: Request) -> Response:
        show_all = req.query.get("all") == "1"

        async def collect(a: AsyncAdminClient) -> list[dict[str, Any]]:
            table = await a.list_topics()
            rows = []
            for name in sorted(table):
                if not show_all and pages.internal_topic(name):
                    continue
                stats = await a.topic_stats(name)
                queues = stats.get("offsetTable") or []
                rows.append(
                    {
                        **table[name],
                        "name": name,
                        "messages": sum(q["maxOffset"] - q["minOffset"] for q in queues),
                        "groups": sorted(stats.get("consumerOffsets") or {}),
                    }
                )
            return rows

        return self.page(
            req, HTTPStatus.OK, "Topics", pages.topics(self.call(collect), show_all), "topics"
        )

    def _topic(self, req: Request, name: str) -> Response:
        async def collect(a: AsyncAdminClient) -> tuple[dict[str, Any] | None, dict[str, Any]]:
            config = (await a.list_topics()).get(name)
            if config is None:
                raise ConsoleError(HTTPStatus.NOT_FOUND, f"The broker has no topic {name!r}.")
            return config, await a.topic_stats(name)

        config, stats = self.call(collect)
        return self.page(
            req, HTTPStatus.OK, f"Topic {name}", pages.topic(name, config, stats), "topics"
        )

    async def _members(self, a: AsyncAdminClient, group: str) -> dict[str, Any]:
        try:
            return await a.consumer_connections(group)
        except NoPermissionError:
            raise
        except BrokerResponseError:  # 206: no consumer of the group is online
            return {"connectionSet": []}

    def _groups(self, req: Request) -> Response:
        async def collect(a: AsyncAdminClient) -> list[dict[str, Any]]:
            rows = []
            for g in await a.consumer_groups():
                stats = await a.consume_stats(g)
                conns = await self._members(a, g)
                rows.append(
                    {
                        "group": g,
                        "members": len(conns.get("connectionSet") or []),
                        "topics": sorted({s["topic"] for s in stats}),
                        "lag": sum(s["lag"] for s in stats),
                    }
                )
            return rows

        return self.page(
            req, HTTPStatus.OK, "Consumer groups", pages.groups(self.call(collect)), "groups"
        )

    def _group(self, req: Request, name: str) -> Response:
        async def collect(a: AsyncAdminClient) -> tuple[list[dict[str, Any]], dict[str, Any]]:
            if name not in await a.consumer_groups():
                raise ConsoleError(
                    HTTPStatus.NOT_FOUND, f"The broker knows no consumer group {name!r}."
                )
            return await a.consume_stats(name), await self._members(a, name)

        stats, conns = self.call(collect)
        return self.page(
            req,
            HTTPStatus.OK,
            f"Consumer group {name}",
            pages.group(name, stats, conns, self._lag_chart(name), self.can_act(req)),
            "groups",
        )

    def _transactions(self, req: Request) -> Response:
        group = req.query.get("group") or None
        topic = req.query.get("topic") or None
        state = req.query.get("state") or "PENDING,DISCARDED"
        txns = self.call(
            lambda a: a.list_transactions(group=group, topic=topic, state=state, limit=1000)
        )
        return self.page(
            req,
            HTTPStatus.OK,
            "Transactions",
            pages.transactions(txns, group, topic, state),
            "transactions",
        )

    def _transaction_or_404(self, transaction_id: str) -> dict[str, Any]:
        try:
            return self.call(lambda a: a.get_transaction(transaction_id))
        except NoPermissionError:
            raise
        except BrokerResponseError as exc:
            raise ConsoleError(
                HTTPStatus.NOT_FOUND, f"No transaction {transaction_id!r}: {exc}"
            ) from None

    def _confirm(self, req: Request, transaction_id: str, action: str) -> Response:
        if action not in pages.ACTIONS:
            raise ConsoleError(HTTPStatus.BAD_REQUEST, f"No such action: {action!r}")
        self.operator(req, f"{pages.ACTIONS[action][0].lower()} a transaction")
        t = self._transaction_or_404(transaction_id)
        user = req.session.user
        return self.page(
            req,
            HTTPStatus.OK,
            f"{pages.ACTIONS[action][0]} transaction?",
            pages.confirm(t, action, req.session.csrf, user),
            "transactions",
        )

    def _act(self, req: Request, transaction_id: str, action: str) -> Response:
        if action not in pages.ACTIONS:
            raise ConsoleError(HTTPStatus.NOT_FOUND, f"No such action: {action!r}")
        credentials, who = self.operator(req, f"{pages.ACTIONS[action][0].lower()} a transaction")
        reason = req.form.get("reason", "").strip()[:200] or (
            f"txmq console ({who})" if who else "txmq console"
        )

        async def act(a: AsyncAdminClient) -> str:
            if action == "resume":
                return await a.resume_transaction(transaction_id)
            return await a.force_decide(transaction_id, action == "commit", reason)

        label = pages.ACTIONS[action][0]
        try:
            text = self.call(act, credentials)
        except NoPermissionError as exc:
            log.info("console_action_refused", action=action, transaction=transaction_id, by=who)
            content = pages.action_result(
                transaction_id,
                False,
                f"Refused: the broker's ACL did not let {who or 'the console'} "
                f"{label.lower()} this transaction. Nothing was changed. ({exc})",
            )
            return self.page(
                req, HTTPStatus.FORBIDDEN, f"{label}: refused", content, "transactions"
            )
        except BrokerResponseError as exc:
            content = pages.action_result(
                transaction_id, False, f"The broker did not {label.lower()} it: {exc}"
            )
            return self.page(req, HTTPStatus.CONFLICT, f"{label}: failed", content, "transactions")
        log.info("console_action", action=action, transaction=transaction_id, by=who)
        done = {"commit": "committed", "rollback": "rolled back", "resume": "resumed"}[action]
        content = pages.action_result(
            transaction_id, True, f"Transaction {transaction_id} {done}. {text}".strip()
        )
        return self.page(req, HTTPStatus.OK, f"{label}: done", content, "transactions")

    def _message(self, req: Request) -> Response:
        msg_id = req.query.get("id", "").strip()
        topic = req.query.get("topic", "").strip() or None
        if not msg_id:
            return self.page(req, HTTPStatus.OK, "Message", pages.message_form("", ""), "messages")
        if not _MSG_ID.fullmatch(msg_id):
            raise ConsoleError(
                HTTPStatus.BAD_REQUEST,
                f"{msg_id!r} is not a message id or an offset message id (32 hex digits).",
            )
        try:
            msg = self.call(lambda a: a.find_message(msg_id, topic))
        except NoPermissionError:
            raise
        except BrokerResponseError as exc:
            raise ConsoleError(HTTPStatus.NOT_FOUND, f"No message {msg_id!r}: {exc}") from None
        return self.page(req, HTTPStatus.OK, "Message", pages.message(msg, msg_id), "messages")

    # -- charts ------------------------------------------------------------------------------

    def _charts_overview(self) -> str | None:
        if self.sampler is None:
            return None
        sm = self.sampler
        boxes = [
            # heading, points, chart title, unit, element id
            ("Messages sent per second", sm.points(charts.SEND_RATE), "sent/s", "msg/s", "send"),
            (
                "Messages consumed per second",
                sm.points(charts.CONSUME_RATE),
                "consumed/s",
                "msg/s",
                "consume",
            ),
            (
                "Pending transactions",
                sm.points(charts.PENDING),
                "pending transactions",
                "",
                "pending",
            ),
            ("Total lag of all groups", self._total_lag(), "total lag", "messages", "lag"),
        ]
        return "".join(
            pages.chart_box(
                heading, charts.svg(points, title=title, unit=unit, css_id=f"chart-{css_id}")
            )
            for heading, points, title, unit, css_id in boxes
        )

    def _total_lag(self) -> list[tuple[float, float]]:
        assert self.sampler is not None
        by_time: dict[float, float] = {}
        for name in list(self.sampler.series):
            if name.startswith(charts.lag_series("")):
                for t, v in self.sampler.points(name):
                    by_time[t] = by_time.get(t, 0.0) + v
        return sorted(by_time.items())

    def _lag_chart(self, group: str) -> str | None:
        if self.sampler is None:
            return None
        return pages.chart_box(
            "Lag over time",
            charts.svg(
                self.sampler.points(charts.lag_series(group)),
                title=f"lag of {group}",
                unit="messages",
                css_id="chart-group-lag",
            ),
        )

    # -- key search, trace -------------------------------------------------------------------

    def _search(self, req: Request) -> Response:
        topic = req.query.get("topic", "").strip()
        key = req.query.get("key", "").strip()
        found = None
        if topic and key:
            found = self.call(lambda a: a.query_messages(topic, key, max_num=64)).messages
        return self.page(
            req, HTTPStatus.OK, "Search by key", pages.search(topic, key, found), "search"
        )

    def _trace(self, req: Request) -> Response:

        key = req.query.get("key", "").strip()
        rows = None
        if key:
            rows = timeline(self.call(lambda a: collect(a, key, TRACE_TOPIC)))
        return self.page(req, HTTPStatus.OK, "Trace", pages.trace(key, rows), "trace")

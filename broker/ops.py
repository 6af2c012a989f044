"""The operations port (``metricsPort``): ``/metrics`` in Prometheus' text format, ``/healthz``
(the process serves) and ``/readyz`` (this broker takes traffic: a leader or single broker that
serves and accepts writes, or an in-sync follower), each a plain-text answer, 200 or 503 with the
reason.  No authentication; HTTPS with the broker's certificate while TLS is enforcing.

``/healthz`` is answered by the server's own thread, so it must not take a live process for a
working one: the broker's event loop stamps a heartbeat every :data:`BEAT_INTERVAL` seconds, and
``/healthz`` answers 503 when the last stamp is older than ``healthzLoopStallSeconds`` -- a loop
blocked by a stuck call answers no client, and a liveness check should restart it.

Served by a small threaded WSGI server (the standard library's, as prometheus-client's own
``start_http_server``), because that one serves nothing but ``/metrics``.  Before answering
``/metrics`` it asks the broker's event loop to refresh the scrape-time figures (consumer lag,
disk, ...: :mod:`.metrics_scrape`), so they are read while nothing changes them; when the loop
has not started within :data:`LOOP_WAIT` seconds (busy, or blocked), the server's thread does it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from .metrics import IdentityLabels

#: How long a scrape waits for the event loop to start refreshing the scrape-time figures
#: before it refreshes them itself (seconds).
LOOP_WAIT = 0.5
#: Longest a scrape waits for a refresh the loop has started.
REFRESH_TIMEOUT = 5.0

#: How often the event loop stamps the heartbeat ``/healthz`` checks (seconds).
BEAT_INTERVAL = 1.0

#: ``(ready, why)``: what ``/readyz`` answers.
Probe = Callable[[], tuple[bool, str]]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Probes every few seconds would flood the log."""


class OpsServer:
    """Serves the operations port from a daemon thread until :meth:`stop`.

    Args:
        registry: the metrics to serve (a callable: the registry of whoever serves now).
        ready: ``/readyz``'s probe, called on the server's thread (keep it to reading fields).
        loop: where a registry's ``refresh()`` runs and the heartbeat is stamped (default: the
            running loop, if any).
        loop_stall: ``/healthz`` answers 503 once the loop has not stamped the heartbeat for
            this many seconds (0: never; without a loop there is no heartbeat).
        labels: constant labels every sample of ``/metrics`` carries (the broker's
            ``cluster`` and ``broker``: :class:`~txmq.broker.metrics.IdentityLabels`).
    """

    def __init__(
        self,
        port: int,
        addr: str,
        registry: Callable[[], CollectorRegistry],
        ready: Probe,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
        client_cafile: str | None = None,
        client_auth_required: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        loop_stall: float = 0.0,
        labels: dict[str, str] | None = None,
    ) -> None:
        self._registry = registry
        self._labels = labels or {}
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self._loop = loop
        self._ready = ready
        self._last: tuple[CollectorRegistry, Any] | None = None
        self._loop_stall = loop_stall if loop is not None else 0.0
        self._beat = time.monotonic()
        self._beat_handle: asyncio.TimerHandle | None = None
        self._stopped = False
        self._httpd = make_server(addr, port, self._app, _Server, handler_class=_Quiet)
        if certfile and keyfile:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(certfile, keyfile)
            if client_cafile:
                ctx.load_verify_locations(client_cafile)
                ctx.verify_mode = ssl.CERT_REQUIRED if client_auth_required else ssl.CERT_OPTIONAL
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="txmq-ops", daemon=True
        )
        self._thread.start()
        if self._loop_stall > 0 and loop is not None:
            loop.call_soon_threadsafe(self._stamp)

    def _stamp(self) -> None:
        """On the loop: note that it turns, and come back in :data:`BEAT_INTERVAL`."""
        self._beat = time.monotonic()
        if not self._stopped and self._loop is not None and not self._loop.is_closed():
            self._beat_handle = self._loop.call_later(BEAT_INTERVAL, self._stamp)

    def health(self) -> tuple[bool, str]:
        """``/healthz``: whether the event loop has turned within ``loop_stall`` seconds."""
        if self._loop_stall > 0:
            quiet = time.monotonic() - self._beat
            if quiet > self._loop_stall:
                return False, (
                    f"the event loop has not turned for {quiet:.1f}s "
                    f"(healthzLoopStallSeconds {self._loop_stall:g})"
                )
        return True, "serving"

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/healthz", "/readyz"):
            ok, why = self.health() if path == "/healthz" else self._ready()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "text/plain; charset=utf-8")],
            )
            return [f"{'ok' if ok else 'not ready'}: {why}\n".encode()]
        registry = self._registry()
        refresh = getattr(registry, "refresh", None)
        if refresh is not None:
            self._on_loop(refresh)
        last = self._last
        if last is None or last[0] is not registry:
            served = IdentityLabels(registry, self._labels) if self._labels else registry
            last = self._last = (registry, make_wsgi_app(served))
        return last[1](environ, start_response)  # type: ignore[no-any-return]

    def _on_loop(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None:
            fn()
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    fn()
                    done.set_result(None)
                except BaseException as exc:
                    done.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed: the broker is going away
            return
        try:
            done.result(LOOP_WAIT)
        except concurrent.futures.TimeoutError:
            if done.cancel():
                # The loop is busy or blocked and has not started it: refresh from here (the
                # figures read the store and tables defensively, and a failure keeps the
                # previous scrape's figures).
                fn()
            else:
                done.result(REFRESH_TIMEOUT)

    def stop(self) -> None:
        self._stopped = True
        handle = self._beat_handle
        if handle is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(handle.cancel)
            except RuntimeError:  # the loop is closed: nothing left to cancel
                pass
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def start_ops_server(
    cfg: Any, registry: Callable[[], CollectorRegistry], ready: Probe
) -> OpsServer | None:
    """The operations port of a broker configuration (``metricsPort``; None when 0).  With TLS
    enforced on the remoting port it is HTTPS with the same certificate (and the same
    client-certificate rule); permissive keeps it plain."""
    if not cfg.metrics_port:
        return None
    https = cfg.tls_server_mode == "enforcing"
    return OpsServer(
        cfg.metrics_port,
        cfg.bind_address,
        registry,
        ready,
        certfile=cfg.tls_server_cert_path if https else None,
        keyfile=cfg.tls_server_key_path if https else None,
        client_cafile=cfg.tls_server_trust_cert_path
        if https and cfg.tls_server_need_client_auth != "none"
        else None,
        client_auth_required=https and cfg.tls_server_need_client_auth == "require",
        loop_stall=cfg.healthz_loop_stall_seconds,
        labels={"cluster": cfg.broker_cluster_name, "broker": cfg.broker_name},
    )

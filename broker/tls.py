"""TLS on the remoting port: disabled, permissive (TLS and plain on one port) or enforcing, with
optional mutual TLS and certificates reloaded from disk without a restart.

The TLS engine is the standard library's :mod:`ssl` module: it is the well-kept engine Python
ships (OpenSSL underneath, patched with the interpreter), both event loops (asyncio and uvloop)
drive it natively, and it adds no dependency.

How connections are admitted.  With TLS on, the broker accepts connections itself rather than
through ``loop.create_server``, and hands each accepted socket to
``loop.connect_accepted_socket`` -- with ``ssl=`` the context in force *at that moment* for a
TLS connection, without it for a plain one.  Two reasons:

* Permissive mode must see a connection's first byte before deciding.  A TLS record that opens
  a handshake starts with 0x16; a remoting frame starts with the high byte of its length, and
  0x16 there would announce a frame of at least 0x16000000 bytes (352 MiB), far above
  ``maxFrameSize``.  The byte is *peeked* (``MSG_PEEK``) on the raw socket, so it is still there
  for whichever side reads it.  Reading it through a transport and then calling
  ``loop.start_tls`` does not work: ``start_tls`` cannot be given bytes the transport has
  already consumed, so the ClientHello would be lost.
* A reloaded certificate is a new :class:`ssl.SSLContext`; since each connection is wrapped with
  the current one, new connections get the new certificate while open ones keep theirs.  A
  server created with ``create_server(ssl=ctx)`` keeps ``ctx`` for its lifetime.

A handshake that fails (wrong CA on either side, no client certificate under
``need.client.auth = require``, garbage bytes, a truncated or stalled handshake) closes that
connection only, is logged with the peer's address and counted as a protocol error.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

import structlog

log = structlog.get_logger(__name__)

MODES = ("disabled", "permissive", "enforcing")
CLIENT_AUTH = ("none", "optional", "require")

#: First byte of a TLS handshake record (ContentType.handshake).
TLS_HANDSHAKE = 0x16

_VERIFY = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class TlsFiles:
    """The files a server context is built from (the ``tls.server.*`` keys)."""

    cert_path: str
    key_path: str
    trust_cert_path: str = ""
    need_client_auth: str = "none"

    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert_path, self.key_path, self.trust_cert_path) if p)


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """Build the broker's server context; blocking (reads files), so call it off the loop.

    Raises:
        TlsConfigError: a file is missing, unreadable or does not hold what it should.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for what, path in (("certificate", files.cert_path), ("key", files.key_path)):
        if not os.path.isfile(path):
            raise TlsConfigError(f"{what} file not found: {path!r}")
    try:
        ctx.load_cert_chain(files.cert_path, files.key_path)
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(
            f"cannot load the certificate {files.cert_path!r} with the key {files.key_path!r}: "
            f"{exc}"
        ) from None
    if files.need_client_auth != "none":
        if not os.path.isfile(files.trust_cert_path):
            raise TlsConfigError(f"trusted CA file not found: {files.trust_cert_path!r}")
        try:
            ctx.load_verify_locations(cafile=files.trust_cert_path)
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(
                f"cannot load the trusted CA file {files.trust_cert_path!r}: {exc}"
            ) from None
    ctx.verify_mode = _VERIFY[files.need_client_auth]
    return ctx


def h2_context(files: TlsFiles) -> ssl.SSLContext:
    """:func:`server_context` for HTTP/2 (gRPC): ALPN ``h2``; ``need.client.auth = optional``
    asks for no certificate (gRPC's TLS asks only when it requires one).  Blocking."""
    require = files.need_client_auth == "require"
    ctx = server_context(
        TlsFiles(
            files.cert_path,
            files.key_path,
            files.trust_cert_path,
            "require" if require else "none",
        )
    )
    ctx.set_alpn_protocols(["h2"])
    return ctx


@dataclass(frozen=True)
class TlsMaterial:
    """A server context and the PEM bytes it was built from (the gRPC front end, whose TLS is
    gRPC's own, is given the bytes)."""

    context: ssl.SSLContext
    chain: bytes = field(repr=False)
    key: bytes = field(repr=False)
    #: The CA of client certificates (``None`` when none is asked for).
    trust: bytes | None = field(default=None, repr=False)
    #: The context of the gRPC port's native transport: ALPN ``h2``, a client certificate
    #: asked for only when required (as gRPC's own TLS does).
    h2: ssl.SSLContext | None = field(default=None, repr=False)


def _read_pem(files: TlsFiles) -> tuple[bytes, bytes, bytes | None]:
    def read(path: str) -> bytes:
        with open(path, "rb") as fh:
            return fh.read()

    trust = read(files.trust_cert_path) if files.need_client_auth != "none" else None
    return read(files.cert_path), read(files.key_path), trust


def server_material(files: TlsFiles) -> TlsMaterial:
    """:func:`server_context` and the bytes it was built from; blocking.  The files are read
    before and after the context is built: a file replaced in between (a rotation under way)
    is read again, so the context and the bytes always come from the same files.

    Raises:
        TlsConfigError: as :func:`server_context`, or the files kept changing.
    """
    for _ in range(3):
        try:
            before: tuple[bytes, bytes, bytes | None] | None = _read_pem(files)
        except OSError:
            before = None  # server_context names the file that is missing
        ctx = server_context(files)
        try:
            after = _read_pem(files)
        except OSError as exc:
            raise TlsConfigError(f"cannot read the certificate files: {exc}") from None
        if after == before:
            return TlsMaterial(ctx, *after, h2=h2_context(files))
    raise TlsConfigError(
        f"the certificate files {', '.join(files.paths())} kept changing while being read"
    )


class ServerTls:
    """The server context in force and the file stamps it was built from.

    :meth:`load` and :meth:`poll` read files (run them off the event loop); :meth:`install`
    swaps the context on the loop.
    """

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        #: The context in force and its PEM bytes.
        self.material: TlsMaterial | None = None
        self._stamps: tuple[tuple[float, int], ...] = ()
        #: Times the certificate was reloaded (for tests and logs).
        self.reloads = 0

    def _stat(self) -> tuple[tuple[float, int], ...]:
        out = []
        for p in self.files.paths():
            try:
                st = os.stat(p)
                out.append((st.st_mtime, st.st_size))
            except OSError:
                out.append((0.0, -1))
        return tuple(out)

    @property
    def context(self) -> ssl.SSLContext | None:
        """The context new remoting connections get."""
        return None if self.material is None else self.material.context

    def load(self) -> None:
        """Build the first context (blocking).  Raises :class:`TlsConfigError`."""
        stamps = self._stat()
        self.material = server_material(self.files)
        self._stamps = stamps

    def poll(self) -> TlsMaterial | None:
        """A new context when a file changed since the last build (blocking), else None.  A
        changed file that does not load is logged and the context in force stays."""
        stamps = self._stat()
        if stamps == self._stamps:
            return None
        try:
            material = server_material(self.files)
        except TlsConfigError as exc:
            # Remember the stamps: a half-written file is retried when it changes again.
            self._stamps = stamps
            log.error("tls_reload_failed", error=str(exc))
            return None
        self._stamps = stamps
        return material

    def install(self, material: TlsMaterial) -> None:
        self.material = material
        self.reloads += 1
        log.info("tls_certificate_reloaded", cert=self.files.cert_path)


@dataclass(eq=False)
class TlsServer:
    """Accepts connections on one listening socket and admits each as TLS or plain.

    It offers what :class:`~txmq.broker.server.BrokerController` uses of an
    ``asyncio.Server``: ``sockets``, ``start_serving``, ``close`` and ``wait_closed``.

    Args:
        protocol_factory: builds the remoting protocol of one connection.
        tls: the context in force (read for every new connection).
        mode: ``permissive`` or ``enforcing``.
        handshake_timeout: seconds a TLS handshake may take.
        first_byte_timeout: seconds a permissive-mode connection may stay silent before its
            first byte decides between TLS and plain.
        on_rejected: called with the peer and the reason when a connection is refused.
    """

    sock: socket.socket
    protocol_factory: Callable[[], asyncio.Protocol]
    tls: ServerTls
    _: KW_ONLY
    mode: str
    handshake_timeout: float = 10.0
    first_byte_timeout: float = 120.0
    on_rejected: Callable[[str, str], None] | None = None
    #: Wrap connections with the HTTP/2 context (:attr:`TlsMaterial.h2`, the gRPC port).
    h2: bool = False
    _accept_task: asyncio.Task[None] | None = field(default=None, init=False)
    _admitting: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self.sockets = [self.sock]

    @classmethod
    async def bind(
        cls,
        host: str,
        port: int,
        protocol_factory: Callable[[], asyncio.Protocol],
        tls: ServerTls,
        **kwargs: object,
    ) -> TlsServer:
        """Bind ``host:port`` (SO_REUSEADDR, as the plain server does).  Raises OSError."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        if not infos:  # pragma: no cover - getaddrinfo raises instead
            raise OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r}")
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(1024)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return cls(sock, protocol_factory, tls, **kwargs)  # type: ignore[arg-type]

    async def start_serving(self) -> None:
        if self._accept_task is None:
            self._accept_task = asyncio.get_running_loop().create_task(
                self._accept_loop(), name="txmq-tls-accept"
            )

    def close(self) -> None:
        """Stop accepting; connections being admitted are dropped, open ones stay."""
        if self._accept_task is not None:
            self._accept_task.cancel()
        for t in list(self._admitting):
            t.cancel()
        if self.sock.fileno() != -1:
            self.sock.close()

    async def wait_closed(self) -> None:
        pending = [t for t in [self._accept_task, *self._admitting] if t is not None]
        if pending:
            await asyncio.wait(pending)

    # -- internals ------------------------------------------------------------------------------

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:
                # EMFILE and friends: keep serving the connections already open, retry soon.
                log.warning("accept_failed", error=str(exc))
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._admit(conn))
            self._admitting.add(task)
            task.add_done_callback(self._admitting.discard)

    async def _admit(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        peer = _peer(sock)
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        try:
            use_tls = True
            if self.mode == "permissive":
                first = await _peek_first_byte(sock, self.first_byte_timeout)
                if first is None:
                    sock.close()
                    return
                use_tls = first == TLS_HANDSHAKE
            if not use_tls:
                await loop.connect_accepted_socket(self.protocol_factory, sock)
                return
            material = self.tls.material
            assert material is not None
            ctx = material.h2 if self.h2 else material.context
            assert ctx is not None
            await loop.connect_accepted_socket(
                self.protocol_factory, sock, ssl=ctx, ssl_handshake_timeout=self.handshake_timeout
            )
        except asyncio.CancelledError:
            sock.close()
            raise
        except TimeoutError:
            sock.close()
            self._rejected(peer, "TLS handshake timed out")
        except (ssl.SSLError, OSError, EOFError) as exc:
            sock.close()
            self._rejected(peer, f"TLS handshake failed: {exc}")

    def _rejected(self, peer: str, reason: str) -> None:
        log.warning("tls_connection_refused", peer=peer, reason=reason)
        if self.on_rejected is not None:
            self.on_rejected(peer, reason)


def _peer(sock: socket.socket) -> str:
    try:
        addr = sock.getpeername()
    except OSError:
        return "?"
    return f"{addr[0]}:{addr[1]}"


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _peek_first_byte(sock: socket.socket, timeout: float) -> int | None:
    """The first byte the peer sent, left unread in the socket; None when the peer closed
    or stayed silent for ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            data = sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return None
        else:
            return data[0] if data else None
        remaining = deadline - loop.time()
        if remaining <= 0:
            return None
        readable: asyncio.Future[None] = loop.create_future()
        fd = sock.fileno()
        loop.add_reader(fd, _wake, readable)
        try:
            await asyncio.wait({readable}, timeout=remaining)
        finally:
            loop.remove_reader(fd)
            readable.cancel()

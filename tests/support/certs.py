"""Throw-away certificates for TLS tests, made with the ``openssl`` command line into a test's
temporary folder: a CA, a broker certificate for 127.0.0.1 / localhost signed by it, a client
certificate signed by it, and a second, unrelated CA (the "wrong" one)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    _openssl("req", "-x509", *_EC, "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}")
    return cert, key


def issue(
    folder: Path,
    name: str,
    ca: tuple[Path, Path],
    *,
    server: bool,
    client_too: bool = False,
    names: str = "IP:127.0.0.1,DNS:localhost",
) -> tuple[Path, Path]:
    """A certificate ``name`` signed by ``ca``; for a server it names ``names`` (127.0.0.1 and
    localhost), and with ``client_too`` it may also serve as a client certificate (what a
    broker presents to its leader, or its health probe, under mutual TLS)."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    ext = (
        ["-addext", f"subjectAltName={names}"]
        + ["-addext", f"extendedKeyUsage=serverAuth{',clientAuth' if client_too else ''}"]
        if server
        else ["-addext", "extendedKeyUsage=clientAuth"]
    )
    _openssl(
        "req",
        "-x509",
        *_EC,
        "-CA",
        str(ca[0]),
        "-CAkey",
        str(ca[1]),
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:FALSE",
        *ext,
    )
    return cert, key


@dataclass
class Certs:
    folder: Path
    ca: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    wrong_ca: Path

    def client_context(self, *, ca: Path | None = None, mutual: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(ca or self.ca))
        if mutual:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx

    def broker_settings(self, mode: str = "enforcing", client_auth: str = "none") -> dict[str, str]:
        """BrokerConfig fields for TLS with these files."""
        return dict(
            tls_server_mode=mode,
            tls_server_cert_path=str(self.server_cert),
            tls_server_key_path=str(self.server_key),
            tls_server_trust_cert_path=str(self.ca),
            tls_server_need_client_auth=client_auth,
        )


def make_certs(folder: Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca(folder, "ca")
    server = issue(folder, "broker", ca, server=True)
    client = issue(folder, "client", ca, server=False)
    wrong = _ca(folder, "wrong-ca")
    return Certs(folder, ca[0], ca[1], *server, *client, wrong[0])

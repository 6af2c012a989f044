"""Ports for the servers a test starts in other processes (brokers, etcd members, Spark, Docker).

A port the kernel hands out for ``bind(0)`` comes from its ephemeral range, the same range it
draws the local ports of outgoing connections from: between the test choosing the port and the
child binding it, any client connection of the test run (to etcd, to a broker) may take it, and
the child fails with "Address already in use". So ports are chosen *below* the ephemeral range,
where the kernel never picks one on its own, at a per-process random start, never the same one
twice in one run, and only after a bind shows nothing holds it now.
"""

from __future__ import annotations

import os
import random
import socket

#: The lowest port handed out: above the well-known broker ports (9876, 10909-10912, 8081).
LOW = 20000
_handed: set[int] = set()
_rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "big"))


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A port nothing holds now, outside the kernel's ephemeral range, not handed out before
    in this process."""
    high = _ephemeral_low() - 1
    if high - LOW < 1000:  # an unusual range: fall back to what the kernel picks
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    span = high - LOW + 1
    start = _rng.randrange(span)
    for step in range(span):
        port = LOW + (start + step) % span
        if port not in _handed and _bindable(port):
            _handed.add(port)
            return port
    _handed.clear()  # every port handed out once: start over (a run this long is unusual)
    return free_port()

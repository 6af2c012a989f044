"""Broker groups of real broker processes over real etcd members, for the cluster tests.

Each replica is ``txmq broker`` in its own process with its own store folder and a fixed
loopback port (routes name it), logging to a file (``replica.log`` is where to look when a test
fails).  Conditions are read from the brokers themselves (``TXMQ_CLUSTER_STATUS``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from txmq.protocol.aio import open_connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import TxmqError

from .acl_files import account, acl_file
from .ports import free_port
from .process import broker_command

#: Test timers: short lease (quick failover), short lag limit, fast transaction checks.
FAST_CLUSTER = {
    "etcdLeaseTtl": 3,
    "haMaxTimeSlaveNotCatchup": 2000,
    "syncFlushTimeout": 4000,
    "transactionTimeOut": 1000,
    "transactionCheckInterval": 300,
    "mappedFileSizeCommitLog": 8 * 1024 * 1024,
    "maxMessageSize": 1024 * 1024,
    "flushIntervalCommitLog": 100,
}


#: The ACL of the cluster tests with ``aclEnable``: a producer of ``orders`` and the admin
#: account replicas replicate with.
CLUSTER_ACL_FILE = acl_file(
    account("producerA", "secret-a-123", topics=("orders=PUB",), groups=("groupA=PUB",)),
    account("operator", "secret-op-123", admin=True),
)


@dataclass
class Replica:
    group: str
    replica: int
    port: int
    store: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    #: The RocketMQ 5 gRPC port when the cluster serves it (``grpc=True``), else 0.
    grpc_port: int = 0
    #: The operations port (/metrics, /healthz, /readyz).
    ops_port: int = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class BrokerCluster:
    def __init__(
        self,
        base: Path,
        etcd_endpoints: str,
        *,
        name: str,
        groups: dict[str, int],
        flush: str = "SYNC_FLUSH",
        settings: dict[str, Any] | None = None,
        grpc: bool = False,
    ) -> None:
        self.base = base
        self.etcd = etcd_endpoints
        self.name = name
        self.flush = flush
        self.settings = {**FAST_CLUSTER, **(settings or {})}
        self.replicas: dict[tuple[str, int], Replica] = {}
        #: Signs the harness's status requests when the brokers run with aclEnable.
        self.signer: Callable[[RemotingCommand], None] | None = None
        #: The client TLS context of the harness's requests when the brokers enforce TLS.
        self.ssl: ssl.SSLContext | None = None
        for group, n in groups.items():
            for rid in range(n):
                d = base / f"{group}-{rid}"
                d.mkdir(parents=True, exist_ok=True)
                self.replicas[(group, rid)] = Replica(
                    group,
                    rid,
                    free_port(),
                    d / "store",
                    d / "replica.log",
                    grpc_port=free_port() if grpc else 0,
                    ops_port=free_port(),
                )

    def seeds(self, group: str | None = None) -> str:
        """The address list a client is given (every replica of the group, or all)."""
        return ",".join(r.addr for r in self.replicas.values() if group in (None, r.group))

    def command(self, r: Replica) -> list[str]:
        cmd = broker_command(
            str(r.store),
            r.port,
            self.flush,
            {
                "etcdEndpoints": self.etcd,
                "brokerClusterName": self.name,
                "brokerName": r.group,
                "brokerId": r.replica,
                **self.settings,
            },
        )
        if r.grpc_port:
            cmd += ["--set", "grpcServerEnable=true", "--set", f"grpcServerPort={r.grpc_port}"]
        if r.ops_port:
            cmd += ["--set", f"metricsPort={r.ops_port}"]
        return cmd

    def start(self, group: str, rid: int) -> Replica:
        r = self.replicas[(group, rid)]
        assert not r.running
        out = open(r.log, "ab")
        r.proc = subprocess.Popen(
            self.command(r),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        out.close()
        return r

    def start_all(self) -> None:
        for group, rid in self.replicas:
            self.start(group, rid)

    def kill(self, group: str, rid: int) -> None:
        r = self.replicas[(group, rid)]
        assert r.proc is not None
        r.proc.send_signal(signal.SIGKILL)
        r.proc.wait(15)

    def pause(self, group: str, rid: int) -> None:
        r = self.replicas[(group, rid)]
        assert r.proc is not None
        r.proc.send_signal(signal.SIGSTOP)

    def resume(self, group: str, rid: int) -> None:
        r = self.replicas[(group, rid)]
        assert r.proc is not None
        r.proc.send_signal(signal.SIGCONT)

    def wipe(self, group: str, rid: int) -> None:
        r = self.replicas[(group, rid)]
        assert not r.running
        shutil.rmtree(r.store, ignore_errors=True)

    def stop_all(self) -> None:
        for r in self.replicas.values():
            if r.proc is not None and r.proc.poll() is None:
                r.proc.send_signal(signal.SIGCONT)
                r.proc.terminate()
        for r in self.replicas.values():
            if r.proc is not None:
                try:
                    r.proc.wait(20)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
                    r.proc.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for r in self.replicas.values():
            try:
                text = r.log.read_text(errors="replace").splitlines()[-lines:]
            except FileNotFoundError:
                text = []
            out.append(f"--- {r.group}/{r.replica} ({r.addr}) ---\n" + "\n".join(text))
        return "\n".join(out)

    def events(self, group: str, rid: int, event: str) -> list[dict[str, Any]]:
        r = self.replicas[(group, rid)]
        found = []
        for line in r.log.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") == event:
                found.append(doc)
        return found

    # -- asking the brokers ------------------------------------------------------------------

    async def wait(
        self,
        predicate: Callable[[], Awaitable[bool]],
        timeout: float,
        message: str | Callable[[], str],
    ) -> None:
        """Poll ``predicate`` every 0.2 s; fail with ``message`` (or what it returns, for the
        state last seen) and the replicas' log tails after ``timeout``."""
        deadline = time.monotonic() + timeout

        def what() -> str:
            return message if isinstance(message, str) else message()

        while not await predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:.0f}s: {what()}\n{self.log_tail()}")
            if not any(r.running for r in self.replicas.values()):
                pytest.fail(f"every broker process exited: {what()}\n{self.log_tail()}")
            await asyncio.sleep(0.2)

    async def status(self, addr: str, timeout: float = 2.0) -> dict[str, Any] | None:
        host, _, port = addr.rpartition(":")
        try:
            conn = await open_connection(
                host, int(port), timeout=timeout, signer=self.signer, ssl=self.ssl
            )
        except TxmqError:
            return None
        try:
            resp = await conn.request(
                RemotingCommand.request(RequestCode.TXMQ_CLUSTER_STATUS), timeout
            )
        except TxmqError:
            return None
        finally:
            conn.close()
        if resp.code != ResponseCode.SUCCESS:
            return None
        doc: dict[str, Any] = json.loads(resp.body)
        return doc

    async def group_status(self, group: str) -> dict[str, Any] | None:
        """The group as the first running replica that answers sees it."""
        for r in self.replicas.values():
            if r.running:
                st = await self.status(r.addr)
                if st is not None and group in st["groups"]:
                    return dict(st["groups"][group])
        return None

    async def wait_leader(
        self, group: str, *, not_replica: int | None = None, timeout: float = 30.0
    ) -> Replica:
        """Until a replica of ``group`` (other than ``not_replica``) leads and serves."""
        found: list[Replica] = []

        async def led() -> bool:
            for r in self.replicas.values():
                if r.group != group or not r.running or r.replica == not_replica:
                    continue
                st = await self.status(r.addr)
                if st is not None and st["self"]["role"] == "leader":
                    found[:] = [r]
                    return True
            return False

        await self.wait(led, timeout, f"no leader in group {group}")
        return found[0]

    async def start_group(self, group: str = "g1") -> Replica:
        """Start every replica of ``group``, wait until one leads and all are in sync; the
        leader."""
        ids = sorted(rid for g, rid in self.replicas if g == group)
        for rid in ids:
            if not self.replicas[(group, rid)].running:
                self.start(group, rid)
        leader = await self.wait_leader(group)
        await self.wait_in_sync(group, ids)
        return leader

    async def wait_in_sync(self, group: str, members: list[int], timeout: float = 30.0) -> None:
        async def synced() -> bool:
            st = await self.group_status(group)
            return st is not None and sorted(st["inSync"]) == sorted(members)

        await self.wait(synced, timeout, f"group {group} in-sync set never became {members}")

    async def wait_rejoined(self, group: str, leader: int, old: int, timeout: float = 60.0) -> None:
        """Until every replica of ``group`` names ``leader`` as its leader and all of them as
        in sync, and the replica ``old`` (a deposed leader, its view stale until it hears
        from etcd again) says it follows."""
        ids = sorted(rid for g, rid in self.replicas if g == group)

        async def rejoined() -> bool:
            for rid in ids:
                st = await self.status(self.replicas[(group, rid)].addr)
                g = st["groups"].get(group) if st is not None else None
                if st is None or not g or not g.get("leader"):
                    return False
                if g["leader"]["replicaId"] != leader or sorted(g["inSync"]) != ids:
                    return False
                if rid == old and st["self"]["role"] != "follower":
                    return False
            return True

        await self.wait(
            rejoined, timeout, f"replica {old} of {group} following {leader}, all in sync"
        )

    def wait_exit(self, r: Replica, timeout: float = 20.0) -> None:
        assert r.proc is not None
        r.proc.wait(timeout)

    def elapsed(self, t0: float) -> float:
        return time.monotonic() - t0


async def first_send_after(p: Any, topic: str, t0: float, errors: list[str]) -> float:
    """Send ``b"after"`` with the producer ``p`` until one send is acknowledged, the errors
    meanwhile added to ``errors``; the seconds from ``t0`` (a leader killed, paused or cut
    off) to that acknowledgement.  Fails once a send fails 30 s after ``t0``."""
    from txmq.client import Message

    while True:
        try:
            await p.send(Message(topic, b"after"), timeout=30.0)
            return time.monotonic() - t0
        except TxmqError as exc:
            errors.append(str(exc))
            assert time.monotonic() - t0 < 30, f"no send succeeded: {errors[-3:]}"


async def send_before(p: Any, topic: str, n: int = 10) -> list[bytes]:
    """Send ``before-0`` ... ``before-<n-1>`` with the producer ``p``, each acknowledged; the
    bodies."""
    from txmq.client import Message

    acked = []
    for i in range(n):
        await p.send(Message(topic, f"before-{i}".encode()))
        acked.append(f"before-{i}".encode())
    return acked


def enforced_tls(certs: Any) -> dict[str, str]:
    """The replicas' settings that enforce TLS with ``certs`` (:func:`.certs.make_certs`)."""
    return {
        "tls.server.mode": "enforcing",
        "tls.server.certPath": str(certs.server_cert),
        "tls.server.keyPath": str(certs.server_key),
        "tls.server.trustCertPath": str(certs.ca),
    }

"""Real etcd members on loopback ports for the cluster tests.

The binary comes from ``make etcd`` (build/etcd/bin/etcd, Debian's etcd-server unpacked; see
tests/support/get_etcd.sh) or ``TXMQ_ETCD``.  Each member has its own data folder; members can be
SIGKILLed and restarted with their data.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def etcd_binary() -> str:
    """The etcd binary, or a skip (a failure under CI) saying how to get it."""
    path = os.environ.get("TXMQ_ETCD") or str(ROOT / "build" / "etcd" / "bin" / "etcd")
    if os.access(path, os.X_OK):
        return path
    why = f"etcd binary not found at {path}: run `make etcd` (Debian's etcd-server, unpacked)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


@dataclass
class EtcdCluster:
    """``size`` members forming one etcd cluster; :meth:`start` waits until it serves."""

    base: Path
    size: int = 3
    members: list[EtcdMember] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.binary = etcd_binary()
        for i in range(self.size):
            d = self.base / f"etcd{i}"
            d.mkdir(parents=True, exist_ok=True)
            self.members.append(
                EtcdMember(f"etcd{i}", free_port(), free_port(), d / "data", d / "etcd.log")
            )

    @property
    def endpoints(self) -> str:
        """The ``etcdEndpoints`` value: every member, comma-separated."""
        return ",".join(m.endpoint for m in self.members)

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)

    def start_member(self, m: EtcdMember) -> None:
        assert m.proc is None or m.proc.poll() is not None
        args = [
            self.binary,
            *member_args(
                m.name,
                str(m.data_dir),
                f"127.0.0.1:{m.client_port}",
                f"127.0.0.1:{m.peer_port}",
                self._initial_cluster(),
                f"txmq-test-{os.getpid()}",
                str(m.log_path),
            ),
        ]
        env = dict(os.environ, ETCD_UNSUPPORTED_ARCH=os.environ.get("ETCD_UNSUPPORTED_ARCH", ""))
        m.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )

    def start(self, timeout: float = 60.0, attempts: int = 3) -> EtcdCluster:
        """Start every member and wait until the cluster serves.  A port picked free can be
        taken by another process before etcd binds it: then the whole cluster is started
        again on fresh ports (up to ``attempts`` times)."""
        for attempt in range(attempts):
            for m in self.members:
                self.start_member(m)
            try:
                self.wait_healthy(timeout)
                return self
            except AssertionError:
                if attempt + 1 == attempts or not self._port_was_taken():
                    raise
            self.stop()
            for m in self.members:
                shutil.rmtree(m.data_dir, ignore_errors=True)
                m.client_port, m.peer_port, m.proc = free_port(), free_port(), None
        raise AssertionError("unreachable")

    def _port_was_taken(self) -> bool:
        """Whether a member exited because one of its ports was in use."""
        for m in self.members:
            if m.proc is not None and m.proc.poll() is not None and m.log_path.exists():
                if "address already in use" in m.log_path.read_text(errors="replace"):
                    return True
        return False

    def wait_healthy(self, timeout: float = 60.0, members: list[EtcdMember] | None = None) -> None:
        """Until every (given) running member answers a linearizable read."""
        ctl = str(Path(self.binary).with_name("etcdctl"))
        todo = [m for m in (members or self.members) if m.proc and m.proc.poll() is None]
        deadline = time.monotonic() + timeout
        last = ""
        while todo:
            m = todo[0]
            r = subprocess.run(
                [ctl, "--endpoints", m.endpoint, "--command-timeout=2s", "get", "/health-probe"],
                capture_output=True,
                env=dict(os.environ, ETCDCTL_API="3"),
                timeout=10,
            )
            if r.returncode == 0:
                todo.pop(0)
                continue
            last = r.stderr.decode(errors="replace").strip()
            if m.proc is not None and m.proc.poll() is not None:
                raise AssertionError(f"etcd member {m.name} exited: see {m.log_path}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"etcd member {m.name} not serving after {timeout:.0f}s: {last}"
                )
            time.sleep(0.2)

    def kill(self, i: int) -> None:
        m = self.members[i]
        if m.proc is not None and m.proc.poll() is None:
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(timeout=30)

    def restart(self, i: int, timeout: float = 60.0) -> None:
        self.start_member(self.members[i])
        self.wait_healthy(timeout, [self.members[i]])

    def leader_index(self) -> int:
        """Which member leads etcd's own raft group."""
        ctl = str(Path(self.binary).with_name("etcdctl"))
        live = [m for m in self.members if m.proc and m.proc.poll() is None]
        r = subprocess.run(
            [
                ctl,
                "--endpoints",
                ",".join(m.endpoint for m in live),
                "endpoint",
                "status",
                "-w",
                "json",
            ],
            capture_output=True,
            env=dict(os.environ, ETCDCTL_API="3"),
            timeout=20,
            check=True,
        )
        import json

        for entry in json.loads(r.stdout):
            st = entry["Status"]
            if st["header"]["member_id"] == st["leader"]:
                ep = entry["Endpoint"]
                return next(i for i, m in enumerate(self.members) if ep.endswith(m.endpoint))
        raise AssertionError(f"no etcd leader among {r.stdout!r}")

    def stop(self) -> None:
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.terminate()
        for m in self.members:
            if m.proc is not None:
                try:
                    m.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait(timeout=15)

    def remove_data(self) -> None:
        """Delete the stopped members' data folders (about 60 MiB each, mostly the WAL etcd
        preallocates); their logs stay."""
        for m in self.members:
            assert m.proc is None or m.proc.poll() is not None, f"{m.name} still runs"
            shutil.rmtree(m.data_dir, ignore_errors=True)


def member_args(
    name: str, data_dir: str, client: str, peer: str, initial: str, token: str, log: str
) -> list[str]:
    """The arguments of one etcd member of a new cluster: its name, data folder, client and
    peer ``host:port``, the initial cluster, the cluster token, its log file."""
    return [
        "--name",
        name,
        "--data-dir",
        data_dir,
        "--listen-client-urls",
        f"http://{client}",
        "--advertise-client-urls",
        f"http://{client}",
        "--listen-peer-urls",
        f"http://{peer}",
        "--initial-advertise-peer-urls",
        f"http://{peer}",
        "--initial-cluster",
        initial,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        token,
        # Quick elections on loopback; a loaded machine still keeps up at these values.
        "--heartbeat-interval",
        "100",
        "--election-timeout",
        "1000",
        "--logger",
        "zap",
        "--log-outputs",
        log,
    ]

"""Network namespaces for fault tests: every node in its own namespace, all joined by veth pairs
to one bridge inside a "hub" namespace, on a private /24 that exists only there.

Nothing of the host is touched: the bridge, the veth pairs, the addresses and the firewall rules
all live in namespaces this module creates (named ``txmqn<tag><pid>-<node>``) and deletes at
:meth:`Network.teardown`.  A run that died without tearing down leaves namespaces whose pid is
gone; :func:`remove_leftovers` (called by :meth:`Network.setup`) deletes those.

Faults, all undone by :meth:`Network.heal`:

* :meth:`cut` -- no packet either way between two nodes (iptables DROP in both);
* :meth:`one_way_cut` -- packets from one node to another dropped, the reverse direction kept;
* :meth:`loss` -- a share of the packets from one node to another dropped at random;
* :meth:`netem` -- a node's outgoing traffic delayed, reordered and lost with ``tc netem``;
  on a kernel without netem (``CONFIG_NET_SCH_NETEM`` unset) the delay becomes a slow link
  (``tbf``: queueing delay and drops past a small rate), loss is done with iptables and
  reordering is left out; the returned text says what was applied.

Processes run in a node's namespace through ``ip netns exec`` (:meth:`Network.exec_prefix`);
the calling thread itself can join one with :func:`entered` (``setns``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

NAME_PREFIX = "txmqn"
CLONE_NEWNET = 0x40000000
#: The chain every fault rule goes in (jumped to from INPUT and OUTPUT): heal flushes it.
CHAIN = "TXMQ-FAULT"
#: The bounded wait of every command this module runs.
COMMAND_TIMEOUT = 15.0

_NAME = re.compile(rf"^{NAME_PREFIX}([a-z]+)(\d+)-")


class NetnsError(RuntimeError):
    pass


def run(*args: str, check: bool = True, timeout: float = COMMAND_TIMEOUT) -> str:
    """Run a command; its stdout.  Fails with the command and its stderr."""
    try:
        r = subprocess.run(args, capture_output=True, timeout=timeout, text=True)
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"{' '.join(args)} did not finish in {timeout:.0f}s") from exc
    if check and r.returncode != 0:
        raise NetnsError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None: not root, ``ip`` or ``iptables`` missing,
    or ``ip netns add`` refused (a container without CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2 / iptables) is not installed"
    probe = f"{NAME_PREFIX}probe{os.getpid()}-x"
    try:
        run("ip", "netns", "add", probe)
    except NetnsError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        run("ip", "netns", "exec", probe, "iptables", "-w", "-L", "-n")
    except NetnsError as exc:
        return f"iptables does not work inside a namespace: {exc}"
    finally:
        run("ip", "netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    out = run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _delete_namespace(ns: str) -> None:
    """Kill what still runs in ``ns`` (only processes started in our own namespaces) and delete
    it (its veth ends go with it)."""
    for pid in run("ip", "netns", "pids", ns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    run("ip", "netns", "del", ns, check=False)


def remove_leftovers() -> list[str]:
    """Delete the namespaces of runs whose process is gone; the names removed."""
    gone = []
    for ns in _namespaces():
        m = _NAME.match(ns)
        if m is not None and not _pid_alive(int(m.group(2))):
            _delete_namespace(ns)
            gone.append(ns)
    return gone


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def entered(ns: str) -> Iterator[None]:
    """The calling thread in namespace ``ns`` (sockets it opens, processes it starts), back
    in its own one afterwards."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(f"/run/netns/{ns}")
        try:
            yield
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "could not return to the original namespace")
    finally:
        os.close(home)


@dataclass
class Node:
    name: str
    ns: str
    ip: str


class Network:
    """Namespaces on one bridge.  ``tag`` (lowercase letters) keeps concurrent users apart
    (the partition test and the soak); ``subnet`` is the first three octets of the /24."""

    def __init__(self, tag: str = "t", subnet: str = "10.213.0") -> None:
        if not tag.isalpha() or not tag.islower():
            raise ValueError(f"tag must be lowercase letters, not {tag!r}")
        self.prefix = f"{NAME_PREFIX}{tag}{os.getpid()}-"
        self.hub = self.prefix + "hub"
        self.subnet = subnet
        self.nodes: dict[str, Node] = {}
        self.has_netem = False
        self._next_host = 10
        #: Every fault applied since the last heal, in words (for failure messages).
        self.faults: list[str] = []

    # -- building ---------------------------------------------------------------------------

    def setup(self) -> Network:
        remove_leftovers()
        run("ip", "netns", "add", self.hub)
        run("ip", "-n", self.hub, "link", "set", "lo", "up")
        run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.hub, "link", "set", "br0", "up")
        self.has_netem = (
            subprocess.run(
                ["ip", "netns", "exec", self.hub, "tc", "qdisc", "add", "dev", "lo", "root"]
                + ["netem", "delay", "1ms"],
                capture_output=True,
                timeout=COMMAND_TIMEOUT,
            ).returncode
            == 0
        )
        run("ip", "netns", "exec", self.hub, "tc", "qdisc", "del", "dev", "lo", "root", check=False)
        return self

    def add(self, name: str, host: int | None = None) -> Node:
        """A namespace for ``name`` with ``eth0`` on the bridge at ``<subnet>.<host>``."""
        if name in self.nodes:
            raise ValueError(f"node {name} exists")
        if host is None:
            host = self._next_host
        self._next_host = max(self._next_host, host) + 1
        node = Node(name, self.prefix + name, f"{self.subnet}.{host}")
        veth = f"v-{name}"[:15]
        run("ip", "netns", "add", node.ns)
        self.nodes[name] = node
        run("ip", "-n", self.hub, "link", "add", veth, "type", "veth", "peer", "name", "eth0")
        run("ip", "-n", self.hub, "link", "set", "eth0", "netns", node.ns)
        run("ip", "-n", self.hub, "link", "set", veth, "master", "br0", "up")
        run("ip", "-n", node.ns, "link", "set", "lo", "up")
        run("ip", "-n", node.ns, "addr", "add", f"{node.ip}/24", "dev", "eth0")
        run("ip", "-n", node.ns, "link", "set", "eth0", "up")
        self._ipt(node, "-N", CHAIN)
        self._ipt(node, "-I", "INPUT", "-j", CHAIN)
        self._ipt(node, "-I", "OUTPUT", "-j", CHAIN)
        return node

    def exec_prefix(self, name: str) -> list[str]:
        """The command prefix that runs a program in ``name``'s namespace."""
        return ["ip", "netns", "exec", self.nodes[name].ns]

    def ip(self, name: str) -> str:
        return self.nodes[name].ip

    def teardown(self) -> None:
        """Delete every namespace (and so every veth, rule and qdisc); kills what still runs
        in them.  Each command is bounded."""
        errors = []
        for ns in [node.ns for node in self.nodes.values()] + [self.hub]:
            try:
                _delete_namespace(ns)
            except NetnsError as exc:  # go on with the others; say so at the end
                errors.append(str(exc))
        self.nodes.clear()
        if errors:
            raise NetnsError("teardown incomplete: " + "; ".join(errors))

    # -- faults -----------------------------------------------------------------------------

    def _ipt(self, node: Node, *args: str) -> None:
        run("ip", "netns", "exec", node.ns, "iptables", "-w", *args)

    def cut(self, a: str, b: str) -> None:
        """No packet between ``a`` and ``b``, either way."""
        na, nb = self.nodes[a], self.nodes[b]
        for me, peer in ((na, nb), (nb, na)):
            self._ipt(me, "-A", CHAIN, "-s", peer.ip, "-j", "DROP")
            self._ipt(me, "-A", CHAIN, "-d", peer.ip, "-j", "DROP")
        self.faults.append(f"cut {a} <-> {b}")

    def isolate(self, a: str, others: list[str]) -> None:
        for b in others:
            if b != a:
                self.cut(a, b)

    def one_way_cut(self, src: str, dst: str) -> None:
        """Packets from ``src`` to ``dst`` are dropped (at ``dst``); ``dst`` to ``src`` flows."""
        self._ipt(self.nodes[dst], "-A", CHAIN, "-s", self.nodes[src].ip, "-j", "DROP")
        self.faults.append(f"cut {src} -> {dst}")

    def loss(self, src: str, dst: str, share: float) -> None:
        """A share (0..1) of the packets from ``src`` to ``dst`` dropped at random."""
        self._ipt(
            self.nodes[dst],
            "-A",
            CHAIN,
            "-s",
            self.nodes[src].ip,
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            f"{share:.3f}",
            "-j",
            "DROP",
        )
        self.faults.append(f"loss {share:.0%} {src} -> {dst}")

    def netem(
        self,
        name: str,
        *,
        delay_ms: int = 0,
        jitter_ms: int = 0,
        loss: float = 0.0,
        reorder: float = 0.0,
    ) -> str:
        """Degrade what ``name`` sends (one direction); what was applied, in words."""
        node = self.nodes[name]
        tc = ["ip", "netns", "exec", node.ns, "tc", "qdisc", "replace", "dev", "eth0", "root"]
        if self.has_netem:
            args = ["netem"]
            if delay_ms:
                args += ["delay", f"{delay_ms}ms", f"{jitter_ms}ms"]
                if reorder:
                    args += ["reorder", f"{reorder * 100:.0f}%"]
            if loss:
                args += ["loss", f"{loss * 100:.0f}%"]
            run(*tc, *args)
            what = f"netem {' '.join(args[1:])} on {name}'s egress"
        else:
            parts = []
            if delay_ms:
                # A slow link: past 2 Mbit/s packets queue (up to the delay asked) then drop.
                run(*tc, "tbf", "rate", "2mbit", "burst", "16kb", "latency", f"{delay_ms}ms")
                parts.append(f"slow link (tbf 2mbit, queue up to {delay_ms}ms)")
            if loss:
                self._ipt(
                    node,
                    "-A",
                    CHAIN,
                    "-s",
                    node.ip,
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    f"{loss:.3f}",
                    "-j",
                    "DROP",
                )
                parts.append(f"loss {loss:.0%} (iptables)")
            if reorder:
                parts.append("no reordering (this kernel has no netem)")
            what = f"{', '.join(parts)} on {name}'s egress"
        self.faults.append(what)
        return what

    def heal(self) -> None:
        """Every rule and qdisc gone: the network whole again."""
        for node in self.nodes.values():
            self._ipt(node, "-F", CHAIN)
            run(
                "ip", "netns", "exec", node.ns, "tc", "qdisc", "del", "dev", "eth0", "root",
                check=False,
            )  # fmt: skip
        self.faults.clear()

    def rules(self, name: str) -> str:
        """The fault rules in force on ``name`` (for failure messages and tests)."""
        return run("ip", "netns", "exec", self.nodes[name].ns, "iptables", "-w", "-S", CHAIN)


@contextlib.contextmanager
def network(tag: str = "t", subnet: str = "10.213.0") -> Iterator[Network]:
    """A :class:`Network`, torn down however the block ends."""
    net = Network(tag, subnet)
    try:
        yield net.setup()
    finally:
        net.teardown()

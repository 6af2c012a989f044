"""What a cluster keeps in etcd, and each broker's watched copy of it.

Keys, under ``/txmq/<brokerClusterName>/`` (values are JSON)::

    members/<group>/<replicaId>  {"addr", "haAddr", "replicaId", "group"}  lease: its session
    leader/<group>               {"replicaId", "addr", "haAddr", "grpcAddr", "epoch"}  lease
    epoch/<group>                {"epoch", "replicaId"}   the last election (who won it)
    isr/<group>                  {"epoch", "members": [replicaId...]} written only by the leader
    topics/<group>/<topic>       {"read", "write", "perm", "sysFlag"} the group's queues of a topic
    progress/<group>             {"end", "replicas": {id: offset}, "isr": [...]}  lease: leader
    batches/<group>/<batchKey>   {"commit": [transactionId...]}      a cross-group batch decision
    down/<group>/<replicaId>     {"epoch", "lease"}  lease: its session; this follower's
                                 replication connections to that leader are refused

Only the leader of a group writes ``isr``, ``topics`` and ``progress`` for it, always in an etcd
transaction that compares the leader key it holds, so a deposed leader's writes are refused.
Clients never talk to etcd: every broker answers routes from this copy.

Routes (``routeWriteReplicas``, on by default) also name each follower as a write-only broker
of its own, ``<group>@<replicaId>`` (its address as broker id 0, ``replicaOf`` the group): a
stock producer keeps those queues and, when the leader dies, retries its send on a follower,
which forwards it to whoever leads then (:mod:`.forward`); consumers keep only readable queues
and never see them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from txmq.protocol.topics import AUTO_CREATE_TOPIC_KEY_TOPIC

from .etcd import Entry

#: RocketMQ's PermName write bit: a follower's route entry takes writes and serves no reads.
PERM_WRITE = 0x2
#: Between a group's name and a replica id in the name of that replica's write-only entry.
REPLICA_ENTRY_SEP = "@"


def replica_entry(group: str, replica: int) -> str:
    """The broker name routes give a follower's write-only entry: ``<group>@<replicaId>``."""
    return f"{group}{REPLICA_ENTRY_SEP}{replica}"


def prefix(cluster: str) -> str:
    return f"/txmq/{cluster}/"


class Keys:
    def __init__(self, cluster: str) -> None:
        self.root = prefix(cluster)

    def member(self, group: str, replica: int) -> str:
        return f"{self.root}members/{group}/{replica}"

    def leader(self, group: str) -> str:
        return f"{self.root}leader/{group}"

    def epoch(self, group: str) -> str:
        return f"{self.root}epoch/{group}"

    def isr(self, group: str) -> str:
        return f"{self.root}isr/{group}"

    def topic(self, group: str, topic: str) -> str:
        return f"{self.root}topics/{group}/{topic}"

    def progress(self, group: str) -> str:
        return f"{self.root}progress/{group}"

    def batch(self, group: str, batch_key: str) -> str:
        return f"{self.root}batches/{group}/{batch_key}"

    def down(self, group: str, replica: int) -> str:
        return f"{self.root}down/{group}/{replica}"


@dataclass(frozen=True)
class Leader:
    replica: int
    addr: str
    epoch: int
    lease: int
    #: Where followers replicate from (brokerIP2), ``addr`` when not set.
    ha_addr: str = ""
    #: The leader's RocketMQ 5 gRPC address ("" when it serves none).
    grpc_addr: str = ""


@dataclass(frozen=True)
class Isr:
    epoch: int
    members: tuple[int, ...]
    mod_revision: int


class ClusterView:
    """The watched copy: rebuilt from the whole prefix on every change (it is small)."""

    def __init__(self, cluster: str, *, write_replicas: bool = False) -> None:
        self.keys = Keys(cluster)
        self.cluster = cluster
        #: Routes name each follower as a write-only broker (``routeWriteReplicas``).
        self.write_replicas = write_replicas
        self.table: dict[str, Entry] = {}
        self.changed = asyncio.Event()
        self.revision = 0
        self.loaded = asyncio.Event()

    def update(self, table: dict[str, Entry]) -> None:
        self.table = table
        self.revision += 1
        self.loaded.set()
        self.changed.set()

    def _under(self, kind: str) -> dict[tuple[str, ...], Entry]:
        head = f"{self.keys.root}{kind}/"
        out: dict[tuple[str, ...], Entry] = {}
        for key, entry in self.table.items():
            if key.startswith(head):
                out[tuple(key[len(head) :].split("/"))] = entry
        return out

    def groups(self) -> list[str]:
        names = {k[0] for k in self._under("members")} | {k[0] for k in self._under("leader")}
        names |= {k[0] for k in self._under("topics")}
        return sorted(names)

    def leader(self, group: str) -> Leader | None:
        e = self.table.get(self.keys.leader(group))
        if e is None:
            return None
        v = e.value
        addr = str(v["addr"])
        return Leader(
            int(v["replicaId"]),
            addr,
            int(v["epoch"]),
            e.lease,
            str(v.get("haAddr") or addr),
            str(v.get("grpcAddr") or ""),
        )

    def members(self, group: str) -> dict[int, str]:
        return {
            int(k[1]): str(e.value["addr"])
            for k, e in self._under("members").items()
            if k[0] == group and len(k) == 2
        }

    def obstacles(self, group: str) -> dict[int, str]:
        """Members of ``group`` that say they cannot serve, and why."""
        return {
            int(k[1]): str(e.value["obstacle"])
            for k, e in self._under("members").items()
            if k[0] == group and len(k) == 2 and e.value.get("obstacle")
        }

    def isr(self, group: str) -> Isr | None:
        e = self.table.get(self.keys.isr(group))
        if e is None:
            return None
        return Isr(int(e.value["epoch"]), tuple(int(m) for m in e.value["members"]), e.mod_revision)

    def epoch(self, group: str) -> tuple[int, int]:
        """(last epoch, mod revision of its key; 0 if there never was an election)."""
        e = self.table.get(self.keys.epoch(group))
        if e is None:
            return 0, 0
        return int(e.value["epoch"]), e.mod_revision

    def progress(self, group: str) -> dict[str, Any]:
        e = self.table.get(self.keys.progress(group))
        return dict(e.value) if e is not None else {}

    def down_votes(self, group: str, leader: Leader) -> set[int]:
        """The replicas of ``group`` that find ``leader`` (this epoch, this lease) gone: their
        replication connections to it are refused."""
        return {
            int(k[1])
            for k, e in self._under("down").items()
            if k[0] == group
            and len(k) == 2
            and int(e.value.get("epoch", -1)) == leader.epoch
            and int(e.value.get("lease", -1)) == leader.lease
        }

    def topics(self, group: str) -> dict[str, dict[str, Any]]:
        return {
            k[1]: dict(e.value)
            for k, e in self._under("topics").items()
            if k[0] == group and len(k) == 2
        }

    def batch(self, group: str, batch_key: str) -> dict[str, Any] | None:
        e = self.table.get(self.keys.batch(group, batch_key))
        return dict(e.value) if e is not None else None

    def _addrs(self, group: str) -> tuple[dict[int, str], list[tuple[int, str]]]:
        """The group's broker ids as routes give them (its leader 0, its followers 1, 2, ...
        by replica id) and its followers as ``(replicaId, address)``."""
        addrs: dict[int, str] = {}
        leader = self.leader(group)
        if leader is not None:
            addrs[0] = leader.addr
        followers = [
            (rid, addr)
            for rid, addr in sorted(self.members(group).items())
            if leader is None or rid != leader.replica
        ]
        for n, (_, addr) in enumerate(followers, start=1):
            addrs[n] = addr
        return addrs, followers

    def broker_addrs(self) -> dict[str, dict[int, str]]:
        """Every group with a leader or a member: its broker ids and addresses, as routes
        give them (the leader 0, followers 1, 2, ...)."""
        out = {}
        for group in self.groups():
            addrs, _ = self._addrs(group)
            if addrs:
                out[group] = addrs
        return out

    def topic_names(self, groups: list[str] | None = None) -> set[str]:
        """The topics of ``groups`` (every group when None) as their leaders published them."""
        names: set[str] = set()
        for group in self.groups() if groups is None else groups:
            names.update(self.topics(group))
        return names

    def route(self, topic: str) -> dict[str, Any] | None:
        """RocketMQ's TopicRouteData for ``topic`` over every group that has it: each group's
        queues, and its leader as broker id 0 (followers as 1, 2, ... for information).

        With :attr:`write_replicas`, each follower of a group whose queues take writes is also
        a broker of its own, :func:`replica_entry` ``(group, replica)``, with the group's
        write queues, write permission only (no read queues, but for TBW102's) and the follower's address as
        broker id 0: what stock producers need to send on while the leader is replaced (the
        follower forwards to the leader).  Its broker data says ``replicaOf`` the group, which
        the txmq SDK reads to leave it out."""
        queue_datas: list[dict[str, Any]] = []
        broker_datas: list[dict[str, Any]] = []
        for group in self.groups():
            tc = self.topics(group).get(topic)
            if tc is None:
                continue
            queue_datas.append(
                {
                    "brokerName": group,
                    "readQueueNums": int(tc["read"]),
                    "writeQueueNums": int(tc["write"]),
                    "perm": int(tc["perm"]),
                    "topicSysFlag": int(tc.get("sysFlag", 0)),
                }
            )
            addrs, followers = self._addrs(group)
            broker_datas.append(
                {
                    "cluster": self.cluster,
                    "brokerName": group,
                    "brokerAddrs": {str(n): a for n, a in addrs.items()},
                }
            )
            if not (self.write_replicas and int(tc["perm"]) & PERM_WRITE):
                continue
            # A producer sending to a topic it has no route for yet takes its queues from
            # TBW102's route, counting min(defaultTopicQueueNums, readQueueNums) queues of each
            # writable entry: there a follower's entry has read queues too (perm write-only,
            # so nobody reads them), or the producer would know only the leader's queues and
            # could not retry on a follower until its next route refresh.
            replica_reads = int(tc["write"]) if topic == AUTO_CREATE_TOPIC_KEY_TOPIC else 0
            for rid, addr in followers:
                name = replica_entry(group, rid)
                queue_datas.append(
                    {
                        "brokerName": name,
                        "readQueueNums": replica_reads,
                        "writeQueueNums": int(tc["write"]),
                        "perm": PERM_WRITE,
                        "topicSysFlag": int(tc.get("sysFlag", 0)),
                    }
                )
                broker_datas.append(
                    {
                        "cluster": self.cluster,
                        "brokerName": name,
                        "brokerAddrs": {"0": addr},
                        "replicaOf": group,
                    }
                )
        if not queue_datas:
            return None
        return {
            "orderTopicConf": None,
            "queueDatas": queue_datas,
            "brokerDatas": broker_datas,
            "filterServerTable": {},
        }

    def status(self) -> dict[str, Any]:
        """Everything ``txmq cluster status`` shows."""
        out: dict[str, Any] = {"cluster": self.cluster, "groups": {}}
        for group in self.groups():
            leader = self.leader(group)
            isr = self.isr(group)
            prog = self.progress(group)
            end = int(prog.get("end", 0))
            replicas = {str(k): int(v) for k, v in dict(prog.get("replicas", {})).items()}
            out["groups"][group] = {
                "leader": None
                if leader is None
                else {"replicaId": leader.replica, "addr": leader.addr, "epoch": leader.epoch},
                "epoch": self.epoch(group)[0],
                "members": {str(k): v for k, v in self.members(group).items()},
                "notServing": {str(k): v for k, v in self.obstacles(group).items()},
                "inSync": list(isr.members) if isr is not None else [],
                "leaderEnd": end,
                "lag": {rid: max(0, end - off) for rid, off in replicas.items()},
                "topics": sorted(self.topics(group)),
            }
        return out

"""An operation history and a checker over it, in the style of Jepsen's queue and set checks.

Every client operation is recorded twice: when it is invoked and when it completes, each with
a monotonic time and the process (worker) that ran it.  A completion is

* ``ok`` -- it happened (a send acknowledged, a transaction's decision acknowledged);
* ``fail`` -- it certainly did not happen (refused before anything was stored);
* ``info`` -- unknown (a timeout, a connection lost, a retriable refusal after the leader may
  have stored it): it may or may not have happened.  An invocation never completed counts as
  ``info``.

Operations (``f``) and their values:

* ``send``: the message id (the body carries it);
* ``txn``: ``{"id", "msgs": [message ids], "decision": "commit" | "rollback"}`` -- one
  multi-message transaction; the completion's value, when given, is the final word (a
  transaction whose halves failed is rolled back);
* ``read``: completion value = the message ids a consumer was handed (during the run);
* ``drain``: completion value = every message id read back from the store after heal, with
  repeats (the final read the set checks run on).

:func:`check` finds:

* ``lost`` -- an acknowledged send, or a message of a transaction whose commit was
  acknowledged, missing from the final read;
* ``unexpected`` -- a message read that no operation ever attempted;
* ``failed-delivered`` -- a message read whose send certainly failed;
* ``rolled-back-delivered`` -- a message of a transaction decided rollback (or failed) read;
* ``partial-transaction`` -- some messages of a committed (or unknown) transaction in the
  final read and others not;
* ``read-then-lost`` -- a message a consumer was handed during the run that is not stored after
  heal (it was visible before it was safe: a dirty read);
* ``duplicate`` -- a message stored twice (the final read holds it more than once; a consumer
  handed a message again is at-least-once delivery and only counted);
* ``two-leaders-one-epoch`` -- from the brokers' own ``leading`` log lines: two replicas of a
  group that led in the same epoch.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"

LOST = "lost"
UNEXPECTED = "unexpected"
FAILED_DELIVERED = "failed-delivered"
ROLLED_BACK_DELIVERED = "rolled-back-delivered"
PARTIAL = "partial-transaction"
DUPLICATE = "duplicate"
SPLIT_BRAIN = "two-leaders-one-epoch"
READ_LOST = "read-then-lost"


@dataclass(frozen=True)
class Op:
    index: int
    process: str
    type: str
    f: str
    value: Any
    time: float
    error: str | None = None

    def __str__(self) -> str:
        err = f" ({self.error})" if self.error else ""
        value = self.value
        if isinstance(value, list) and len(value) > 8:
            value = f"[{len(value)} ids: {', '.join(map(str, value[:4]))}, ...]"
        else:
            value = repr(value)
        return f"#{self.index} {self.time:9.3f} {self.process:>7} {self.type:<6} {self.f:<5} {value}{err}"


class History:
    """A list of :class:`Op`, appended from one event loop (no locking)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.ops: list[Op] = []
        self._t0 = clock()

    def _add(self, process: str, type_: str, f: str, value: Any, error: str | None) -> Op:
        op = Op(len(self.ops), process, type_, f, value, self.clock() - self._t0, error)
        self.ops.append(op)
        return op

    def invoke(self, process: str, f: str, value: Any) -> Op:
        return self._add(process, INVOKE, f, value, None)

    def complete(self, inv: Op, type_: str, value: Any = None, error: str | None = None) -> Op:
        if type_ not in (OK, FAIL, INFO):
            raise ValueError(f"not a completion type: {type_}")
        return self._add(inv.process, type_, inv.f, inv.value if value is None else value, error)

    def ok(self, inv: Op, value: Any = None) -> Op:
        return self.complete(inv, OK, value)

    def fail(self, inv: Op, error: str, value: Any = None) -> Op:
        return self.complete(inv, FAIL, value, error)

    def info(self, inv: Op, error: str, value: Any = None) -> Op:
        return self.complete(inv, INFO, value, error)

    def pairs(self) -> list[tuple[Op, Op | None]]:
        """Each invocation with its completion (None when it never completed).  A process runs
        one operation at a time: its next op after an invocation completes it."""
        open_: dict[str, Op] = {}
        out: list[tuple[Op, Op | None]] = []
        at: dict[int, int] = {}
        for op in self.ops:
            if op.type == INVOKE:
                if op.process in open_:
                    raise ValueError(f"process {op.process} invoked {op} before completing")
                open_[op.process] = op
                at[op.index] = len(out)
                out.append((op, None))
            else:
                inv = open_.pop(op.process, None)
                if inv is None:
                    raise ValueError(f"completion without invocation: {op}")
                out[at[inv.index]] = (inv, op)
        return out

    def dump(self, path: Path) -> None:
        with open(path, "w") as f:
            for op in self.ops:
                f.write(json.dumps(asdict(op)) + "\n")

    @classmethod
    def load(cls, path: Path) -> History:
        h = cls()
        h.ops = [Op(**json.loads(line)) for line in Path(path).read_text().splitlines() if line]
        return h


@dataclass
class Anomaly:
    kind: str
    detail: str
    ops: list[Op] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.kind}: {self.detail}"]
        lines += [f"    {op}" for op in self.ops]
        return "\n".join(lines)


@dataclass
class CheckResult:
    anomalies: list[Anomaly]
    stats: dict[str, int]

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def kinds(self) -> set[str]:
        return {a.kind for a in self.anomalies}

    def report(self, limit: int = 20) -> str:
        by_kind = Counter(a.kind for a in self.anomalies)
        head = ", ".join(f"{k}={v}" for k, v in sorted(by_kind.items())) or "none"
        lines = [f"anomalies: {head}; {self.stats}"]
        lines += [str(a) for a in self.anomalies[:limit]]
        if len(self.anomalies) > limit:
            lines.append(f"... and {len(self.anomalies) - limit} more")
        return "\n".join(lines)


def _decision(inv: Op, done: Op | None) -> str:
    value = done.value if done is not None else inv.value
    return str(value.get("decision", "rollback"))


def check(history: History, leader_events: Iterable[dict[str, Any]] = ()) -> CheckResult:
    """Check ``history`` (which must hold a completed ``drain``) and the brokers' ``leading``
    log lines (``{"group", "replica", "epoch", ...}``)."""
    anomalies: list[Anomaly] = []
    sends: dict[str, tuple[Op, Op | None]] = {}
    txns: list[tuple[Op, Op | None]] = []
    owner: dict[str, tuple[Op, Op | None]] = {}  # message id -> the txn op pair holding it
    reads: list[tuple[str, Op]] = []
    drains: list[Op] = []
    for inv, done in history.pairs():
        if inv.f == "send":
            sends[str(inv.value)] = (inv, done)
        elif inv.f == "txn":
            txns.append((inv, done))
            for mid in inv.value["msgs"]:
                owner[str(mid)] = (inv, done)
        elif inv.f == "read" and done is not None and done.type == OK:
            reads += [(str(mid), done) for mid in done.value]
        elif inv.f == "drain" and done is not None and done.type == OK:
            drains.append(done)
    if not drains:
        raise ValueError("the history has no completed drain (the final read after heal)")
    drain = drains[-1]
    stored = Counter(str(mid) for mid in drain.value)
    delivered = reads + [(mid, drain) for mid in stored]

    # Nothing read that was never attempted, certainly failed or rolled back.
    flagged: set[tuple[str, str]] = set()
    for mid, read in delivered:
        if mid in sends:
            inv, done = sends[mid]
            if done is not None and done.type == FAIL and (FAILED_DELIVERED, mid) not in flagged:
                flagged.add((FAILED_DELIVERED, mid))
                anomalies.append(
                    Anomaly(FAILED_DELIVERED, f"{mid} read, its send failed", [inv, done, read])
                )
        elif mid in owner:
            inv, done = owner[mid]
            failed = done is not None and done.type == FAIL
            if (failed or _decision(inv, done) == "rollback") and (
                ROLLED_BACK_DELIVERED,
                mid,
            ) not in flagged:
                flagged.add((ROLLED_BACK_DELIVERED, mid))
                ops = [inv] + ([done] if done is not None else []) + [read]
                anomalies.append(
                    Anomaly(
                        ROLLED_BACK_DELIVERED,
                        f"{mid} of transaction {inv.value['id']} read, the transaction "
                        + ("failed" if failed else "was rolled back"),
                        ops,
                    )
                )
        elif (UNEXPECTED, mid) not in flagged:
            flagged.add((UNEXPECTED, mid))
            anomalies.append(Anomaly(UNEXPECTED, f"{mid} read, never sent", [read]))

    # Acknowledged sends present after heal.
    for mid, (inv, done) in sends.items():
        if done is not None and done.type == OK and mid not in stored:
            anomalies.append(
                Anomaly(LOST, f"{mid} acknowledged, missing after heal", [inv, done, drain])
            )

    # Transactions: committed ones whole, unknown ones whole or absent.
    committed = unknown_committed = 0
    for inv, done in txns:
        msgs = [str(m) for m in inv.value["msgs"]]
        seen = [m for m in msgs if m in stored]
        if _decision(inv, done) != "commit" or (done is not None and done.type == FAIL):
            continue
        if done is not None and done.type == OK:
            committed += 1
            if len(seen) < len(msgs):
                kind = LOST if not seen else PARTIAL
                anomalies.append(
                    Anomaly(
                        kind,
                        f"transaction {inv.value['id']} committed (acknowledged): "
                        f"{len(seen)} of {len(msgs)} messages after heal",
                        [inv, done, drain],
                    )
                )
        else:
            unknown_committed += 1
            if 0 < len(seen) < len(msgs):
                ops = [inv] + ([done] if done is not None else []) + [drain]
                anomalies.append(
                    Anomaly(
                        PARTIAL,
                        f"transaction {inv.value['id']} (commit unknown): "
                        f"{len(seen)} of {len(msgs)} messages after heal",
                        ops,
                    )
                )

    seen_read: set[str] = set()
    for mid, read in reads:
        if mid not in stored and mid not in seen_read:
            seen_read.add(mid)
            kind_ops = [*sends.get(mid, owner.get(mid, (None, None)))]
            ops = [op for op in kind_ops if op is not None] + [read, drain]
            anomalies.append(
                Anomaly(READ_LOST, f"{mid} handed to a consumer, not stored after heal", ops)
            )

    for mid, n in sorted(stored.items()):
        if n > 1:
            anomalies.append(Anomaly(DUPLICATE, f"{mid} stored {n} times", [drain]))

    anomalies += check_epochs(leader_events)

    read_counts = Counter(mid for mid, _ in reads)
    outcomes = Counter((done.type if done is not None else INFO) for _, done in sends.values())
    stats = {
        "sends_ok": outcomes[OK],
        "sends_info": outcomes[INFO],
        "sends_fail": outcomes[FAIL],
        "txns": len(txns),
        "txns_committed_ok": committed,
        "txns_commit_unknown": unknown_committed,
        "stored": sum(stored.values()),
        "consumed": len(reads),
        "redelivered": sum(n - 1 for n in read_counts.values() if n > 1),
    }
    return CheckResult(anomalies, stats)


def check_epochs(leader_events: Iterable[dict[str, Any]]) -> list[Anomaly]:
    """Two replicas of one group leading in one epoch."""
    led: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for ev in leader_events:
        led.setdefault((str(ev["group"]), int(ev["epoch"])), {})[int(ev["replica"])] = ev
    out = []
    for (group, epoch), who in sorted(led.items()):
        if len(who) > 1:
            out.append(
                Anomaly(
                    SPLIT_BRAIN,
                    f"group {group} epoch {epoch} led by replicas {sorted(who)}: "
                    + "; ".join(json.dumps(e, sort_keys=True) for e in who.values()),
                )
            )
    return out


def leader_events(log_lines: Iterable[str], group: str, replica: int) -> list[dict[str, Any]]:
    """The ``leading`` events of one broker's JSON log (each line one event)."""
    out = []
    for line in log_lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") == "leading":
            out.append(
                {
                    "group": doc.get("group", group),
                    "replica": doc.get("replica", replica),
                    "epoch": doc["epoch"],
                    "timestamp": doc.get("timestamp"),
                }
            )
    return out

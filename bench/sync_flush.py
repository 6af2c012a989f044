"""SYNC_FLUSH with sends in flight: rate, fsyncs per 1,000 messages and broker CPU per message,
one or more brokers interleaved round by round.

    python bench/sync_flush.py --rounds 4 \\
        --target base=.venv/bin/python:/path/to/other/checkout \\
        --target new=.venv/bin/python:.

A target is ``NAME=PYTHON[:PYTHONPATH[:KEY=VALUE,...]]`` as in ``broker_cpu.py``.  Each run
starts a fresh SYNC_FLUSH broker on a fresh store (in ``--store-root``, on the disk: not a
tmpfs), drives it with ``throughput.py --producers 1 --inflight N`` and reads the broker's
``txmq_flushes_total`` (commit-log fsyncs) from its metrics port before and after.  Rates on a
shared machine move a lot: compare the ratio of interleaved runs, not single figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator

from _broker import cpu_ticks, emitted, free_port, running
from _scratch import scratch_dir
from broker_cpu import Target, parse_target

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TICKS = os.sysconf("SC_CLK_TCK")


def flushes(metrics_port: int) -> float:
    """The broker's ``txmq_flushes_total``."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("txmq_flushes_total "):
                return float(line.split()[1])
    raise RuntimeError("no txmq_flushes_total in the broker's metrics")


@contextlib.contextmanager
def broker(target: Target, root: str, timeout: float) -> Iterator[tuple[str, int, int]]:
    """A SYNC_FLUSH broker of ``target`` on a fresh store: its address, pid and metrics port."""
    port, mport = free_port(), free_port()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if target.pythonpath:
        env["PYTHONPATH"] = target.pythonpath
    cwd = target.pythonpath or tempfile.gettempdir()
    with scratch_dir("txmq-syncflush-", dir=root) as scratch:  # in root, which stays
        store = str(scratch)
        cmd = [target.python, "-m", "txmq", "broker", "--port", str(port), "--store-dir", store]
        cmd += ["--flush", "SYNC_FLUSH", "--log-level", "WARNING", "--set", f"metricsPort={mport}"]
        for s in target.settings:
            cmd += ["--set", s]
        with running(cmd, port, env=env, cwd=cwd, timeout=timeout, name=target.name) as proc:
            yield f"127.0.0.1:{port}", proc.pid, mport


def measure(target: Target, args: argparse.Namespace) -> dict[str, float]:
    with broker(target, args.store_root, args.timeout) as (address, pid, mport):
        cmd = [sys.executable, os.path.join(HERE, "throughput.py"), "--broker", address]
        cmd += ["--seconds", str(args.seconds), "--topic", "sync-flush"]
        cmd += ["--producers", "1", "--inflight", str(args.inflight)]
        f0, c0 = flushes(mport), cpu_ticks(pid)
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=args.seconds * 10 + args.timeout,
            check=False,
        )
        f1, c1 = flushes(mport), cpu_ticks(pid)
    doc = emitted(out.stdout)
    if doc is None:
        raise RuntimeError(f"{target.name}: throughput.py failed:\n{out.stderr[-2000:]}")
    sent = max(int(doc["sent"]), 1)
    return {
        "sent": sent,
        "rate": float(doc["send_msgs_per_s"]),
        "fsyncs_per_1000": (f1 - f0) * 1000 / sent,
        "us_per_msg": (c1 - c0) / TICKS * 1e6 / sent,
        "p50_ms": float(doc["send_latency_ms"].get("p50", 0.0)),
        "lost": float(doc["lost"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--target", action="append", type=parse_target)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument(
        "--store-root",
        default=tempfile.gettempdir(),
        help="where the stores go (a disk, not a tmpfs: fsyncs are what is measured)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    targets: list[Target] = args.target or [Target("this", sys.executable, ROOT)]
    runs: dict[str, list[dict[str, float]]] = {}
    for rnd in range(1, args.rounds + 1):
        for t in targets:
            r = measure(t, args)
            runs.setdefault(t.name, []).append(r)
            print(
                f"round {rnd} {t.name:8} sent={int(r['sent']):<8} rate={r['rate']:>8.0f}/s "
                f"fsyncs/1000={r['fsyncs_per_1000']:5.2f} broker {r['us_per_msg']:5.1f} µs/msg "
                f"p50 {r['p50_ms']:.1f} ms lost={int(r['lost'])}",
                flush=True,
            )
    print("\nmedians (all runs in brackets):")
    for t in targets:
        rs = runs[t.name]
        for k in ("rate", "fsyncs_per_1000", "us_per_msg"):
            vals = [r[k] for r in rs]
            print(
                f"{t.name:8} {k:16} {statistics.median(vals):10.2f} "
                f"[{' '.join(f'{v:.2f}' for v in vals)}]"
            )
    if len(targets) >= 2:
        a, b = targets[0].name, targets[1].name
        ratios = [y["rate"] / x["rate"] for x, y in zip(runs[a], runs[b], strict=True)]
        print(
            f"rate {b}/{a} per round: {' '.join(f'{q:.2f}' for q in ratios)} "
            f"(median {statistics.median(ratios):.2f})"
        )


if __name__ == "__main__":
    main()

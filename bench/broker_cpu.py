"""Broker CPU per sent message: start one or more brokers, drive each with ``throughput.py`` in
three send modes, and read the broker process's CPU time from /proc around every run.

    python bench/broker_cpu.py                                  # this checkout's broker
    python bench/broker_cpu.py --rounds 3 \\
        --target old=/path/to/other/venv/bin/python \\
        --target new=.venv/bin/python:. \\
        --target nodedup=.venv/bin/python:.:duplicateWindowSeconds=0
    python bench/broker_cpu.py --target compiled=.venv/bin/python:. \\
        --target pure=.venv/bin/python:.:env:TXMQ_PURE_PYTHON=1   # compiled against Python

A target is ``NAME=PYTHON[:PYTHONPATH[:KEY=VALUE,...]]``: the interpreter that runs the broker
(``PYTHON -m txmq broker``), the PYTHONPATH it gets (empty: the interpreter's installed txmq,
started from a neutral folder) and ``--set`` settings (``env:NAME=VALUE``: an environment
variable of the broker instead).  Rounds interleave the targets (A B A B
...) and each mode is measured on a fresh broker and store, so load from elsewhere on the
machine spreads over all targets alike; the summary gives each target's median per mode.

Modes (``throughput.py`` arguments, always one producer):

* ``one``: ``--inflight 1 --no-auto-batch`` (one SEND_MESSAGE at a time)
* ``win``: ``--inflight 1000`` (pipelined; the SDK auto-batches)
* ``batch64``: ``--inflight 4 --batch 64`` (SEND_BATCH_MESSAGE of 64)

The CPU counted is the broker's (utime + stime) over the whole ``throughput.py`` run: the sends
and the drain of the topic that follows them, divided by the messages sent; the broker's start
is not counted.  Linux only (/proc/PID/stat).  The load generator always runs from this checkout with this
interpreter; only the broker differs between targets.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from _broker import cpu_ticks, emitted, free_port, running
from _scratch import scratch_dir

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TICKS = os.sysconf("SC_CLK_TCK")

MODES: dict[str, list[str]] = {
    "one": ["--producers", "1", "--inflight", "1", "--no-auto-batch"],
    "win": ["--producers", "1", "--inflight", "1000"],
    "batch64": ["--producers", "1", "--inflight", "4", "--batch", "64"],
}


@dataclass
class Target:
    name: str
    python: str
    pythonpath: str
    settings: list[str] = field(default_factory=list)


def parse_target(text: str) -> Target:
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"expected NAME=PYTHON[:PYTHONPATH[:K=V,...]]: {text!r}")
    python, _, rest = rest.partition(":")
    pythonpath, _, settings = rest.partition(":")
    return Target(
        name,
        os.path.abspath(python) if os.sep in python else python,
        os.path.abspath(pythonpath) if pythonpath else "",
        [s for s in settings.split(",") if s],
    )


@contextlib.contextmanager
def broker(target: Target, timeout: float) -> Iterator[tuple[str, int]]:
    """A broker of ``target`` on a fresh store: yields its address and pid; stopped at the end
    (SIGTERM, SIGKILL after ``timeout`` seconds)."""
    port = free_port()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if target.pythonpath:
        env["PYTHONPATH"] = target.pythonpath
    cwd = target.pythonpath or tempfile.gettempdir()
    with scratch_dir("txmq-brokercpu-") as scratch:
        store = str(scratch)
        cmd = [target.python, "-m", "txmq", "broker", "--port", str(port), "--store-dir", store]
        cmd += ["--log-level", "WARNING"]
        for s in target.settings:
            if s.startswith("env:"):  # an environment variable of the broker's process
                key, _, value = s[4:].partition("=")
                env[key] = value
            else:
                cmd += ["--set", s]
        with running(cmd, port, env=env, cwd=cwd, timeout=timeout, name=target.name) as proc:
            yield f"127.0.0.1:{port}", proc.pid


def measure(target: Target, mode: str, seconds: float, timeout: float) -> dict[str, float]:
    """One run: messages sent, send rate and broker CPU µs per message."""
    with broker(target, timeout) as (address, pid):
        cmd = [sys.executable, os.path.join(HERE, "throughput.py"), "--broker", address]
        cmd += ["--seconds", str(seconds), "--topic", f"cpu-{mode}", *MODES[mode]]
        c0 = cpu_ticks(pid)
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=seconds * 10 + timeout, check=False
        )
        c1 = cpu_ticks(pid)
    doc = emitted(out.stdout)
    if doc is None:
        raise RuntimeError(f"{target.name} {mode}: throughput.py failed:\n{out.stderr[-2000:]}")
    sent = int(doc["sent"])
    return {
        "sent": sent,
        "rate": float(doc["send_msgs_per_s"]),
        "us_per_msg": (c1 - c0) / TICKS * 1e6 / max(sent, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--target",
        action="append",
        type=parse_target,
        help="NAME=PYTHON[:PYTHONPATH[:KEY=VALUE,...]] (repeat; default: this checkout's "
        "broker with this interpreter)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--seconds", type=float, default=8, help="send time per run (default 8)")
    ap.add_argument(
        "--mode", action="append", choices=list(MODES), help="modes to run (default: all)"
    )
    ap.add_argument("--timeout", type=float, default=30, help="broker start/stop bound, seconds")
    ap.add_argument("--json", action="store_true", help="also print one JSON line of all runs")
    args = ap.parse_args()
    # SIGTERM unwinds like Ctrl-C: the brokers and load generators started here are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    targets: list[Target] = args.target or [Target("this", sys.executable, ROOT)]
    modes: list[str] = args.mode or list(MODES)
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for rnd in range(1, args.rounds + 1):
        for mode in modes:
            for t in targets:
                r = measure(t, mode, args.seconds, args.timeout)
                runs.setdefault((t.name, mode), []).append(r)
                print(
                    f"round {rnd} {t.name:10} {mode:8} sent={r['sent']:<8} "
                    f"rate={r['rate']:>9.0f}/s  broker {r['us_per_msg']:6.1f} µs/msg",
                    flush=True,
                )
    print("\nmedians (all runs in brackets):")
    for mode in modes:
        for t in targets:
            rs = runs[(t.name, mode)]
            us = [r["us_per_msg"] for r in rs]
            rates = [r["rate"] for r in rs]
            print(
                f"{t.name:10} {mode:8} {statistics.median(us):6.1f} µs/msg "
                f"[{' '.join(f'{u:.1f}' for u in us)}]  "
                f"rate {statistics.median(rates):9.0f}/s [{' '.join(f'{x:.0f}' for x in rates)}]"
            )
    if args.json:
        print("JSON " + json.dumps({f"{n} {m}": v for (n, m), v in runs.items()}))


if __name__ == "__main__":
    main()

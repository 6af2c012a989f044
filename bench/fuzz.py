"""Coverage-guided fuzzing of the parsers (atheris, i.e. libFuzzer over instrumented Python).

    python bench/fuzz.py --seconds 180                 # every target, one after another
    python bench/fuzz.py --target frame --seconds 240  # one target
    python bench/fuzz.py --merge                       # minimise the committed corpus

Each target of ``tests/fuzz/targets.py`` runs in its own process with the committed corpus
(``tests/fuzz/corpus/<target>/``) as its seed and as the folder new coverage-increasing inputs
are added to.  Per target it prints the CPU seconds, executions, libFuzzer's coverage figures
(``cov:`` edges and ``ft:`` features), the corpus size and the findings (inputs that broke the
target's contract; libFuzzer writes each to ``--artifacts`` and stops that target).
Only one fuzzer process runs at a time.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
#: Modules instrumented for coverage: the product and the pure-Python parsers it calls.
INSTRUMENTED = ["txmq", "yaml", "lark"]

_STATUS = re.compile(
    r"#(?P<execs>\d+)\s+\w+\s+cov: (?P<cov>\d+) ft: (?P<ft>\d+) corp: (?P<corp>\d+)/"
)
_EXECUTED = re.compile(r"stat::number_of_executed_units: (?P<runs>\d+)")
_ARTIFACT = re.compile(r"Test unit written to (?P<path>\S+)")


@dataclass
class Result:
    target: str
    cpu_s: float
    execs: int
    cov: int
    ft: int
    corpus: int
    findings: list[str]

    def line(self) -> str:
        return (
            f"{self.target:16} cpu {self.cpu_s:7.1f} s  execs {self.execs:9d}  "
            f"cov {self.cov:5d}  ft {self.ft:6d}  corpus {self.corpus:4d}  "
            f"findings {len(self.findings)}" + "".join(f"\n    {f}" for f in self.findings)
        )


def _worker(target: str, libfuzzer_args: list[str]) -> None:
    """Run ``target`` under atheris in this process (libFuzzer parses ``libfuzzer_args``)."""
    import atheris  # type: ignore[import-untyped]

    sys.path.insert(0, ROOT)
    with atheris.instrument_imports(include=INSTRUMENTED):
        from tests.fuzz.targets import TARGETS

    fn = TARGETS[target]
    # libFuzzer runs argv[0] again through the shell for -merge=1: it must be this worker.
    again = shlex.join([sys.executable, os.path.abspath(__file__), "--worker", target, "--"])
    atheris.Setup([again, *libfuzzer_args], fn)
    atheris.Fuzz()


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _run(
    target: str, libfuzzer_args: list[str], log_path: str, cpu_budget: float | None = None
) -> tuple[float, str]:
    """Run one worker to its end, or until it used ``cpu_budget`` CPU seconds; (CPU seconds it
    used, what it wrote)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", target, "--", *libfuzzer_args]
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    cpu = 0.0
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        asked = None
        while proc.poll() is None:
            try:
                cpu = _cpu_of(proc.pid)
            except (OSError, ValueError, IndexError):
                pass  # exiting: /proc has nothing more to say
            if cpu_budget is not None and asked is None and cpu >= cpu_budget:
                proc.send_signal(signal.SIGUSR1)  # libFuzzer's graceful exit, stats printed
                asked = time.monotonic()
            if asked is not None and time.monotonic() - asked > 60:
                proc.kill()
            time.sleep(0.2)
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        return cpu, fh.read()


def fuzz(target: str, args: argparse.Namespace) -> Result:
    corpus = os.path.join(args.corpus, target)
    os.makedirs(corpus, exist_ok=True)
    artifacts = os.path.join(args.artifacts, target) + os.sep
    os.makedirs(artifacts, exist_ok=True)
    log_path = os.path.join(args.artifacts, f"{target}.log")
    cpu, out = _run(
        target,
        [
            corpus,
            # a wall-clock bound too, for a machine so busy that the CPU budget takes ages
            f"-max_total_time={args.seconds * 10}",
            f"-max_len={args.max_len}",
            f"-rss_limit_mb={args.rss_limit_mb}",
            f"-timeout={args.timeout}",
            f"-artifact_prefix={artifacts}",
            "-print_final_stats=1",
        ],
        log_path,
        cpu_budget=args.seconds,
    )
    status = list(_STATUS.finditer(out))
    last = status[-1] if status else None
    done = _EXECUTED.search(out)
    execs = int(done["runs"]) if done else (int(last["execs"]) if last else 0)
    findings = [m["path"] for m in _ARTIFACT.finditer(out)]
    if not done and not findings:
        findings.append(f"the fuzzer ended without finishing: see {log_path}")
    return Result(
        target,
        cpu,
        execs,
        int(last["cov"]) if last else 0,
        int(last["ft"]) if last else 0,
        len(os.listdir(corpus)),
        findings,
    )


def merge(target: str, args: argparse.Namespace) -> tuple[int, int]:
    """Keep only the corpus files that add coverage (libFuzzer's ``-merge=1``); (before,
    after) file counts."""
    corpus = os.path.join(args.corpus, target)
    before = len(os.listdir(corpus))
    with tempfile.TemporaryDirectory(prefix=f"txmq-merge-{target}-") as tmp:
        kept = os.path.join(tmp, "kept")
        os.makedirs(kept)
        _run(
            target,
            ["-merge=1", f"-max_len={args.max_len}", f"-timeout={args.timeout}", kept, corpus],
            os.path.join(tmp, "merge.log"),
        )
        if not os.listdir(kept):
            raise SystemExit(f"{target}: the merge kept nothing; corpus left as it was")
        shutil.rmtree(corpus)
        shutil.copytree(kept, corpus)
    return before, len(os.listdir(corpus))


def main() -> None:
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        rest = sys.argv[i + 2 :]
        _worker(sys.argv[i + 1], rest[1:] if rest[:1] == ["--"] else rest)
        return
    sys.path.insert(0, ROOT)
    from tests.fuzz.targets import TARGETS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", choices=sorted(TARGETS), action="append", help="(repeatable)")
    p.add_argument("--seconds", type=int, default=180, help="CPU seconds per target")
    p.add_argument("--max-len", type=int, default=4096, help="longest input tried (bytes)")
    p.add_argument("--rss-limit-mb", type=int, default=2048)
    p.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    p.add_argument("--corpus", default=CORPUS, help="corpus root (one folder per target)")
    p.add_argument("--artifacts", default=os.path.join(tempfile.gettempdir(), "txmq-fuzz"))
    p.add_argument("--merge", action="store_true", help="minimise the corpus instead of fuzzing")
    args = p.parse_args()
    os.makedirs(args.artifacts, exist_ok=True)
    found = 0
    for target in args.target or list(TARGETS):
        if args.merge:
            before, after = merge(target, args)
            print(f"{target:16} corpus {before} -> {after} files", flush=True)
            continue
        started = time.monotonic()
        r = fuzz(target, args)
        found += len(r.findings)
        print(f"{r.line()}  (wall {time.monotonic() - started:.0f} s)", flush=True)
    if found:
        raise SystemExit(f"{found} finding(s): inputs under {args.artifacts}")


if __name__ == "__main__":
    main()

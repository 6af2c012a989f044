"""A Spark standalone cluster on 127.0.0.1 for the cluster tests: one master and one worker,
started with ``spark-class`` from pyspark's own distribution (``SPARK_HOME`` = the pyspark
package folder), each in a process group of its own so that stopping them also stops the
executors the worker started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support import scratch
from tests.support.ports import free_port

#: Variables of the test process that must not leak into a Spark program it starts (a gateway
#: port would make a driver attach to the test's own JVM).
_SPARK_VARIABLES = ("PYSPARK_", "SPARK_")


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def clean_env(*, home: bool = True, **extra: str) -> dict[str, str]:
    """The test's environment without Spark's variables, plus ``extra``; with ``home``,
    ``SPARK_HOME`` is this pyspark's distribution (without, a pyspark finds its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SPARK_VARIABLES)}
    run_scratch = scratch.root()
    if run_scratch:
        env.update(scratch.jvm_env(run_scratch))
    if home:
        env["SPARK_HOME"] = str(spark_home())
    env.update(SPARK_LOCAL_IP="127.0.0.1", **extra)
    return env


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class Daemon:
    """``spark-class <main class> <args>`` in a process group of its own, its log in a file."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.log = name, log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.name} ended ({self.proc.returncode})\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {text!r} from the {self.name} in {timeout}s\n{self.tail()}")
            time.sleep(0.1)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return self.output()[-4000:]

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the group (the JVM and what it started), then SIGKILL to whatever is
        left of it after ``timeout`` (or at once: executors may outlive the worker)."""
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self._signal(signal.SIGKILL)
        self.proc.wait(10)
        self._out.close()


class StandaloneCluster:
    """A master and one worker (``cores`` cores, ``memory``) on 127.0.0.1."""

    def __init__(self, folder: Path, *, cores: int = 2, memory: str = "2g") -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.cores, self.memory = cores, memory
        self.master: Daemon | None = None
        self.worker: Daemon | None = None

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        env = clean_env()
        deploy = "org.apache.spark.deploy"
        self.master = Daemon(
            "master",
            [f"{deploy}.master.Master", "--host", "127.0.0.1", "--port", str(self.port)]
            + ["--webui-port", str(free_port())],
            self.folder / "master.log",
            env,
        )
        self.master.wait_for("I have been elected leader", timeout)
        work = self.folder / "work"
        work.mkdir(exist_ok=True)
        self.worker = Daemon(
            "worker",
            [f"{deploy}.worker.Worker", "--host", "127.0.0.1", "--cores", str(self.cores)]
            + ["--memory", self.memory, "--webui-port", str(free_port())]
            + ["--work-dir", str(work), self.url],
            self.folder / "worker.log",
            env,
        )
        self.worker.wait_for("Successfully registered with master", timeout)
        return self

    def executors(self) -> list[int]:
        """The pids of the executor JVMs the worker runs now."""
        assert self.worker is not None
        return [
            pid
            for pid in children(self.worker.proc.pid)
            if "CoarseGrainedExecutorBackend" in cmdline(pid)
        ]

    def worker_log(self) -> str:
        return self.worker.output() if self.worker is not None else ""

    def logs(self) -> str:
        return "\n".join(
            f"--- {d.name}\n{d.tail()}" for d in (self.master, self.worker) if d is not None
        )

    def stop(self) -> None:
        for d in (self.worker, self.master):
            if d is not None:
                d.stop()

"""Every fenced block of README.md and docs/*.md, and what runs it.

``blocks()`` extracts the blocks (file, line, language, text); ``CLAIMS`` says, one line per
block, how each is checked.  A block no claim names fails tests/integration/test_docs.py, so a
new block is either run or declared for what it is (sample output, a diagram, a command that
another named test runs).

A claim names its block by the page and the start of the block's first line, so editing the
text above a block does not move its claim.  Kinds:

* ``python``: run as a program (``.venv/bin/python``) against the broker on 127.0.0.1:10911;
  ``after`` names earlier blocks of the same page whose code the block continues (they run
  first, in the same program); ``expect`` is a regular expression the output must match.
* ``shell``: every command line runs as written in bash, placeholders (``<transactionId>``,
  ...) replaced by real ids the runner made; a ``txmq broker`` line starts its broker in a
  network namespace and folder of its own and must answer ``txmq status``; ``mapped`` gives,
  for lines that start a long job elsewhere (``make test``, ``spark-submit``, ...), the existing
  test or CI script that runs the same thing (``Makefile``: ``make run``'s recipe, which is how
  the runner starts its broker).
* ``toml``: loaded with ``load_config``; ``acl``: a YAML ACL file, loaded by the broker's
  loader, then served by a broker configured with the TOML block ``after`` names, and used
  from 127.0.0.1 with one of its accounts.
* ``completion``: shell-completion lines, each script generated and (bash) loaded.
* ``cluster``: docs/cluster.md's quick start, run as written in a namespace of its own.
* ``tree``: a folder listing (two spaces an indent level): every file and folder it names
  exists.
* ``mapped``: the block's code is what the named tests run (``tests``).
* ``output`` / ``diagram``: not run; ``reason`` says why, and ``shape_of`` (output) names the
  block whose command prints it, whose real output must have the same lines.

The runner (``python -m tests.support.docblocks single RUN`` for each of ``RUNS``, or
``... cluster``) is started by the test inside a private network and mount namespace
(``unshare --net --mount``, a tmpfs on /tmp), so the addresses and /tmp paths the docs use are
free whatever else runs on the machine; it prints its results as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/*.md"))]
#: The single-broker blocks run in a few namespaces, each with a broker of its own (so each run
#: stays well inside a test phase's time): the pages named here, then every other page.
RUNS: dict[str, tuple[str, ...]] = {
    "readme": ("README.md",),
    "guides": ("docs/sdk.md", "docs/transactions.md"),
    "rest": (),
}
RESULT_MARK = "DOCBLOCKS-RESULTS "
BLOCK_TIMEOUT = 60.0
BROKER = "127.0.0.1:10911"


@dataclass(frozen=True)
class Block:
    path: str
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def first(self) -> str:
        return next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "")


@dataclass(frozen=True)
class Claim:
    path: str
    starts: str  # the block's first non-blank line starts with this
    kind: str
    after: tuple[str, ...] = ()  # starts of earlier blocks of the same page
    expect: str = ""
    mapped: dict[str, str] = field(default_factory=dict)  # line prefix -> test or CI script
    tests: tuple[str, ...] = ()
    reason: str = ""
    shape_of: str = ""
    timeout: float = 0.0  # a python block's own time limit (s); 0: BLOCK_TIMEOUT

    def matches(self, block: Block) -> bool:
        """``starts`` begins the block's first non-blank line (or, over several lines, its
        text)."""
        return block.path == self.path and (
            block.first.startswith(self.starts) or block.text.lstrip("\n").startswith(self.starts)
        )


SPARK = "tests/spark/test_spark_sink.py::"
PIPELINE = SPARK + "test_example_pipeline_bills_every_order_exactly_once"
SPARK_CLUSTER = (
    "tests/spark/test_spark_cluster.py::"
    "test_pipeline_submitted_to_a_standalone_cluster_survives_an_executor_kill_exactly_once"
)
FRESH_CLONE = ".ci/run"  # CI's entry point: a fresh clone, `make test` (its venv: pip install -e)
CONSOLE = (
    "tests/integration/test_console.py::"
    "test_every_page_shows_the_broker_and_an_operator_commits_a_hanging_transaction"
)
CONSOLE_ACL = (
    "tests/integration/test_console.py::"
    "test_with_the_acl_on_a_read_only_account_sees_the_pages_but_cannot_commit"
)
CONSOLE_USERS = (
    "tests/integration/test_console_browser_users.py::"
    "test_users_roles_https_charts_dead_letters_reset_search_and_trace"
)
CONSOLE_ADD_USER = (
    "tests/client/test_console_users.py::"
    "test_the_add_user_command_takes_the_password_from_the_environment"
)
NO_SPARK_HERE = "needs Spark (a JVM); the named Spark tests run the same calls"

# fmt: off
CLAIMS: list[Claim] = [
    # README.md
    Claim("README.md", "make run", "shell", mapped={
        "make run": "Makefile",  # its recipe is how the runner starts the broker
        "make test": FRESH_CLONE}),
    Claim("README.md", ".venv/bin/txmq send orders", "shell"),
    Claim("README.md", "import json\nimport sqlite3", "python", expect=r"COMMIT_MESSAGE \S+"),
    Claim("README.md", "import asyncio\n\nfrom txmq.client import AsyncTransactionProducer", "python", expect=r"committed 2"),
    Claim("README.md", "import threading\n\nfrom txmq.client import Producer, PushConsumer", "python", expect=r"^b'.*order-1"),
    Claim("README.md", "txmq broker", "shell"),
    Claim("README.md", "txmq status", "shell"),
    Claim("README.md", "from txmq.spark_connector import register", "mapped",
          tests=(SPARK + "test_stream_sink_delivers_every_row_exactly_once",),
          reason=NO_SPARK_HERE),
    Claim("README.md", "spark-submit --master 'local[*]'", "shell", mapped={
        "spark-submit --master 'local[*]'": PIPELINE,
        "PYTHONPATH=build/txmq-pyfiles.zip spark-submit": SPARK_CLUSTER}),
    # docs/architecture.md
    Claim("docs/architecture.md", "broker/", "tree", reason="the broker's folders"),
    Claim("docs/architecture.md", "SEND_MESSAGE(_V2)  processors/send.py", "diagram",
          reason="the calls a send makes; tests/broker/test_send_paths.py counts each path"),
    Claim("docs/architecture.md", "txmq/cli/", "tree", reason="the command line's modules"),
    # docs/cluster.md
    Claim("docs/cluster.md", "# three etcd members", "cluster"),
    Claim("docs/cluster.md", "cluster DefaultCluster", "output",
          reason="txmq cluster status", shape_of="# three etcd members"),
    # docs/compatibility.md
    Claim("docs/compatibility.md", "$ txmq trace ", "output",
          reason="a timeline txmq trace printed; tests/broker/test_trace.py checks real ones"),
    # docs/fuzzing.md
    Claim("docs/fuzzing.md", "PYTHONPATH=. .venv/bin/python bench/fuzz.py --target", "mapped",
          tests=("tests/fuzz/test_corpus_replay.py",),
          reason="a fuzzing campaign of minutes per target; CI replays what it found"),
    Claim("docs/fuzzing.md", "sql_filter       cpu", "output", reason="what bench/fuzz.py prints"),
    Claim("docs/fuzzing.md", "PYTHONPATH=. .venv/bin/python bench/fuzz.py --merge", "mapped",
          tests=("tests/fuzz/test_corpus_replay.py",),
          reason="rewrites the committed corpus; CI replays it"),
    # docs/console.md
    Claim("docs/console.md", "txmq console --broker 127.0.0.1:10911", "mapped",
          tests=(CONSOLE,), reason="a web server that runs until stopped"),
    Claim("docs/console.md", "TXMQ_SECRET_KEY=... txmq --access-key", "mapped",
          tests=(CONSOLE_ACL, "tests/spark/test_spark_tls.py::"
                 "test_sink_and_source_over_mutual_tls_deliver_every_row_exactly_once"),
          reason="a web server that runs until stopped, against an ACL or TLS broker"),
    Claim("docs/console.md", "txmq console add-user console-users.yml alice", "mapped",
          tests=(CONSOLE_ADD_USER, CONSOLE_USERS),
          reason="asks for a password, then a web server that runs until stopped, over HTTPS"),
    Claim("docs/console.md", "users:", "mapped",
          tests=(CONSOLE_ADD_USER, "tests/client/test_console_users.py::"
                 "test_add_user_writes_a_private_file_and_replaces_an_entry"),
          reason="the shape of the file add-user writes (a hash is random)"),
    # docs/operations.md
    Claim("docs/operations.md", "txmq group list", "shell"),
    Claim("docs/operations.md", "txmq topic update orders --perm r", "shell"),
    Claim("docs/operations.md", 'eval "$(_TXMQ_COMPLETE=bash_source txmq)"', "completion"),
    Claim("docs/operations.md", "config_key_renamed key=batchFastPathEnable", "mapped",
          tests=("tests/broker/test_send_paths.py::"
                 "test_the_old_switch_name_is_read_with_a_warning",),
          reason="the log line of the old switch name, which the test reads"),
    # docs/performance.md
    Claim("docs/performance.md", "python bench/broker_cpu.py", "output",
          reason="a benchmark command (minutes of CPU; benchmarks are not run by tests)"),
    # docs/protocol.md
    Claim("docs/protocol.md", "+----------------+", "diagram", reason="frame layout"),
    Claim("docs/protocol.md", "00000052 0200004c", "diagram", reason="an annotated hex dump"),
    Claim("docs/protocol.md", '{"code":10,"language":"PYTHON"', "diagram",
          reason="a JSON header, as in the hex dump above"),
    Claim("docs/protocol.md", "00000035 0100002f", "diagram", reason="an annotated hex dump"),
    # docs/sdk.md
    Claim("docs/sdk.md", 'import asyncio\n\nfrom txmq.client import AsyncTransactionProducer, Message, '
          "RollbackOnCheck\n\nSEEDS", "mapped",
          tests=("tests/cluster/test_cluster_xgroup_txn.py::"
                 "test_commit_rollback_and_check_back_across_groups",),
          reason="needs a cluster of two broker groups and etcd"),
    Claim("docs/sdk.md", "from txmq.client import Producer, Message", "python",
          expect=r"SendStatus.SEND_OK"),
    Claim("docs/sdk.md", "from txmq.client import Message, Producer\n\nwith Producer(", "python",
          expect=r"^100 sent$"),
    Claim("docs/sdk.md", "import time\n\nfrom txmq.client import PushConsumer\n", "python", expect=r"b'order-1' created order-1"),
    Claim("docs/sdk.md", "from txmq.client import PullConsumer, PushConsumer, sql", "python",
          after=("import time\n\nfrom txmq.client import PushConsumer\n",), expect=r"PullStatus\.\w+"),
    Claim("docs/sdk.md", "import threading\n\nfrom txmq.client import Message, OrderlyPushConsumer", "python", expect=r"b'\+10'"),
    Claim("docs/sdk.md", "screens = PushConsumer(", "python", after=("import time\n\nfrom txmq.client import PushConsumer\n",)),
    Claim("docs/sdk.md", "import asyncio\n\nfrom txmq.client import (\n    AsyncOrderlyPushConsumer", "python", expect=r"^transformed b'order-1'$"),
    Claim("docs/sdk.md", "from txmq.client import Message, Producer, SimpleConsumer", "python",
          expect=r"^got b'invoice-1'$"),
    Claim("docs/sdk.md", "import asyncio\n\nfrom txmq.client import AsyncProducer, AsyncStreamConsumer",
          "python", expect=r"^shipped b'shipment-1'$"),
    Claim("docs/sdk.md", "import time\n\nfrom txmq.client import ConnectionState, PushConsumer",
          "python", expect=r"^took \[[0-9, ]*\]$"),
    Claim("docs/sdk.md", "from txmq.client import AdminClient", "python", expect=r"^5$"),
    Claim("docs/sdk.md", "import asyncio\nimport sqlite3\n\nfrom txmq.client import (", "python",
          expect=r"^still prepared: \[\]$"),
    Claim("docs/sdk.md", "import logging\n\nlogging.basicConfig", "python"),
    Claim("docs/sdk.md", "from opentelemetry.sdk.trace import TracerProvider", "python",
          expect=r"^send orders rocketmq$"),
    # docs/security.md
    Claim("docs/security.md", '[operations]\n"tls.server.mode"', "toml"),
    Claim("docs/security.md", "[operations]\naclEnable", "toml"),
    Claim("docs/security.md", "txmq broker --set tls.server.mode=enforcing", "shell"),
    Claim("docs/security.md", "# Peers at these addresses", "acl", after=("[operations]\naclEnable",)),
    Claim("docs/security.md", "[operations]\nauthenticationEnabled", "toml"),
    Claim("docs/security.md", "export TXMQ_ACCESS_KEY=admin", "mapped",
          tests=("tests/broker/test_acl2_cli.py::test_cli_manages_users_and_policies",),
          reason="needs a broker with ACL 2.0 on and its initial user"),
    # docs/spark.md
    Claim("docs/spark.md", "git clone <the txmq repository>", "shell", mapped={
        "git clone": FRESH_CLONE, "python3 -m venv": FRESH_CLONE, "pip install -e": FRESH_CLONE,
        "make wheel": SPARK_CLUSTER, "pip install 'dist/": SPARK_CLUSTER}),
    Claim("docs/spark.md", "from pyspark.sql import SparkSession", "python",
          expect=r"^\|\s*(\d{3,})\|\s*\1\|\n(.*\n)*\|\s*hello\s*\|", timeout=300.0),  # a JVM, a streaming query of 500 rows
    Claim("docs/spark.md", "make run", "shell", mapped={
        "make run": "Makefile", "python examples/pipeline.py": PIPELINE}),
    Claim("docs/spark.md", "tls = {", "mapped", tests=(
        "tests/spark/test_spark_tls.py::"
        "test_sink_and_source_over_mutual_tls_deliver_every_row_exactly_once",), reason=NO_SPARK_HERE),
    Claim("docs/spark.md", "from txmq.spark_connector.options import offsets_behind", "mapped",
          tests=("tests/spark/test_spark_source_options.py::"
                 "test_query_progress_shows_offsets_behind_latest",), reason=NO_SPARK_HERE),
    Claim("docs/spark.md", "pip install -e '.[spark]'", "shell", mapped={
        "pip install -e": FRESH_CLONE, "spark-submit": PIPELINE}),
    Claim("docs/spark.md", "make wheel", "shell", mapped={
        "make wheel": SPARK_CLUSTER, "rm -rf build/pyfiles": SPARK_CLUSTER,
        "pip install --no-deps": SPARK_CLUSTER, "(cd build/pyfiles": SPARK_CLUSTER,
        "cd build": SPARK_CLUSTER, "PYTHONPATH=$PWD/txmq-pyfiles.zip": SPARK_CLUSTER}),
    Claim("docs/spark.md", "from txmq.spark_connector import txmq_foreach_batch", "mapped",
          tests=(SPARK + "test_foreach_batch_helper_is_exactly_once",
                 "tests/spark/test_spark35.py::"
                 "test_foreach_batch_helper_under_pyspark_35_is_exactly_once_with_a_replayed_batch"),
          reason=NO_SPARK_HERE),
    # docs/transactions.md
    Claim("docs/transactions.md", "PENDING --commit--> COMMITTED", "diagram",
          reason="the transaction states"),
    Claim("docs/transactions.md", "import asyncio\n\nfrom txmq.client import AsyncOrderlyPushConsumer", "python",
          expect=r"transformed b'order-1 created'"),
    Claim("docs/transactions.md", "$ python bench/pending_halves.py", "output",
          reason="a benchmark's output (an hour of a million transactions)"),
]
# fmt: on

#: Kinds the runner executes (the rest are checked by the test itself).
RUN_KINDS = {"python", "shell", "toml", "acl", "completion"}


def blocks(root: Path = ROOT) -> list[Block]:
    out = []
    for page in PAGES:
        lines = (root / page).read_text(encoding="utf-8").split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", lines[i])
            if not m:
                i += 1
                continue
            fence, lang, start = m.group(1), m.group(2), i
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                i += 1
            out.append(Block(page, start + 1, lang, "\n".join(lines[start + 1 : i]) + "\n"))
            i += 1
    return out


def claim_for(block: Block) -> list[Claim]:
    return [c for c in CLAIMS if c.matches(block)]


def how_to_claim(block: Block) -> str:
    return (
        f"{block.where}: the ```{block.lang or ''} block starting {block.first[:60]!r} is run by "
        f"nothing: add a line to CLAIMS in tests/support/docblocks.py, e.g. "
        f'Claim("{block.path}", {block.first[:40]!r}, "python") to run it, or kind '
        f'"output"/"diagram" with a reason, or "mapped" with the tests that run it'
    )


def earlier(block: Block, starts: str, all_blocks: list[Block]) -> Block:
    found = [
        b
        for b in all_blocks
        if b.path == block.path
        and b.line < block.line
        and (b.text.lstrip("\n").startswith(starts) or b.first.startswith(starts))
    ]
    if not found:
        raise LookupError(f"{block.where}: no earlier block of {block.path} starts {starts!r}")
    return found[-1]


def tree_paths(text: str) -> list[str]:
    """The paths a folder listing names: ``name`` at two spaces an indent level, a description
    after it; lines that continue a description (indented further, no ``/`` or ``.py``) are
    skipped."""
    stack: list[str] = []
    out = []
    for line in text.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m or not re.search(r"/$|\.\w+$", m.group(2)):
            continue
        level = len(m.group(1)) // 2
        stack[level:] = [m.group(2).rstrip("/")]
        out.append("/".join(stack))
    return out


def mapped_target_exists(target: str) -> str | None:
    """None when ``target`` (``path::test``, or a file) exists, else why not."""
    path, _, name = target.partition("::")
    file = ROOT / path
    if not file.is_file():
        return f"{path} does not exist"
    if name and not re.search(rf"^(async )?def {re.escape(name)}\(", file.read_text(), re.M):
        return f"{path} has no test {name}"
    return None


def logical_lines(text: str) -> list[str]:
    """Command lines with their continuations joined; comments and blanks dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        if not cur and (not raw.strip() or raw.strip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        out.append((cur + raw).strip())
        cur = ""
    return out


def code_of(line: str) -> str:
    """A command line without its trailing comment."""
    return re.split(r"\s+#\s", line, maxsplit=1)[0].strip()


# --- the runner (inside the namespace) ----------------------------------------------------------


class Runner:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.procs: list[subprocess.Popen[bytes]] = []
        self.placeholders: dict[str, str] = {}
        venv_bin = str(ROOT / ".venv" / "bin")
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith("TXMQ_") and k != "PYTHONPATH"
        }
        self.env.update(
            PYTHONPATH=str(ROOT),
            PATH=f"{venv_bin}:{self.env.get('PATH', '/usr/bin:/bin')}",
            HOME=str(scratch / "home"),
            PYTHONUNBUFFERED="1",
        )
        (scratch / "home").mkdir()
        for name in (".venv", "build", "examples"):
            (scratch / name).symlink_to(ROOT / name)
        (scratch / "config").mkdir()
        (scratch / "config" / "broker.toml").write_text((ROOT / "config/broker.toml").read_text())

    def spawn(
        self, argv: list[str] | str, cwd: Path, log: Path, **kw: Any
    ) -> subprocess.Popen[bytes]:
        fh = open(log, "wb")  # noqa: SIM115 - the child writes it
        p = subprocess.Popen(
            argv,
            cwd=cwd,
            env=kw.pop("env", self.env),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kw,
        )
        fh.close()
        self.procs.append(p)
        return p

    def run(
        self,
        argv: list[str] | str,
        *,
        cwd: Path | None = None,
        timeout: float = BLOCK_TIMEOUT,
        stdin: str = "",
        env: dict[str, str] | None = None,
        shell: bool = False,
    ) -> tuple[int, str]:
        p = subprocess.Popen(
            argv,
            cwd=cwd or self.scratch,
            env=env or self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            shell=shell,
            executable="/bin/bash" if shell else None,
        )
        try:
            out, _ = p.communicate(stdin.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(p)
            out, _ = p.communicate()
            return -1, out.decode(errors="replace") + f"\n(timed out after {timeout:.0f} s)"
        kill_group(p)  # what it left running in the background
        return p.returncode, out.decode(errors="replace")

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            kill_group(p)

    # --- the broker, as `make run` starts it -------------------------------------------------

    def start_broker(self, cwd: Path, extra: list[str] | None = None, port: int = 10911) -> None:
        argv = shlex.split(make_recipe("run").replace("$(VENV)", ".venv")) + (extra or [])
        p = self.spawn(argv, cwd, cwd / "broker.log")
        wait_port(port, p, cwd / "broker.log")

    def make_placeholders(self) -> None:
        """Real values for the placeholders of the docs' commands."""
        self.placeholders = asyncio.run(_placeholders())


def make_recipe(target: str) -> str:
    """The command of ``target``'s recipe: its last command line, outside the conditional
    parts (``ifeq ... endif``, for ``TXMQ_COMPILE=1``) a plain run does not take."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"{target}:")), None)
    if start is None:
        raise LookupError(f"the Makefile has no target {target}")
    commands: list[str] = []
    conditional = False
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        if line.startswith(("ifeq", "ifneq", "ifdef", "ifndef")):
            conditional = True
        elif line.startswith("endif"):
            conditional = False
        elif line.startswith("\t") and not conditional:
            commands.append(line.strip())
    if not commands:
        raise LookupError(f"the Makefile has no recipe for {target}")
    return commands[-1]


def make_install() -> str:
    """What the Makefile's virtualenv set-up runs (every target that needs .venv depends on it)."""
    m = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    return m.group(1) if m else ""


def kill_group(p: subprocess.Popen[Any]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(wait)
            if sig == signal.SIGTERM:
                # the leader is gone; what it left in its group gets the same signal
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        except subprocess.TimeoutExpired:
            continue


def wait_port(port: int, proc: subprocess.Popen[Any], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"exited with {proc.returncode} before listening:\n{log.read_text()}"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listens on port {port} after {timeout:.0f} s:\n{log.read_text()}")


async def _placeholders() -> dict[str, str]:
    from tests.support.raw import RawClient, connected
    from txmq.client import AsyncPullConsumer
    from txmq.client.dlq import read_dlq
    from txmq.protocol.codes import RequestCode, ResponseCode
    from txmq.protocol.headers import ConsumerSendMsgBackRequestHeader

    async with connected(BROKER) as raw:
        # Two halves nobody decides: for `txn commit <transactionId>` and `txn resume <msgId>`.
        halves = [
            RawClient.send_header(
                await raw.send("orders", f"h{i}".encode(), group="docs-tx", transactional=True)
            )
            for i in range(2)
        ]
        # The group the docs' commands show: it consumed an order and left.
        RawClient.send_header(await raw.send("orders", b"order-0", queue_id=0))
        # A message billing gave up on, for `dlq resend billing --id ...`.
        RawClient.send_header(await raw.send("invoices", b"invoice 7", queue_id=0))
        _, msgs = await raw.pull("invoices", 0, 0)
        header = ConsumerSendMsgBackRequestHeader(
            offset=msgs[-1].commit_log_offset,
            group="billing",
            origin_msg_id=msgs[-1].msg_id,
            origin_topic="invoices",
            max_reconsume_times=0,
        )
        resp = await raw.call(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext_fields())
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    async with AsyncPullConsumer("billing", broker=BROKER) as billing:
        await billing.commit_offset("orders", 0, 1)
    dead = await read_dlq("billing", BROKER)
    assert dead, "no dead-lettered message for billing"
    return {
        "<transactionId>": str(halves[0].transaction_id),
        "<msgId>": str(halves[1].transaction_id),
        "7F000001...": dead[-1].msg_id,
    }


# --- handlers -----------------------------------------------------------------------------------

Result = dict[str, Any]


def handle(runner: Runner, block: Block, claim: Claim, every: list[Block]) -> Result:
    handlers: dict[str, Callable[[Runner, Block, Claim, list[Block]], Result]] = {
        "python": run_python,
        "shell": run_shell,
        "toml": run_toml,
        "acl": run_acl,
        "completion": run_completion,
    }
    return handlers[claim.kind](runner, block, claim, every)


def run_python(runner: Runner, block: Block, claim: Claim, every: list[Block]) -> Result:
    parts = [earlier(block, s, every) for s in claim.after] + [block]
    program = "\n".join(b.text for b in parts)
    file = runner.scratch / "programs" / f"{block.path.replace('/', '_')}_{block.line}.py"
    file.parent.mkdir(exist_ok=True)
    file.write_text(program)
    rc, out = runner.run([".venv/bin/python", str(file)], timeout=claim.timeout or BLOCK_TIMEOUT)
    ok = rc == 0 and (not claim.expect or re.search(claim.expect, out, re.M) is not None)
    joined = " + ".join(b.where for b in parts)
    return {
        "ok": ok,
        "detail": f"ran {joined}: exit {rc}"
        + ("" if ok or rc else f", no match for {claim.expect!r}")
        + f"\n{out}",
    }


def run_shell(runner: Runner, block: Block, claim: Claim, every: list[Block]) -> Result:
    lines, log = logical_lines(block.text), []
    ok = True
    for line in lines:
        code = code_of(line)
        prefix = next((p for p in claim.mapped if code.startswith(p)), None)
        if prefix is not None:
            log.append(f"mapped: {code}  ->  {claim.mapped[prefix]}")
            continue
        if not re.search(r"(^|\s|/)txmq(\s|$)", code):
            ok = False
            log.append(f"NOT RUN (neither a txmq command nor mapped): {code}")
            continue
        for placeholder, value in runner.placeholders.items():
            code = code.replace(placeholder, value)
        if re.search(r"(^|\s|/)txmq broker(\s|$)", code):
            rc, out = run_broker_line(runner, code)
            log.append(f"$ {code}\n(exit {rc})\n{out}")
            ok = ok and rc == 0
            continue
        rc, out = runner.run(code, shell=True, stdin="y\n")
        log.append(f"$ {code}\n(exit {rc})\n{out}")
        ok = ok and rc == 0
    return {"ok": ok, "detail": "\n".join(log)}


def run_broker_line(runner: Runner, code: str) -> tuple[int, str]:
    """A line that starts a broker, run as written in a network namespace of its own (the
    run's broker holds 127.0.0.1:10911 in this one), until `txmq status` gets an answer from
    the address it serves (TLS when the line turns it on, with a CA that signed the broker's
    certificate, made in the scratch folder); then stopped with SIGTERM.  A line that only
    prints its configuration, or whose store is outside the scratch folder, is run with
    ``--print-config`` (it parses and resolves the configuration)."""
    if "--print-config" in code or re.search(r"--store-dir\s+/", code):
        return runner.run(
            code + (" --print-config" if "--print-config" not in code else ""), shell=True
        )
    cwd = Path(tempfile.mkdtemp(prefix="broker-line-", dir=runner.scratch))  # a store of its own
    (cwd / "config").mkdir()
    (cwd / "config" / "broker.toml").write_text((ROOT / "config/broker.toml").read_text())
    port = re.search(r"TXMQ_LISTEN_PORT=(\d+)", code)
    address = f"127.0.0.1:{port.group(1) if port else 10911}"
    status = f"txmq status -b {address}"
    if "tls.server.mode=enforcing" in code:
        from tests.support.certs import make_certs

        certs = make_certs(runner.scratch / "tls")
        for name, src in (("broker.pem", certs.server_cert), ("broker.key", certs.server_key)):
            (cwd / name).write_bytes(src.read_bytes())
        status = f"txmq --tls-ca {certs.ca} status -b {address}"
    script = f"""set -u
ip link set lo up
{code} > broker-line.log 2>&1 &
broker=$!
for i in $(seq 150); do
  if out=$({status} 2>&1); then echo "$out"; kill -TERM $broker; wait $broker; exit $?; fi
  kill -0 $broker 2>/dev/null || break
  sleep 0.2
done
echo "no answer from {address}: $out"; cat broker-line.log; kill -KILL $broker; exit 1
"""
    return runner.run(["unshare", "--net", "--", "bash", "-c", script], cwd=cwd)


def run_toml(runner: Runner, block: Block, claim: Claim, every: list[Block]) -> Result:
    from txmq.broker.config import load_config

    file = runner.scratch / f"toml-{block.line}.toml"
    file.write_text(block.text)
    config = load_config(file, env={})
    return {"ok": True, "detail": f"loaded: {config!r}"[:2000]}


def run_acl(runner: Runner, block: Block, claim: Claim, every: list[Block]) -> Result:
    """The sample ACL: loaded by the broker's loader, every account usable from 127.0.0.1, and
    a broker configured as the TOML block says refuses to start without it (saying so, without a
    traceback), then serves the sample's admin account from 127.0.0.1."""
    from txmq.broker.acl import AclManager, load_acl_file

    toml = earlier(block, claim.after[0], every)
    folder = runner.scratch / "acl"
    (folder / "config").mkdir(parents=True)
    (folder / "broker.toml").write_text(toml.text)
    log, ok = [], True
    broker = [".venv/bin/txmq", "broker", "--config", "broker.toml", "--store-dir", "data"]
    broker += ["--port", "10919"]
    (folder / ".venv").symlink_to(ROOT / ".venv")
    rc, out = runner.run(broker, cwd=folder, timeout=30)
    if rc == 0 or "Traceback" in out or "plain_acl.yml" not in out:
        ok = False
        log.append(f"without the ACL file the broker should refuse to start, naming it:\n{out}")
    acl_file = folder / "config" / "plain_acl.yml"
    acl_file.write_text(block.text)
    config = load_acl_file(str(acl_file))
    manager = AclManager(str(acl_file))
    manager.install(config)
    for ak in config.accounts:
        try:
            manager.authenticate("127.0.0.1", ak, lambda account: True, "a request", {})
        except Exception as exc:
            ok = False
            log.append(f"account {ak} cannot be used from 127.0.0.1: {exc}")
    p = runner.spawn(broker, folder, folder / "broker.log")
    wait_port(10919, p, folder / "broker.log")
    admins = [a for a in config.accounts.values() if a.admin]
    env = dict(runner.env, TXMQ_SECRET_KEY=admins[0].secret_key)
    status = [
        ".venv/bin/txmq",
        "--access-key",
        admins[0].access_key,
        "status",
        "-b",
        "127.0.0.1:10919",
    ]
    rc, out = runner.run(status, cwd=folder, env=env)
    log.append(f"status as {admins[0].access_key}: exit {rc}\n{out}")
    ok = ok and rc == 0
    rc, out = runner.run([status[0], *status[3:]], cwd=folder)
    log.append(f"status without an account: exit {rc}\n{out}")
    ok = ok and rc != 0
    # A read-only account the sample grants txmq-cli-peek peeks (the text says it can).
    readers = [
        a
        for a in config.accounts.values()
        if not a.admin and "txmq-cli-peek" in a.group_perms and a.topic_perms
    ]
    if not readers:
        ok = False
        log.append("no account of the sample may peek (SUB on txmq-cli-peek)")
    for reader in readers[:1]:
        topic = sorted(reader.topic_perms)[0]
        send = [status[0], "--access-key", admins[0].access_key, "send", topic, "peeked"]
        rc, out = runner.run([*send, "-b", "127.0.0.1:10919"], cwd=folder, env=env)
        log.append(f"send to {topic} as {admins[0].access_key}: exit {rc}\n{out}")
        ok = ok and rc == 0
        peek = [status[0], "--access-key", reader.access_key, "consume", topic, "--count", "1"]
        peek += ["--timeout", "20", "-b", "127.0.0.1:10919"]
        rc, out = runner.run(
            peek, cwd=folder, env=dict(runner.env, TXMQ_SECRET_KEY=reader.secret_key)
        )
        log.append(f"peek of {topic} as {reader.access_key}: exit {rc}\n{out}")
        ok = ok and rc == 0 and "peeked" in out
    kill_group(p)
    return {"ok": ok, "detail": "\n".join(log)}


def run_completion(runner: Runner, block: Block, claim: Claim, every: list[Block]) -> Result:
    log, ok = [], True
    for line in logical_lines(block.text):
        m = re.search(r"_TXMQ_COMPLETE=(\w+)_source txmq", line)
        if not m:
            ok = False
            log.append(f"not a completion line: {line}")
            continue
        shell = m.group(1)
        env = dict(runner.env, _TXMQ_COMPLETE=f"{shell}_source")
        rc, out = runner.run(["txmq"], env=env)
        good = rc == 0 and "txmq" in out and len(out) > 100
        if shell == "bash":
            rc, done = runner.run(f"{code_of(line)}; complete -p txmq", shell=True)
            good = good and rc == 0 and "txmq" in done
        log.append(f"{shell}: {'ok' if good else 'FAILED'}\n{out[:300]}")
        ok = ok and good
    return {"ok": ok, "detail": "\n".join(log)}


# --- the two runs -------------------------------------------------------------------------------


def run_of(page: str) -> str:
    """The name of the run (a key of RUNS) that runs ``page``'s blocks."""
    return next((name for name, pages in RUNS.items() if page in pages), "rest")


def run_single(runner: Runner, run: str) -> dict[str, Result]:
    every = blocks()
    results: dict[str, Result] = {}
    runner.start_broker(runner.scratch)
    runner.make_placeholders()
    for block in every:  # pages and blocks in order
        claims = claim_for(block)
        if run_of(block.path) != run or len(claims) != 1 or claims[0].kind not in RUN_KINDS:
            continue
        started = time.monotonic()
        try:
            result = handle(runner, block, claims[0], every)
        except Exception:
            result = {"ok": False, "detail": traceback.format_exc()}
        result["seconds"] = round(time.monotonic() - started, 1)
        results[block.where] = result
    return results


def run_cluster(runner: Runner) -> dict[str, Result]:
    every = blocks()
    (block,) = [b for b in every if claim_for(b) and claim_for(b)[0].kind == "cluster"]
    (sample,) = [b for b in every if claim_for(b) and claim_for(b)[0].shape_of]
    rc, out = runner.run(block.text, shell=True, timeout=150)
    missing = shape_mismatch(sample.text, out)
    ok = rc == 0 and not missing and re.search(r"leader replica \d", out) is not None
    detail = f"exit {rc}\n{out}" + (
        f"\nlines of the sample not in the output: {missing}" if missing else ""
    )
    for log in sorted(runner.scratch.glob("g1-*.log")):
        if not ok:
            detail += f"\n--- {log.name}\n" + log.read_text()[-3000:]
    return {
        block.where: {"ok": ok, "detail": detail},
        sample.where: {
            "ok": ok and not missing,
            "detail": f"the real output has the sample's lines: {not missing}",
        },
    }


def shape_mismatch(sample: str, real: str) -> list[str]:
    """The sample's lines (up to their first digit) that start no line of ``real``."""
    heads = [re.split(r"\d", ln, maxsplit=1)[0][:24] for ln in sample.splitlines() if ln.strip()]
    lines = real.splitlines()
    return [h for h in heads if not any(ln.startswith(h) for ln in lines)]


def main(mode: str, run: str = "") -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # A private /tmp (the docs write /tmp/etcd0 ...); a checkout under /tmp stays reachable,
    # bound back at its own path through a descriptor opened before /tmp is covered.
    keep = os.open(ROOT, os.O_PATH) if Path("/tmp") in ROOT.parents else None
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/tmp"], check=True)
    if keep is not None:
        os.makedirs(ROOT, exist_ok=True)
        subprocess.run(
            ["mount", "--no-canonicalize", "--bind", f"/proc/{os.getpid()}/fd/{keep}", str(ROOT)],
            check=True,
            pass_fds=(keep,),
        )
    scratch = Path(tempfile.mkdtemp(prefix="docs-"))
    runner = Runner(scratch)

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        results = run_single(runner, run) if mode == "single" else run_cluster(runner)
    except BaseException:
        results = {"runner": {"ok": False, "detail": traceback.format_exc()}}
        log = scratch / "broker.log"
        if log.exists():
            results["runner"]["detail"] += "\n--- broker.log\n" + log.read_text()[-3000:]
    finally:
        runner.stop_all()
    print(RESULT_MARK + json.dumps(results), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

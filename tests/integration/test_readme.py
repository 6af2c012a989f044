"""The commands the README tells a new user to type, run as typed (with the broker address in
TXMQ_BROKER, as the CLI documents), so the README cannot drift from the CLI."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BrokerThread
from tests.support.raw import RawClient

ROOT = Path(__file__).resolve().parents[2]
TXMQ = str(Path(sys.executable).parent / "txmq")


def readme_commands() -> list[str]:
    """Every ``txmq`` command line in the README's bash blocks (comments stripped)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("#"):
                continue
            if re.search(r"(^|\s|/)txmq\s", line) and not line.startswith(
                ("spark-submit", "PYTHONPATH")
            ):
                out.append(line)
    return out


def test_the_readme_has_the_commands_this_test_runs() -> None:
    cmds = readme_commands()
    assert any(c.startswith(".venv/bin/txmq send") for c in cmds), cmds
    assert any("txmq txn commit" in c for c in cmds) and any("txmq broker" in c for c in cmds)


def _argv(line: str, ids: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    for placeholder, value in ids.items():
        line = line.replace(placeholder, value)
    words = shlex.split(line)
    env: dict[str, str] = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    assert words[0].endswith("txmq"), line
    return [TXMQ, *words[1:]], env


@pytest.mark.slow
def test_every_readme_command_runs_as_written(broker_thread: object, tmp_path: Path) -> None:
    bt: BrokerThread = broker_thread.test_thread  # type: ignore[attr-defined]
    addr = bt.address
    # Something for the transaction commands to act on: two halves nobody decided.
    raw = bt.call(RawClient.connect(addr))
    try:
        halves = [
            bt.call(raw.send("orders", f"h{i}".encode(), group="readme-tx", transactional=True))
            for i in range(2)
        ]
    finally:
        bt.call(raw.close())
    ids = {
        "<transactionId>": str(RawClient.send_header(halves[0]).transaction_id),
        "<msgId>": str(RawClient.send_header(halves[1]).transaction_id),
    }
    env = {**os.environ, "TXMQ_BROKER": addr}
    ran = 0
    for line in readme_commands():
        argv, extra = _argv(line, ids)
        if argv[1:2] == ["broker"]:
            # Starting brokers is the quick start's job; here each line must parse and resolve
            # its configuration, in a scratch folder so relative paths stay inside it.
            if "--print-config" not in argv:
                argv.append("--print-config")
            cwd = tmp_path
            (tmp_path / "config").mkdir(exist_ok=True)
            (tmp_path / "config" / "broker.toml").write_text(
                (ROOT / "config" / "broker.toml").read_text(encoding="utf-8")
            )
        else:
            cwd = tmp_path
        r = subprocess.run(
            argv, env={**env, **extra}, cwd=cwd, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, f"README command failed: {line}\n{r.stdout}\n{r.stderr}"
        ran += 1
    assert ran >= 10

"""The broker as operators run it: the image's command, SIGTERM, the CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.support.process import BrokerProcess
from tests.support.raw import RawClient
from txmq.cli import main
from txmq.protocol.codes import ResponseCode

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def image_command() -> list[str]:
    with open(os.path.join(ROOT, "Dockerfile")) as fh:
        text = fh.read()
    entry_line = re.search(r"^ENTRYPOINT\s+(\[.*\])", text, re.M)
    cmd_line = re.search(r"^CMD\s+(\[.*\])", text, re.M)
    assert entry_line is not None, "the Dockerfile has no ENTRYPOINT [...] line"
    assert cmd_line is not None, "the Dockerfile has no CMD [...] line"
    entry: list[str] = json.loads(entry_line.group(1))
    cmd: list[str] = json.loads(cmd_line.group(1))
    return entry + cmd


async def test_the_image_command_serves_and_stops_gracefully_on_sigterm(tmp_path):
    argv = image_command()
    assert argv[:2] == ["txmq", "broker"]
    config_in_image = argv[argv.index("--config") + 1]
    local_config = tmp_path / "broker.toml"
    shutil.copy(os.path.join(ROOT, "config", "broker.toml"), local_config)

    class ImageLike(BrokerProcess):
        def command(self) -> list[str]:
            import sys

            args = argv[1:]
            args[args.index("--config") + 1] = str(local_config)
            return [sys.executable, "-m", "txmq", *args]

    # what docker-compose sets, pointed at folders of this test instead of the image's
    os.environ["TXMQ_STORE_PATH_ROOT_DIR"] = str(tmp_path / "data")
    os.environ["TXMQ_LISTEN_PORT"] = "0"
    try:
        bp = ImageLike(str(tmp_path / "data"))
        address = bp.start()
        assert config_in_image == "/etc/txmq/broker.toml"
        c = await RawClient.connect(address)
        assert (await c.send("img", b"hello")).code == ResponseCode.SUCCESS
        await c.close()
        assert bp.terminate() == 0
        events = [line.get("event") for line in bp.log_lines]
        assert "broker_stopping" in events and "broker_stopped" in events
        # and the data is there after a restart
        address = bp.start()
        c = await RawClient.connect(address)
        assert [m.body for m in await c.pull_all("img")] == [b"hello"]
        await c.close()
        bp.terminate()
    finally:
        del os.environ["TXMQ_STORE_PATH_ROOT_DIR"]
        del os.environ["TXMQ_LISTEN_PORT"]


def test_cli_send_consume_topics_status_and_txn(broker_thread):
    addr = broker_thread.address
    r = CliRunner()

    def run(*args: str) -> str:
        res = r.invoke(main, list(args), catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return res.output

    assert "created with 2 queues" in run("topic", "create", "cli-topic", "-q", "2", "-b", addr)
    out = run("send", "cli-topic", "hello", "--tags", "t1", "-P", "k=v", "-n", "3", "-b", addr)
    assert out.count("SEND_OK") == 3
    lines = run("consume", "cli-topic", "-b", addr, "-n", "3", "--timeout", "10").splitlines()
    docs = [json.loads(x) for x in lines if x.startswith("{")]
    assert [d["body"] for d in docs] == ["hello"] * 3
    assert docs[0]["tags"] == "t1" and docs[0]["properties"] == {"k": "v"}
    assert "cli-topic" in run("topic", "list", "-b", addr)
    assert "messages stored: 3" in run("topic", "stats", "cli-topic", "-b", addr)
    status = run("status", "-b", addr)
    assert "is up" in status
    assert json.loads(run("txn", "list", "--json", "-b", addr)) == []
    bad = r.invoke(main, ["txn", "commit", "no-such-tx", "-b", addr])
    assert bad.exit_code != 0 and "no transaction" in bad.output


def test_cli_consume_without_a_group_peeks_and_moves_no_offsets(broker_thread):
    """`txmq consume` without --group reads every queue and commits nothing: a second peek
    sees the same messages, and a real group still gets all of them afterwards."""
    addr = broker_thread.address
    r = CliRunner()

    def bodies(*args: str) -> list[str]:
        res = r.invoke(main, [*args, "-b", addr], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return sorted(json.loads(x)["body"] for x in res.output.splitlines() if x.startswith("{"))

    r.invoke(main, ["topic", "create", "peeked", "-q", "3", "-b", addr], catch_exceptions=False)
    for i in range(6):
        r.invoke(main, ["send", "peeked", f"m{i}", "-b", addr], catch_exceptions=False)
    everything = [f"m{i}" for i in range(6)]
    assert bodies("consume", "peeked", "--timeout", "2") == everything
    assert bodies("consume", "peeked", "-n", "6", "--timeout", "10") == everything
    assert broker_thread.offsets.offsets("txmq-cli-peek", "peeked") == {}, "a peek committed"
    # --from last: only what arrives after the peek started (nothing here)
    assert bodies("consume", "peeked", "--from", "last", "--timeout", "1") == []
    assert bodies("consume", "peeked", "--group", "g1", "-n", "6", "--timeout", "10") == everything


def test_cli_status_fails_clearly_without_a_broker():
    res = CliRunner().invoke(main, ["status", "-b", "127.0.0.1:1"])
    assert res.exit_code == 1 and "cannot connect" in res.output


def test_broker_print_config_shows_precedence(tmp_path, monkeypatch):
    cfg = tmp_path / "b.toml"
    cfg.write_text(
        'listenPort = 2000\nflushDiskType = "SYNC_FLUSH"\n[transaction]\ntransactionCheckMax = 7\n'
    )
    monkeypatch.setenv("TXMQ_LISTEN_PORT", "3000")
    res = CliRunner().invoke(
        main, ["broker", "--config", str(cfg), "--print-config", "--set", "transactionTimeOut=100"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert (
        doc["listenPort"],
        doc["flushDiskType"],
        doc["transactionCheckMax"],
        doc["transactionTimeOut"],
    ) == (3000, "SYNC_FLUSH", 7, 100)
    res = CliRunner().invoke(main, ["broker", "--port", "4000", "--print-config"])
    assert json.loads(res.output)["listenPort"] == 4000
    res = CliRunner().invoke(main, ["broker", "--set", "noSuchKey=1", "--print-config"])
    assert res.exit_code == 1 and "unknown configuration key 'noSuchKey'" in res.output


def test_broker_says_plainly_that_its_port_is_taken(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "txmq", "broker", "--port", str(port)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"Error: port {port} on 127.0.0.1 is already in use (another broker?): "
        "choose a free one with --port or listenPort in the config file"
    ]
    assert not (tmp_path / "data").exists(), "nothing is written before the port is bound"

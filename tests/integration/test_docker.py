"""`docker-compose up broker` for real: the image is built from the Dockerfile (on the locally
made base image, from wheels), the compose service comes up healthy, serves the SDK through the
published port, and keeps its messages on the named volume across a stop and a start.

The Docker setup (packages, dockerd, base image) is tests/support/docker_base.sh, which
`make test` runs first; this test runs it again (a no-op once done).  Where the machine cannot
run Docker (not root, no apt-get) the test is skipped with the reason, and fails under CI.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.support.ports import free_port
from txmq.client import Message, Producer, PullConsumer, PullStatus, SendStatus

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = ROOT / "tests" / "support" / "docker_base.sh"
#: docker_base.sh's exit status when this machine cannot run Docker at all.
CANNOT = 3
#: Each bounded wait, in seconds.  The health check runs every 15 s.  tests/conftest.py stops a
#: test phase after TXMQ_TEST_TIMEOUT seconds; the Docker setup of a fresh machine may take
#: longer, which is why `make test` runs it before pytest starts.
SETUP_TIMEOUT = float(os.environ.get("TXMQ_TEST_TIMEOUT", "180")) - 15
BUILD_TIMEOUT = 150.0
HEALTHY_TIMEOUT = 90.0
STOP_TIMEOUT = 60.0
MESSAGES = 20


def _progress(text: str) -> None:
    print(f"[docker] {text}", file=sys.stderr, flush=True)


def _cannot_run(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"the Docker test cannot run on this CI machine: {reason}", pytrace=False)
    pytest.skip(f"Docker is not available here: {reason}")


def run(
    cmd: list[str],
    timeout: float,
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    quiet: bool = False,
    hint: str = "",
) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    try:
        result = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"`{shlex.join(cmd)}` did not finish within {timeout:.0f}s{hint}: {exc.output!r}"
        )
    if check and result.returncode != 0:
        pytest.fail(
            f"`{shlex.join(cmd)}` exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    if not quiet:
        _progress(f"{shlex.join(cmd)} ({time.monotonic() - started:.1f}s)")
    return result


@pytest.fixture(scope="module")
def docker_ready() -> None:
    """Docker's packages, a running dockerd and the base image (see docker_base.sh)."""
    if shutil.which("sh") is None:
        _cannot_run("no sh")
    hint = " (run `make docker-setup` once, then the test again)"
    result = run(["sh", str(SETUP_SCRIPT)], SETUP_TIMEOUT, check=False, hint=hint)
    if result.returncode == CANNOT:
        _cannot_run(result.stderr.strip())
    assert result.returncode == 0, f"{SETUP_SCRIPT.name} failed:\n{result.stdout}{result.stderr}"


class Compose:
    """docker-compose on the repository's docker-compose.yml, as a project of its own whose
    port 10911 is published on a free loopback port (TXMQ_HOST_PORT)."""

    def __init__(self) -> None:
        self.project = f"txmqtest{os.getpid()}{secrets.token_hex(3)}"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k != "TXMQ_BASE_IMAGE"}
        self.env["TXMQ_HOST_PORT"] = self.address
        self.grpc_address = f"127.0.0.1:{free_port()}"
        self.env["TXMQ_GRPC_HOST_PORT"] = self.grpc_address
        self._container = ""

    def __call__(
        self, *args: str, timeout: float = STOP_TIMEOUT, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["docker-compose", "-p", self.project, "-f", str(ROOT / "docker-compose.yml")]
        return run([*cmd, *args], timeout, env=self.env, check=check)

    def container(self) -> str:
        """The broker's container (the same one across stop and start)."""
        if not self._container:
            self._container = self("ps", "-q", "broker").stdout.strip()
            assert self._container, f"no broker container in project {self.project}"
        return self._container

    def inspect(self, template: str) -> str:
        cmd = ["docker", "inspect", "-f", template, self.container()]
        return run(cmd, 30, quiet=True).stdout.strip()

    def logs(self) -> str:
        return self("logs", "--no-color", "--tail", "60", "broker", check=False).stdout

    def wait_healthy(self, timeout: float = HEALTHY_TIMEOUT) -> float:
        """Seconds until Docker's health check says ``healthy``; fails with the logs when it
        says ``unhealthy``, the container stops, or time runs out."""
        started = time.monotonic()
        deadline = started + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.inspect("{{.State.Status}} {{.State.Health.Status}}")
            if state == "running healthy":
                return time.monotonic() - started
            if state.endswith("unhealthy") or not state.startswith(("created", "running")):
                break
            time.sleep(1.0)
        health = self.inspect("{{json .State.Health}}")
        pytest.fail(
            f"the broker container is not healthy after {time.monotonic() - started:.0f}s "
            f"(state: {state}); health: {health}\n"
            f"docker-compose logs broker:\n{self.logs()}"
        )


@pytest.fixture
def compose(docker_ready: None) -> Iterator[Compose]:
    project = Compose()
    try:
        yield project
    finally:
        # Containers, network and the named volume go, whatever happened.
        project("down", "-v", "--timeout", "30", timeout=STOP_TIMEOUT + 30, check=False)


def drain(consumer: PullConsumer, topic: str) -> list[bytes]:
    """Every message of the topic from the first offset of each queue, committing the group's
    offsets."""
    bodies: list[bytes] = []
    for queue_id in consumer.fetch_queues(topic):
        offset = consumer.min_offset(topic, queue_id)
        end = consumer.max_offset(topic, queue_id)
        for _ in range(MESSAGES + 2):  # each pull advances or ends the queue
            if offset >= end:
                break
            result = consumer.pull(topic, queue_id, offset, max_nums=32)
            assert result.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG), result.status
            bodies += [m.body for m in result.messages]
            offset = result.next_begin_offset
        assert offset == end, f"queue {queue_id} stopped at {offset}, not {end}"
        consumer.commit_offset(topic, queue_id, offset)
    return bodies


def test_compose_broker_serves_and_keeps_messages_across_a_restart(compose: Compose) -> None:
    build_wheels()
    compose("build", "broker", timeout=BUILD_TIMEOUT)
    compose("up", "-d", "broker", timeout=STOP_TIMEOUT)
    _progress(f"healthy after {compose.wait_healthy():.1f}s")
    volume = f"{compose.project}_txmq-data:/var/lib/txmq"
    mounts = compose.inspect("{{range .Mounts}}{{.Name}}:{{.Destination}} {{end}}").split()
    assert volume in mounts, mounts

    topic = f"docker-{secrets.token_hex(4)}"
    sent = [f"message {i}".encode() for i in range(MESSAGES)]
    with Producer("docker-test-producer", broker=compose.address) as producer:
        for body in sent:
            assert producer.send(Message(topic, body)).status == SendStatus.SEND_OK
    with PullConsumer("docker-test-first", broker=compose.address) as consumer:
        assert sorted(drain(consumer, topic)) == sorted(sent)
    assert_grpc_route(compose.grpc_address, topic)

    # A graceful stop (SIGTERM, exit status 0), then the same container and volume again.
    compose("stop", "broker")
    assert compose.inspect("{{.State.Status}} {{.State.ExitCode}}") == "exited 0", compose.logs()
    compose("start", "broker")
    _progress(f"healthy again after {compose.wait_healthy():.1f}s")

    with PullConsumer("docker-test-second", broker=compose.address) as consumer:
        assert sorted(drain(consumer, topic)) == sorted(sent), "messages lost across a restart"
    with PullConsumer("docker-test-first", broker=compose.address) as first:
        for queue_id in first.fetch_queues(topic):  # the first group's offsets were kept too
            assert first.committed_offset(topic, queue_id) == first.max_offset(topic, queue_id)


def assert_grpc_route(address: str, topic: str) -> None:
    """The gRPC front end (on in compose) answers QueryRoute for the topic on its published
    port, naming its 4 queues."""
    import grpc

    from txmq.broker.grpc.v2 import definition_pb2 as pb
    from txmq.broker.grpc.v2 import service_pb2 as spb
    from txmq.broker.grpc.v2 import service_pb2_grpc as sgrpc

    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        route = sgrpc.MessagingServiceStub(channel).QueryRoute(
            spb.QueryRouteRequest(topic=pb.Resource(name=topic)),
            metadata=(("x-mq-client-id", "docker-test"),),
            timeout=30,
        )
    assert route.status.code == pb.OK, route.status
    assert len(route.message_queues) == 4


def build_wheels() -> None:
    """txmq and its dependencies as wheels in build/wheels, which the Dockerfile installs (what
    `make wheels` does)."""
    wheels = ROOT / "build" / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--wheel-dir",
            str(wheels),
            f"{ROOT}[grpc,cluster]",
        ],
        BUILD_TIMEOUT,
    )


CLUSTER = ["etcd1", "etcd2", "etcd3", "g1-0", "g1-1", "g1-2"]


def cluster_status(address: str) -> dict[str, Any] | None:
    from txmq.client.admin import AsyncAdminClient
    from txmq.protocol.errors import TxmqError

    async def ask() -> dict[str, Any]:
        async with AsyncAdminClient(address, 3.0) as admin:
            return await admin.cluster_status()

    try:
        return asyncio.run(ask())
    except (TxmqError, OSError):
        return None


def wait_leader(ports: list[int], compose: Compose, not_port: int | None = None) -> int:
    """The host port of the replica that leads g1 (other than ``not_port``)."""
    deadline = time.monotonic() + HEALTHY_TIMEOUT
    while time.monotonic() < deadline:
        for port in ports:
            if port == not_port:
                continue
            st = cluster_status(f"127.0.0.1:{port}")
            if st and st["self"]["role"] == "leader" and len(st["groups"]["g1"]["inSync"]) >= 2:
                return port
        time.sleep(1.0)
    logs = compose("logs", "--no-color", "--tail", "30", *CLUSTER[3:], check=False).stdout
    pytest.fail(f"no leader of g1 in the compose cluster within {HEALTHY_TIMEOUT:.0f}s\n{logs}")


def test_compose_cluster_profile_fails_over(compose: Compose) -> None:
    """`docker-compose --profile cluster up`: three etcd members and three replicas come up, a
    leader is elected, the SDK sends through the published ports; the leader's container is
    SIGKILLed, another replica takes over and has every acknowledged message."""
    ports = [free_port() for _ in range(3)]
    for i, port in enumerate(ports):
        compose.env[f"TXMQ_G1_{i}_PORT"] = str(port)
    build_wheels()
    compose("build", "broker", timeout=BUILD_TIMEOUT)
    compose("--profile", "cluster", "up", "-d", *CLUSTER, timeout=STOP_TIMEOUT)
    leader = wait_leader(ports, compose)
    seeds = ",".join(f"127.0.0.1:{p}" for p in ports)
    topic = f"cluster-{secrets.token_hex(4)}"
    sent = [f"message {i}".encode() for i in range(2 * MESSAGES)]
    with Producer("docker-cluster", broker=seeds, request_timeout=10.0) as producer:
        for body in sent[:MESSAGES]:
            assert producer.send(Message(topic, body)).status == SendStatus.SEND_OK
        victim = CLUSTER[3 + ports.index(leader)]
        compose("kill", "-s", "SIGKILL", victim)
        new_leader = wait_leader(ports, compose, not_port=leader)
        for body in sent[MESSAGES:]:
            assert producer.send(Message(topic, body)).status == SendStatus.SEND_OK
    with PullConsumer("docker-cluster-check", broker=f"127.0.0.1:{new_leader}") as consumer:
        assert sorted(drain(consumer, topic)) == sorted(sent)

"""`docker-compose up broker` for real: the image is built from the Dockerfile (on the locally
made base image, from wheels), the compose service comes up healthy, serves the SDK through the
published port, and keeps its messages on the named volume across a stop and a start.  Every
documented setup -- plain, the ACL (compose/acl.yml), TLS enforced (compose/tls.yml), mutual TLS
(compose/mtls.yml on top), the cluster profile -- turns healthy by the image's own health check
and serves a client of that setup.

The image is built once for the module, under a tag of its own (TXMQ_IMAGE), and removed after.

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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.support.certs import Certs, issue, make_certs
from tests.support.ports import free_port
from txmq.client import (
    ClientConfig,
    Message,
    NoPermissionError,
    Producer,
    PullConsumer,
    PullStatus,
    SendStatus,
)
from txmq.client.config import tls_context
from txmq.protocol.errors import TxmqError

pytestmark = [pytest.mark.slow, pytest.mark.external]

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
#: The image every test here runs, built once by the ``image`` fixture.
IMAGE = f"txmq:test-{os.getpid()}-{secrets.token_hex(3)}"


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


@pytest.fixture(scope="module")
def image(docker_ready: None) -> Iterator[str]:
    """The broker image, built once from this checkout (wheels, then the compose file's build)
    under a tag of its own; removed when the module's tests are done."""
    build_wheels()
    env = {k: v for k, v in os.environ.items() if k != "TXMQ_BASE_IMAGE"}
    env["TXMQ_IMAGE"] = IMAGE
    compose_file = str(ROOT / "docker-compose.yml")
    run(["docker-compose", "-f", compose_file, "build", "broker"], BUILD_TIMEOUT, env=env)
    try:
        yield IMAGE
    finally:
        run(["docker", "rmi", "-f", IMAGE], STOP_TIMEOUT, check=False)


class Compose:
    """docker-compose on the repository's docker-compose.yml (and override ``files``), as a
    project of its own whose port 10911 is published on a free loopback port
    (TXMQ_HOST_PORT)."""

    def __init__(self, image: str) -> None:
        self.files = [ROOT / "docker-compose.yml"]
        self.project = f"txmqtest{os.getpid()}{secrets.token_hex(3)}"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k != "TXMQ_BASE_IMAGE"}
        self.env["TXMQ_HOST_PORT"] = self.address
        self.grpc_address = f"127.0.0.1:{free_port()}"
        self.env["TXMQ_GRPC_HOST_PORT"] = self.grpc_address
        self.env["TXMQ_IMAGE"] = image
        self._containers: dict[str, str] = {}

    def __call__(
        self, *args: str, timeout: float = STOP_TIMEOUT, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["docker-compose", "-p", self.project]
        for f in self.files:
            cmd += ["-f", str(f)]
        return run([*cmd, *args], timeout, env=self.env, check=check)

    def container(self, service: str = "broker") -> str:
        """A service's container (the same one across stop and start)."""
        if service not in self._containers:
            found = self("ps", "-q", service).stdout.strip()
            assert found, f"no {service} container in project {self.project}"
            self._containers[service] = found
        return self._containers[service]

    def inspect(self, template: str, service: str = "broker") -> str:
        cmd = ["docker", "inspect", "-f", template, self.container(service)]
        return run(cmd, 30, quiet=True).stdout.strip()

    def logs(self, service: str = "broker") -> str:
        return self("logs", "--no-color", "--tail", "60", service, check=False).stdout

    def wait_healthy(self, *services: str, timeout: float = HEALTHY_TIMEOUT) -> float:
        """Seconds until Docker's health check says ``healthy`` for every service (default: the
        broker); fails with the logs when one says ``unhealthy``, stops, or time runs out."""
        started = time.monotonic()
        deadline = started + timeout
        waiting = list(services or ["broker"])
        state = ""
        while waiting and time.monotonic() < deadline:
            state = self.inspect("{{.State.Status}} {{.State.Health.Status}}", waiting[0])
            if state == "running healthy":
                waiting.pop(0)
                continue
            if state.endswith("unhealthy") or not state.startswith(("created", "running")):
                break
            time.sleep(1.0)
        if not waiting:
            return time.monotonic() - started
        service = waiting[0]
        health = self.inspect("{{json .State.Health}}", service)
        pytest.fail(
            f"the {service} container is not healthy after {time.monotonic() - started:.0f}s "
            f"(state: {state}); health: {health}\n"
            f"docker-compose logs {service}:\n{self.logs(service)}"
        )


@pytest.fixture
def compose(image: str) -> Iterator[Compose]:
    project = Compose(image)
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

    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

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
            f"{ROOT}[broker,grpc,cluster]",
        ],
        BUILD_TIMEOUT,
    )


CLUSTER = ["etcd1", "etcd2", "etcd3", "g1-0", "g1-1", "g1-2"]


def cluster_status(address: str) -> dict[str, Any] | None:
    from txmq.client.admin import AsyncAdminClient

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
    compose("--profile", "cluster", "up", "-d", *CLUSTER, timeout=STOP_TIMEOUT)
    # Every service turns healthy: the etcd members, and each replica as leader or in sync.
    _progress(f"cluster healthy after {compose.wait_healthy(*CLUSTER):.1f}s")
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


# -- the ACL and TLS setups (compose/*.yml) ------------------------------------------------------

ACL_FILE = """\
accounts:
  - accessKey: dockerAdmin
    secretKey: docker-admin-secret
    admin: true
"""
ACCOUNT = ClientConfig(access_key="dockerAdmin", secret_key="docker-admin-secret")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the container's user (uid 10001) can read: files mounted into it (an ACL file,
    certificates and keys) must be readable there, as docs/operations.md says."""
    folder = Path(tempfile.mkdtemp(prefix="txmq-docker-"))
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def tls_files(folder: Path) -> Certs:
    """ca.pem, broker.pem and broker.key in ``folder`` as compose/tls.yml mounts them; the
    broker's certificate names 127.0.0.1 and may serve as a client certificate (mutual TLS)."""
    certs = make_certs(folder / "made")
    cert, key = issue(
        certs.folder, "broker-both", (certs.ca, certs.ca_key), server=True, client_too=True
    )
    tls = folder / "tls"
    tls.mkdir(mode=0o755)
    for source, name in ((certs.ca, "ca.pem"), (cert, "broker.pem"), (key, "broker.key")):
        shutil.copyfile(source, tls / name)
        (tls / name).chmod(0o644)
    tls.chmod(0o755)
    return certs


def send_one(address: str, config: ClientConfig, topic: str) -> None:
    with Producer("docker-setup", broker=address, config=config) as producer:
        result = producer.send(Message(topic, b"through the published port"))
        assert result.status == SendStatus.SEND_OK, result


@pytest.mark.parametrize("setup", ["acl", "tls", "mtls"])
def test_compose_setup_turns_healthy_and_serves(
    compose: Compose, shared_dir: Path, setup: str
) -> None:
    """The broker service with each documented override file comes up healthy by the image's
    own health check (no flag: `txmq probe` reads the broker's settings), and serves a client
    of that setup -- and refuses one without the account (ACL) or the certificate (mutual
    TLS)."""
    topic = f"docker-{setup}-{secrets.token_hex(3)}"
    if setup == "acl":
        acl = shared_dir / "plain_acl.yml"
        acl.write_text(ACL_FILE, encoding="utf-8")
        acl.chmod(0o644)
        compose.files.append(ROOT / "compose" / "acl.yml")
        compose.env["TXMQ_ACL_FILE"] = str(acl)
    else:
        certs = tls_files(shared_dir)
        compose.files.append(ROOT / "compose" / "tls.yml")
        if setup == "mtls":
            compose.files.append(ROOT / "compose" / "mtls.yml")
        compose.env["TXMQ_TLS_DIR"] = str(shared_dir / "tls")
    compose("up", "-d", "broker", timeout=STOP_TIMEOUT)
    _progress(f"{setup}: healthy after {compose.wait_healthy():.1f}s")
    health = compose.inspect("{{json .State.Health}}")
    assert "ok: serving" in health, health

    if setup == "acl":
        send_one(compose.address, ACCOUNT, topic)
        with pytest.raises(NoPermissionError, match="carries no AccessKey"):
            send_one(compose.address, ClientConfig(), topic)
        return
    ca = str(shared_dir / "tls" / "ca.pem")
    if setup == "tls":
        send_one(compose.address, ClientConfig(tls=tls_context(ca)), topic)
    else:
        mutual = tls_context(ca, str(certs.client_cert), str(certs.client_key))
        send_one(compose.address, ClientConfig(tls=mutual), topic)
        with pytest.raises((TxmqError, OSError)):  # no client certificate: closed
            send_one(compose.address, ClientConfig(tls=tls_context(ca), request_timeout=5.0), topic)

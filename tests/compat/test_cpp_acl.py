"""Apache rocketmq-client-cpp (PyPI ``rocketmq==0.4.4``) against a broker with the ACL on:
with ``set_session_credentials`` it sends and consumes (its JSON headers, its ``OnsChannel``
field and its signature checked as RocketMQ checks them); without, it is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.compat.stock import StockClient, cpp_client
from tests.conftest import BrokerThread
from tests.support.acl_files import write_acl
from txmq.broker.config import BrokerConfig

pytestmark = pytest.mark.slow

ACL = """
accounts:
  - accessKey: cppProducer
    secretKey: cpp-producer-secret
    topicPerms: [cpp-acl=PUB]
    groupPerms: [cpp-producer=PUB]
  - accessKey: cppConsumer
    secretKey: cpp-consumer-secret
    topicPerms: [cpp-acl=SUB]
    groupPerms: [cpp-consumers=SUB]
"""


@pytest.fixture
def acl_broker(
    make_broker_config: Callable[..., BrokerConfig],
    broker_thread_factory: Callable[..., BrokerThread],
    tmp_path: Path,
) -> BrokerThread:
    path = write_acl(tmp_path, ACL)
    return broker_thread_factory(make_broker_config(acl_enable=True, plain_acl_file=str(path)))


def test_the_cpp_client_sends_and_consumes_with_credentials_and_is_refused_without(
    acl_broker: BrokerThread, tmp_path: Path
) -> None:
    cpp: StockClient = cpp_client(tmp_path / "home")
    addr, topic = acl_broker.address, "cpp-acl"
    producer = ("--access-key", "cppProducer", "--secret-key", "cpp-producer-secret")
    sent = cpp.run("send", addr, topic, "--count", 3, "--prefix", "acl", *producer).check()
    assert [d["status"] for d in sent.docs] == [0, 0, 0]

    consumer = ("--access-key", "cppConsumer", "--secret-key", "cpp-consumer-secret")
    got = cpp.run(
        "push", addr, topic, "cpp-consumers", "--expect", 3, "--timeout", 60, *consumer
    ).check()
    assert sorted(d["body"] for d in got.events("received")) == ["acl-0", "acl-1", "acl-2"]

    # no credentials, or the consumer's account for sending: refused (the client reports the
    # refused route request as "No route info"; the broker counts NO_PERMISSION answers)
    controller = acl_broker.controller
    assert controller is not None

    def refusals() -> float:
        return float(controller.metrics.request_errors.labels("16")._value.get())

    for extra in ((), consumer):
        before = refusals()
        refused = cpp.run("send", addr, topic, "--prefix", "nope", *extra, timeout=60)
        assert refused.returncode != 0, refused.docs
        assert acl_broker.run(refusals) > before

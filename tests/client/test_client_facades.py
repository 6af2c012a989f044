"""The blocking facades build their async client from the arguments they are given: the same
parameters (as ``inspect.signature`` and ``help()`` show them), passed on as they are."""

from __future__ import annotations

import inspect

import pytest

from txmq.client import (
    AsyncProducer,
    AsyncPullConsumer,
    AsyncPushConsumer,
    ConsumeFrom,
    Producer,
    PullConsumer,
    PushConsumer,
)


@pytest.mark.parametrize(
    ("facade", "core"),
    [
        (Producer, AsyncProducer),
        (PushConsumer, AsyncPushConsumer),
        (PullConsumer, AsyncPullConsumer),
    ],
)
def test_a_facade_shows_its_async_clients_parameters(facade: type, core: type) -> None:
    assert inspect.signature(facade) == inspect.signature(core)
    assert "group" in inspect.signature(facade).parameters


def test_arguments_reach_the_async_client_as_given() -> None:
    consumer = PushConsumer(
        "billing",
        "127.0.0.1:1",
        consume_from="first",
        max_reconsume_times=3,
        request_timeout=1.5,
    )
    assert consumer.core.group == "billing"
    assert consumer.core.broker == "127.0.0.1:1"
    assert consumer.core.consume_from is ConsumeFrom.FIRST
    assert consumer.core.max_reconsume_times == 3
    assert consumer.core.config.request_timeout == 1.5

    producer = Producer("orders-producer", broker="127.0.0.1:2", request_timeout=2.5)
    assert (producer.core.group, producer.core.broker) == ("orders-producer", "127.0.0.1:2")
    assert producer.core.config.request_timeout == 2.5


def test_bad_arguments_are_refused_as_by_the_async_client() -> None:
    with pytest.raises(TypeError):
        Producer("g", "127.0.0.1:1", "positional-config")
    with pytest.raises(ValueError, match="max_reconsume_times"):
        PushConsumer("billing", max_reconsume_times=-1)
    with pytest.raises(ValueError, match="non-empty group"):
        PullConsumer("")

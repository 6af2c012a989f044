"""Ports: what the broker's core asks of the layers above it, as typed protocols.

The cluster layer (:mod:`txmq.broker.cluster`) implements them; a single broker has none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from txmq.protocol.aio import Connection
from txmq.protocol.command import RemotingCommand


class CommitPointPort(Protocol):
    """The batch decisions and pipeline positions a broker group records for the cluster."""

    async def batch_decision(
        self, producer_group: str, batch_key: str, commit: list[str]
    ) -> list[str]:
        """The decision of a batch that may span broker groups: the first one recorded."""

    async def offsets_decision(
        self,
        producer_group: str,
        batch_key: str,
        commit: list[str],
        moves: list[tuple[str, str, str, int, int, int]],
    ) -> tuple[list[str], str | None]:
        """A batch's decision that moves this group's consumer offsets ``(consumer group,
        broker group, topic, queue id, expected, next)``: the first one recorded, and why the offsets were
        fenced when that made it a rollback."""

    async def pipeline_decision(
        self,
        producer_group: str,
        batch_key: str,
        commit: list[str],
        position: tuple[str, str, str],
    ) -> tuple[list[str], tuple[str, str, str] | None]:
        """A pipeline batch's decision and the position it recorded (the first ones)."""

    async def recorded_batch(
        self, producer_group: str, batch_key: str
    ) -> tuple[list[str], tuple[str, str, str] | None] | None:
        """A batch's recorded decision (what it commits in every group, its position)."""

    async def pipeline_where(
        self, producer_group: str, pipeline: str, start: str | None, batch_key: str | None = None
    ) -> dict[str, Any]:
        """Where a pipeline is (``end``, ``batchKey``, ``next`` after ``start``, ``position``
        of ``batch_key``)."""


class ClusterPort(Protocol):
    """What a leading broker asks its cluster node."""

    def route(self, topic: str) -> dict[str, Any] | None:
        """The topic's route over every broker group (RocketMQ's TopicRouteData), or None."""

    def broker_addrs(self) -> dict[str, dict[int, str]]:
        """Every broker group: its broker ids (the leader 0, followers 1, 2, ...) and their
        addresses, as routes give them."""

    def topic_names(self, groups: list[str] | None = None) -> set[str]:
        """The topics of ``groups`` (every group when None)."""

    def grpc_route(self, topic: str) -> list[tuple[str, dict[str, Any], str]]:
        """``(group, queue config, leader's gRPC host:port)`` of every group that has
        ``topic`` and a leader serving gRPC."""

    def status(self) -> dict[str, Any]:
        """The cluster as this node sees it (``txmq cluster status``)."""

    @property
    def decisions(self) -> CommitPointPort:
        """The batch decisions and pipeline positions recorded across broker groups."""


class ReplicationPort(Protocol):
    """A leader's replication: told of every append, waited on for durability, and serving
    the followers' requests."""

    def on_append(self, destinations: Iterable[tuple[str, int]]) -> None: ...

    async def wait_replicated(self, end_offset: int) -> None: ...

    def close(self, why: str) -> None: ...

    async def run(self) -> None: ...

    def processors(
        self,
    ) -> dict[int, Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]]]:
        """The request codes the followers send, and their handlers."""
